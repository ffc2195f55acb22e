"""The SQLite driver's change feed: triggers log every changed key, ``PRAGMA data_version``
says when to read the log.

Triggers on the data and side tables append each inserted, updated or deleted key to
``zarrfs_changes(id INTEGER PRIMARY KEY, s, k)`` in the writer's own transaction, whoever writes
(a mount, zarr-python's ``SQLiteStore``, the ``sqlite3`` shell), so a foreign writer's changes are
known key by key; each trigger also trims the entries :data:`KEEP` ids back, :data:`PRUNE` at
a time, keeping the log bounded. A reader asks ``PRAGMA data_version`` of its connection
(microseconds; it moves when another connection committed or checkpointed) and only then reads
the entries after its cursor.
"Something changed" (None): entries trimmed past the cursor, or the version moved with nothing
logged and the triggers gone (``SQLiteStore.clear()`` drops the table and its triggers; a
writable mount puts them back). The driver's own entries are left out: a write transaction notes
the last log id before its first change and at its commit (``BEGIN IMMEDIATE``: nobody else
writes in between).
"""

from __future__ import annotations

import sqlite3
from collections import deque
from typing import Any

from ..base import DATA, SIDE, Space
from .sql import translated

KEEP = 8192  # log entries kept
PRUNE = 256  # entries trimmed at once
BATCH = 20000  # entries read at one look; more than that is "something changed"
CREATE_LOG = "CREATE TABLE IF NOT EXISTS zarrfs_changes(id INTEGER PRIMARY KEY, s INTEGER, k TEXT)"
LAST_ID = "SELECT coalesce(max(id), 0) FROM zarrfs_changes"
_EVENTS = {"i": ("INSERT", "NEW"), "u": ("UPDATE", "NEW"), "d": ("DELETE", "OLD")}
_TABLES = {"zarr": 0, "zarrfs_side": 1}
_SPACES = {0: DATA, 1: SIDE}
TRIGGERS = [f"zarrfs_log_{table}_{e}" for table in _TABLES for e in _EVENTS]


def _trigger(table: str, event: str) -> str:
    # Entries are trimmed :data:`PRUNE` at a time, by the entry whose id is a multiple of it:
    # the log keeps KEEP to KEEP + PRUNE - 1 entries, and a commit dirties the pages of the
    # entries it adds, not also one KEEP entries back (one WAL frame a commit fewer). A
    # database made by an earlier version keeps its triggers, which trim one entry an entry;
    # readers cannot tell the two apart.
    what, row = _EVENTS[event]
    last = "last_insert_rowid()"
    return (
        f"CREATE TRIGGER IF NOT EXISTS zarrfs_log_{table}_{event} AFTER {what} ON {table} BEGIN "
        f"INSERT INTO zarrfs_changes(s, k) VALUES ({_TABLES[table]}, {row}.k); "
        f"DELETE FROM zarrfs_changes WHERE {last} % {PRUNE} = 0 "
        f"AND id > {last} - {KEEP + PRUNE} AND id <= {last} - {KEEP}; END"
    )


def install(conn: sqlite3.Connection, tables: set[str]) -> bool:
    """Create the log and its triggers on ``tables`` (those that exist); whether all are there."""
    conn.execute(CREATE_LOG)
    for table in _TABLES:
        if table in tables:
            for event in _EVENTS:
                conn.execute(_trigger(table, event))
    return installed(conn)


def start(conn: sqlite3.Connection, path: str, tables: set[str], readonly: bool) -> tuple[Own, bool]:
    """What a driver keeps of the log: the id ranges of its own entries (none yet), and whether
    the log and every trigger are there (:func:`install`-ed first unless ``readonly``)."""
    if readonly:
        return Own(), False
    with translated(path):
        return Own(), install(conn, tables)


def installed(conn: sqlite3.Connection) -> bool:
    """Whether the log and every trigger exist."""
    names = {
        name.decode() if isinstance(name, bytes) else name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'zarrfs_log_%'"
        )
    }
    return all(t in names for t in TRIGGERS)


class Own:
    """Id ranges ``(lo, hi]`` of the log entries this driver's commits wrote."""

    def __init__(self) -> None:
        self.ranges: deque[tuple[int, int]] = deque()

    def add(self, lo: int, hi: int) -> None:
        """A commit of this driver logged ids ``lo + 1 .. hi``."""
        if hi > lo:
            self.ranges.append((lo, hi))
            if len(self.ranges) > KEEP:
                self.ranges.popleft()

    def covers(self, n: int) -> bool:
        """Whether entry ``n`` is this driver's; ranges below ``n`` are dropped (the reader
        asks in increasing order)."""
        ranges = self.ranges
        while ranges and ranges[0][1] < n:
            ranges.popleft()
        return bool(ranges) and ranges[0][0] < n <= ranges[0][1]


def changes(
    conn: sqlite3.Connection, since: Any, own: Own, tables: set[str] | None
) -> tuple[Any, list[tuple[Space, str]] | None]:
    """:meth:`Driver.changes` for SQLite (see the module docstring), read on ``conn``, but the
    entries of ``own``; the log is installed on ``tables`` when it is missing (None: read-only).
    The cursor is ``(data_version, last log id read)``."""
    version = conn.execute("PRAGMA data_version").fetchone()[0]
    if since is None:
        try:
            return (version, conn.execute(LAST_ID).fetchone()[0]), []
        except sqlite3.OperationalError:  # no log (a read-only mount of a database without)
            return (version, 0), []
    if version == since[0]:
        return since, []
    last = since[1]
    try:
        rows = conn.execute(
            "SELECT id, s, k FROM zarrfs_changes WHERE id > ? ORDER BY id LIMIT ?", (last, BATCH)
        ).fetchall()
    except sqlite3.OperationalError:
        return (version, last), None
    if not rows:
        if installed(conn):
            return (version, last), []  # a checkpoint, or a commit of this driver's
        if tables is not None:
            install(conn, tables)
        return (version, last), None
    unknown = len(rows) == BATCH
    if rows[0][0] != last + 1:
        unknown = True  # entries after the cursor were trimmed (ids have no other holes)
    records: list[tuple[Space, str]] = []
    for n, space, key in rows:
        if not own.covers(n):
            text = key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key
            records.append((_SPACES[space], text))
    return (version, rows[-1][0]), (None if unknown else records)


"""The SQLite driver's statements (lookups, scans, the one statement of a ``read_many``
batch), its connections (one per thread) and their setup, the largest value a row takes, and
the translation of SQLite errors."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from ..base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    BackendError,
    Fetch,
    Get,
    HasPrefix,
    ReadOnlyError,
    RetryableError,
    Size,
    Space,
    StorageFullError,
    UnavailableError,
    ValueTooLargeError,
    bytes_stop,
)

log = logging.getLogger("zarrfs.backends.sqlite")
TABLES = {DATA: "zarr", SIDE: "zarrfs_side"}
PAGE_SIZE = 32768  # for databases this driver creates
# Exactly zarr-python 2.18's statement, so a database we create is one SQLiteStore expects.
CREATE_DATA = "CREATE TABLE IF NOT EXISTS zarr(k TEXT PRIMARY KEY, v BLOB)"
# The side table has rowids: besides the small records it holds the parts of large files (16 MiB
# values), read by range through SQLite's incremental blob I/O, which opens a row by its rowid. A
# table WITHOUT ROWID can only give a part's range by reading the whole part: a database made so
# during development is read whole and cut (``rowless``), 40 times slower for random reads of a
# large file.
CREATE_SIDE = "CREATE TABLE IF NOT EXISTS zarrfs_side(k TEXT PRIMARY KEY, v BLOB)"
# zarr-sqlite's file format (its SPEC.md, version 1.0; what the Rust zarrs_sqlite reads too): a
# database zarrfs creates declares itself with these records; one whose incompatible_flags name
# a feature is not opened (zarrfs implements none).
CREATE_SPEC = "CREATE TABLE IF NOT EXISTS sqlitestore_metadata(k TEXT PRIMARY KEY, v TEXT)"
SPEC_RECORDS = (("sqlitestore_version", "1.0"), ("compatible_flags", ""), ("incompatible_flags", ""))

_BUSY, _LOCKED, _READONLY, _FULL, _CANTOPEN, _TOOBIG = 5, 6, 8, 13, 14, 18
K = "CAST(? AS TEXT)"  # a key or bound, bound as its UTF-8 bytes: compared and stored as TEXT
# A value stored as TEXT by some other writer counts its bytes; NULL counts as empty. A BLOB's
# length and any value's type come from its record's header: no value page is read.
SIZE = "CASE WHEN typeof(v) = 'text' THEN length(CAST(v AS BLOB)) ELSE coalesce(length(v), 0) END"
GET = {sp: f"SELECT v FROM {t} WHERE k = {K}" for sp, t in TABLES.items()}
SIZE_OF = {sp: f"SELECT {SIZE} FROM {t} WHERE k = {K}" for sp, t in TABLES.items()}
LOCATE = {sp: f"SELECT rowid, typeof(v), length(v) FROM {t} WHERE k = {K}" for sp, t in TABLES.items()}
# An upsert: the row keeps its rowid.
PUT = {
    sp: f"INSERT INTO {t}(k, v) VALUES ({K}, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v"
    for sp, t in TABLES.items()
}
DELETE = {sp: f"DELETE FROM {t} WHERE k = {K}" for sp, t in TABLES.items()}


def scan_statements(table: str, fetch: Fetch, bounded: bool) -> tuple[str, str]:
    """The first statement of a scan, and the one resuming after the last key it read (whose
    raw bytes, cast to TEXT, are exact even if not UTF-8)."""
    column = "NULL" if fetch is KEYS else SIZE if fetch is SIZES else "v"
    upper = f" AND k < {K}" if bounded else ""
    return (
        f"SELECT k, {column} FROM {table} WHERE k >= {K}{upper} ORDER BY k LIMIT ?",
        f"SELECT k, {column} FROM {table} WHERE k > {K}{upper} ORDER BY k LIMIT ?",
    )


def translate(exc: sqlite3.Error, what: str) -> BackendError:
    """Map an ``sqlite3`` exception to the driver interface's classes."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if code is not None else None
    msg = str(exc)
    low = msg.lower()
    if primary in (_BUSY, _LOCKED) or "database is locked" in low or "busy" in low:
        return RetryableError(f"{what}: {msg}")
    if primary == _FULL or "disk is full" in low:
        return StorageFullError(f"{what}: {msg}")
    if primary == _TOOBIG or "too big" in low:
        return ValueTooLargeError(f"{what}: value larger than SQLite's SQLITE_MAX_LENGTH: {msg}")
    if primary == _READONLY or "readonly" in low:
        return ReadOnlyError(f"{what}: {msg}")
    if primary == _CANTOPEN or "unable to open" in low:
        return UnavailableError(f"{what}: {msg}")
    return BackendError(f"{what}: {msg}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn ``sqlite3`` exceptions into the driver interface's classes."""
    try:
        yield
    except sqlite3.Error as exc:
        raise translate(exc, what) from exc


def blob(value: Any) -> bytes:
    """A stored value as bytes: one stored as TEXT by some other writer comes back as str;
    NULL counts as empty."""
    if value is None:
        return b""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


_warned: set[str] = set()


def _warn_unlocked(path: str) -> None:
    """Say once per database that it is read without SQLite's locks."""
    if path not in _warned:
        _warned.add(path)
        log.warning("%s: this user may not write in its folder: read without SQLite's locks (immutable); "
                    "a writer at the same time may change what a long read sees", path)


def connect(path: str, readonly: bool, timeout: float, synchronous: str, autocheckpoint: int):
    """A connection as the driver uses them: autocommit (the driver issues ``BEGIN``), keys
    and TEXT values read as bytes, a busy timeout."""
    with translated(path):
        if readonly:
            # On read-only media nobody writes, and the WAL's shared memory cannot be made:
            # immutable=1 reads the file as it is, without locks. So too for a user who may
            # read the database but not write in its folder, where no -shm file is left.
            folder = os.path.dirname(path) or "."
            frozen = ""
            if os.statvfs(folder).f_flag & os.ST_RDONLY:
                frozen = "&immutable=1"
            elif not os.access(folder, os.W_OK, effective_ids=True) and not os.path.exists(path + "-shm"):
                frozen = "&immutable=1"
                _warn_unlocked(path)
            conn = sqlite3.connect(
                f"file:{quote(path)}?mode=ro{frozen}",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=timeout,
            )
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
        conn.text_factory = bytes
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        # A write statement inside BEGIN keeps a statement journal of the pages it changes;
        # past 64 KiB (two of our pages) SQLite spills it to a new file in /var/tmp, opened,
        # written and unlinked at each commit of a small file. Kept in memory instead.
        conn.execute("PRAGMA temp_store = MEMORY")
        if not readonly:
            conn.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
    return conn


class Connections:
    """A driver's connections: one per thread, made by :func:`connect` at its first use and
    kept, all closed by :meth:`close` (a thread asking afterwards gets UnavailableError)."""

    def __init__(
        self, url: str, path: str, readonly: bool, timeout: float, synchronous: str, autocheckpoint: int
    ) -> None:
        self.url = url
        self.args = (path, readonly, timeout, synchronous, autocheckpoint)
        self.closed = False
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        """The calling thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self.closed:
            raise UnavailableError(f"{self.url} is closed")
        conn = connect(*self.args)
        with self._lock:
            self._all.append(conn)
        self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every thread's connection."""
        self.closed = True
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()


def max_value(conn: sqlite3.Connection) -> int:
    """The largest value a row takes: a row (key and value) may not exceed the connection's
    length limit (SQLITE_MAX_LENGTH, 10**9 by default, at most 2**31 - 1); keys are short,
    4 KiB leaves room for them."""
    length = getattr(sqlite3, "SQLITE_LIMIT_LENGTH", None)
    limit = conn.getlimit(length) if length is not None else 10**9
    return limit - 4096


#: Reads in one batch statement: a result row holds at most SQLITE_MAX_COLUMN (2,000) columns,
#: and a statement 999 parameters in older builds (a read binds at most two).
BATCH_READS = 400


class BatchStatements:
    """The statements answering :meth:`~zarrfs.backends.base.Txn.read_many` batches: every read
    a scalar subquery of one ``SELECT``, built once per shape of batch."""

    LIMIT = 256  # shapes kept

    def __init__(self, tables: set[str]) -> None:
        self.tables = tables
        self.cache: dict[tuple[Any, ...], tuple[str, list[int], bool]] = {}

    def get(self, shape: tuple[Any, ...]) -> tuple[str, list[int], bool]:
        """For a shape (``(kind, space, unbounded)`` per read): the statement, which of the
        batch's parameters (a key each, two for a bounded prefix) it binds, and whether it
        reads data values (which can be large)."""
        found = self.cache.get(shape)
        if found is not None:
            return found
        parts: list[str] = []
        keep: list[int] = []
        i = 0
        for kind, space, unbounded in shape:
            table = TABLES[space] if TABLES[space] in self.tables else None
            if kind is HasPrefix:
                if table is None:
                    parts.append("NULL")
                elif unbounded:
                    parts.append(f"(SELECT 1 FROM {table} WHERE k >= {K} LIMIT 1)")
                    keep.append(i)
                else:
                    parts.append(f"(SELECT 1 FROM {table} WHERE k >= {K} AND k < {K} LIMIT 1)")
                    keep += [i, i + 1]
                i += 1 if unbounded else 2
            else:
                if table is None:
                    parts.append("NULL")
                else:
                    column = SIZE if kind is Size else "v"
                    parts.append(f"(SELECT {column} FROM {table} WHERE k = {K})")
                    keep.append(i)
                i += 1
        big = any(kind is Get and space is DATA for kind, space, _ in shape)
        found = ("SELECT " + ", ".join(parts), keep, big)
        if len(self.cache) < self.LIMIT:
            self.cache[shape] = found
        return found

    def bind(self, plan: list[tuple[type, bytes, Space]]) -> tuple[str, list[bytes], bool]:
        """For a ``read_many`` plan (``(kind, raw key, space)`` per read): the statement, its
        parameters, and whether it reads data values (which can be large)."""
        params: list[bytes] = []
        shape: list[tuple[type, Space, bool]] = []
        for kind, raw, space in plan:
            params.append(raw)
            stop = None
            if kind is HasPrefix:
                stop = bytes_stop(raw)
                if stop is not None:
                    params.append(stop)
            shape.append((kind, space, kind is HasPrefix and stop is None))
        sql, keep, big = self.get(tuple(shape))
        if len(keep) != len(params):
            params = [params[i] for i in keep]
        return sql, params, big


def answers(plan: list[tuple[type, bytes, Space]], row: tuple[Any, ...]) -> list[Any]:
    """The answers of a ``read_many`` plan, from the row its statement (:meth:`BatchStatements.bind`)
    returned."""
    out: list[Any] = []
    for (kind, _, _), value in zip(plan, row, strict=True):
        if kind is HasPrefix:
            out.append(value is not None)
        elif kind is Get:
            out.append(value if value is None or type(value) is bytes else blob(value))
        else:
            out.append(value)
    return out


def prepare(conn: sqlite3.Connection, path: str, readonly: bool) -> tuple[set[str], bool]:
    """Set a new database up (unless ``readonly``); return the driver's tables it has and
    whether it is in WAL mode."""
    with translated(path):
        if not readonly:
            # Only a database with no pages yet takes a page size (an existing one keeps its
            # own). Chunks are blobs of MiB, stored much faster in large pages than in the
            # default 4 KiB ones (a WAL frame per page); but each commit writes whole pages,
            # so a small file costs more the larger they are. 32 KiB serves both.
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            # WAL is persistent in the file; it lets readers run while a writer commits.
            conn.execute("PRAGMA journal_mode=WAL")
            new = _tables(conn) == set()
            conn.execute(CREATE_DATA)
            conn.execute(CREATE_SIDE)
            if new:  # made here: declared in zarr-sqlite's format
                conn.execute(CREATE_SPEC)
                conn.executemany("INSERT OR IGNORE INTO sqlitestore_metadata VALUES (?, ?)", SPEC_RECORDS)
        tables = _tables(conn)
        if "sqlitestore_metadata" in tables:
            _check_spec_flags(conn, path)
        wal = conn.execute("PRAGMA journal_mode").fetchone()[0] == b"wal"
    return tables & {"zarr", "zarrfs_side"}, wal


def rowless(conn: sqlite3.Connection) -> set[str]:
    """The driver's tables made ``WITHOUT ROWID``, whose values cannot be opened for
    incremental reads."""
    return _tables(conn, "upper(sql) LIKE '%WITHOUT ROWID%'") & set(TABLES.values())


def _tables(conn: sqlite3.Connection, where: str = "1") -> set[str]:
    rows = conn.execute(f"SELECT name FROM sqlite_master WHERE type = 'table' AND {where}").fetchall()
    return {name.decode() if isinstance(name, bytes) else name for (name,) in rows}


def _check_spec_flags(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a zarr-sqlite file whose ``incompatible_flags`` name features zarrfs does not
    implement (the spec: such a file must not be read or written without them)."""
    row = conn.execute("SELECT v FROM sqlitestore_metadata WHERE k = 'incompatible_flags'").fetchone()
    value = row[0] if row else None
    flags = (value.decode() if isinstance(value, bytes) else value or "").strip()
    if flags:
        raise BackendError(
            f"{path}: a zarr-sqlite file with incompatible_flags {flags!r}, features zarrfs does not "
            "implement; open it with the program that wrote it"
        )

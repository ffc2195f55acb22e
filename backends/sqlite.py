"""SQLite driver: ``sqlite:///abs/path/x.db[?timeout=10&sync=0]`` (``sqlite:////abs`` works too).

Data is the table zarr-python 2's ``SQLiteStore`` creates, ``zarr(k TEXT PRIMARY KEY, v BLOB)``;
side data is a second table, ``zarrfs_side``, which ``SQLiteStore`` never reads or drops.

Listings are exact ranges ``k >= ? AND k < ?`` (the primary-key index, binary collation, which
is UTF-8 byte order), never ``LIKE``, which is case-insensitive and treats ``_`` as a wildcard.
Ranges are read in batches that each restart after the last key, so no statement stays open
across a ``yield`` and the caller may write while iterating.

One connection per thread, WAL journal (readers never block the writer), a busy timeout, and
``BEGIN IMMEDIATE`` for write transactions so that two writers queue on the lock at the start
instead of failing with SQLITE_BUSY at their first write; a lock that stays busy past the
timeout becomes :class:`RetryableError`.

Commits run with ``synchronous=NORMAL`` (in WAL mode a crash of the process never loses or
corrupts a committed transaction; a crash of the machine may lose the last ones) and
``Driver.sync()`` (a file's ``fsync``) checkpoints the WAL, which syncs it; ``?sync=1`` makes
every commit durable on its own (``synchronous=FULL``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from ._util import (
    as_buffer,
    check_options,
    decode_key,
    empty_range,
    encode_bound,
    parse_bool,
    parse_file_url,
    statvfs,
)
from .base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    BackendError,
    Driver,
    ReadOnlyError,
    RetryableError,
    StorageFullError,
    Txn,
    UnavailableError,
    encode_key,
    prefix_stop,
)

TABLES = {DATA: "zarr", SIDE: "zarrfs_side"}
# Exactly zarr-python 2.18's statement, so a database we create is one SQLiteStore expects.
CREATE_DATA = "CREATE TABLE IF NOT EXISTS zarr(k TEXT PRIMARY KEY, v BLOB)"
CREATE_SIDE = "CREATE TABLE IF NOT EXISTS zarrfs_side(k TEXT PRIMARY KEY, v BLOB)"

_BUSY, _LOCKED, _READONLY, _FULL, _CANTOPEN, _TOOBIG = 5, 6, 8, 13, 14, 18


def _translate(exc: sqlite3.Error, what: str) -> BackendError:
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
        return StorageFullError(f"{what}: value larger than SQLite's SQLITE_MAX_LENGTH: {msg}")
    if primary == _READONLY or "readonly" in low:
        return ReadOnlyError(f"{what}: {msg}")
    if primary == _CANTOPEN or "unable to open" in low:
        return UnavailableError(f"{what}: {msg}")
    return BackendError(f"{what}: {msg}")


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _translate(exc, what) from exc


def _table(space: str) -> str:
    try:
        return TABLES[space]
    except KeyError:
        raise ValueError(f"unknown key space {space!r}") from None


def _blob(value: Any) -> bytes:
    # A value stored as TEXT by some other writer comes back as str; NULL counts as empty.
    if value is None:
        return b""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


class SQLiteTxn(Txn):
    """One SQLite transaction on the calling thread's connection."""

    #: Rows fetched per statement while scanning, by fetch mode (values can be large).
    batch = {KEYS: 1024, SIZES: 1024}
    value_batch = 16

    def __init__(self, driver: SQLiteDriver, conn: sqlite3.Connection, write: bool) -> None:
        self._driver = driver
        self._conn = conn
        self._write = write

    def _has(self, space: str) -> str | None:
        table = _table(space)
        return table if table in self._driver.tables else None

    def _one(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with _translated(self._driver.path):
            return self._conn.execute(sql, params).fetchone()

    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key`` or ``None``."""
        return self._driver.get_on(self._conn, key, space)

    def size(self, key: str, space: str = DATA) -> int | None:
        """Return ``length(v)`` without reading the value."""
        return self._driver.size_on(self._conn, key, space)

    def read_many(self, requests: Sequence[tuple[str, str, str]]) -> list[Any]:
        """All the reads as scalar subqueries of one statement (one statement costs less than
        the five a lookup would otherwise run)."""
        parts: list[str] = []
        params: list[Any] = []
        for op, key, space in requests:
            encode_key(key)
            table = self._has(space)
            if table is None:
                parts.append("NULL")
            elif op == "size":
                parts.append(
                    f"(SELECT CASE WHEN typeof(v) = 'text' THEN length(CAST(v AS BLOB)) "
                    f"ELSE coalesce(length(v), 0) END FROM {table} WHERE k = ?)"
                )
                params.append(key)
            elif op == "get":
                parts.append(f"(SELECT v FROM {table} WHERE k = ?)")
                params.append(key)
            elif op == "prefix":
                stop = prefix_stop(key)
                if stop is None:
                    parts.append(f"(SELECT 1 FROM {table} WHERE k >= ? LIMIT 1)")
                    params.append(key)
                else:
                    parts.append(f"(SELECT 1 FROM {table} WHERE k >= ? AND k < ? LIMIT 1)")
                    params += [key, stop]
            else:
                raise ValueError(f"unknown read {op!r}")
        row = self._one("SELECT " + ", ".join(parts), tuple(params))
        assert row is not None
        out: list[Any] = []
        for (op, _, _), value in zip(requests, row, strict=True):
            if op == "prefix":
                out.append(value is not None)
            elif op == "get":
                out.append(None if value is None else _blob(value))
            else:
                out.append(value)
        return out

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """Return a byte range through SQLite's incremental blob I/O where possible."""
        encode_key(key)
        table = self._has(space)
        if table is None:
            return None
        row = self._one(f"SELECT rowid, typeof(v), length(v) FROM {table} WHERE k = ?", (key,))
        if row is None:
            return None
        rowid, kind, size = row
        if offset >= (size or 0) or length <= 0:
            return b""
        if kind == b"blob" and hasattr(self._conn, "blobopen"):
            with (
                _translated(self._driver.path),
                self._conn.blobopen(table, "v", rowid, readonly=True) as blob,
            ):
                blob.seek(offset)
                return blob.read(length)
        row = self._one(
            f"SELECT substr(CAST(v AS BLOB), ?, ?) FROM {table} WHERE rowid = ?", (offset + 1, length, rowid)
        )
        return _blob(row[0]) if row else b""

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """Insert or replace ``key`` (an upsert: the row keeps its rowid)."""
        encode_key(key)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        table = _table(space)
        with _translated(self._driver.path):
            self._conn.execute(
                f"INSERT INTO {table}(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                (key, as_buffer(value)),
            )

    def delete(self, key: str, space: str = DATA) -> None:
        """Remove ``key`` if present."""
        encode_key(key)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        with _translated(self._driver.path):
            self._conn.execute(f"DELETE FROM {_table(space)} WHERE k = ?", (key,))

    def scan(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: str = DATA,
        fetch: str = KEYS,
        limit: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``[start, stop)`` in key order, a batch of rows per statement."""
        lo, hi = encode_bound(start), encode_bound(stop)
        table = self._has(space)
        if table is None or empty_range(lo, hi, limit):
            return
        column = {KEYS: "NULL", SIZES: "length(v)"}.get(fetch, "v")
        batch = self.batch.get(fetch, self.value_batch)
        upper = "" if stop is None else " AND k < ?"
        first = f"SELECT k, {column} FROM {table} WHERE k >= ?{upper} ORDER BY k LIMIT ?"
        # The resume bound is the last key's raw bytes cast to TEXT, exact even if not UTF-8.
        more = f"SELECT k, {column} FROM {table} WHERE k > CAST(? AS TEXT){upper} ORDER BY k LIMIT ?"
        sql, bound = first, start
        remaining = limit
        where = self._driver.path
        while True:
            n = batch if remaining is None else min(batch, remaining)
            params = (bound, n) if stop is None else (bound, stop, n)
            with _translated(where):
                rows = self._conn.execute(sql, params).fetchall()
            for raw, x in rows:
                key = decode_key(raw, where)
                if key is None:
                    continue
                if fetch not in (KEYS, SIZES):
                    x = _blob(x)
                elif fetch == SIZES and x is None:
                    x = 0
                yield key, x
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return
            if len(rows) < n:
                return
            sql, bound = more, rows[-1][0]


class SQLiteDriver(Driver):
    """Driver for SQLite databases; see the module docstring."""

    schemes = ("sqlite",)

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        path, options = parse_file_url(url)
        check_options(url, options, {"timeout", "sync"})
        self.path = path
        self.timeout = float(options.get("timeout", "10"))
        self.synchronous = "FULL" if parse_bool("sync", options.get("sync", "0")) else "NORMAL"
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self.tables: set[str] = set()
        conn = self._conn()
        with _translated(path):
            if not readonly:
                # WAL is persistent in the file; it lets readers run while a writer commits.
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(CREATE_DATA)
                conn.execute(CREATE_SIDE)
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('zarr', 'zarrfs_side')"
            ).fetchall()
        self.tables = {name.decode() for (name,) in rows}

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise UnavailableError(f"{self.url} is closed")
        with _translated(self.path):
            if self.readonly:
                conn = sqlite3.connect(
                    f"file:{quote(self.path)}?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=self.timeout,
                )
            else:
                conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=self.timeout
                )
            conn.text_factory = bytes
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        with self._conns_lock:
            self._conns.append(conn)
        self._local.conn = conn
        return conn

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        conn = self._conn()
        with _translated(self.path):
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield SQLiteTxn(self, conn, write)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            with _translated(self.path):
                conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def get_on(self, conn: sqlite3.Connection, key: str, space: str) -> bytes | None:
        """``get`` on a given connection (inside or outside a transaction)."""
        encode_key(key)
        table = _table(space)
        if table not in self.tables:
            return None
        with _translated(self.path):
            row = conn.execute(f"SELECT v FROM {table} WHERE k = ?", (key,)).fetchone()
        return None if row is None else _blob(row[0])

    def size_on(self, conn: sqlite3.Connection, key: str, space: str) -> int | None:
        """``size`` on a given connection: ``length(v)`` reads no value pages of a BLOB."""
        encode_key(key)
        table = _table(space)
        if table not in self.tables:
            return None
        with _translated(self.path):
            row = conn.execute(
                f"SELECT CASE WHEN typeof(v) = 'text' THEN length(CAST(v AS BLOB)) "
                f"ELSE coalesce(length(v), 0) END FROM {table} WHERE k = ?",
                (key,),
            ).fetchone()
        return None if row is None else row[0]

    # A single SELECT is already atomic: skip BEGIN/COMMIT for the one-shot reads.
    def get(self, key: str, space: str = DATA) -> bytes | None:
        """One-shot get (one statement, autocommit)."""
        return self.get_on(self._conn(), key, space)

    def size(self, key: str, space: str = DATA) -> int | None:
        """One-shot size (one statement, autocommit)."""
        return self.size_on(self._conn(), key, space)

    def sync(self) -> None:
        """With ``sync=1`` (``synchronous=FULL``) every commit is already durable; otherwise
        checkpoint the WAL, which syncs it."""
        if self.synchronous != "FULL":
            with _translated(self.path):
                self._conn().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def statfs(self) -> dict[str, int] | None:
        """Space of the filesystem holding the database file."""
        return statvfs(os.path.dirname(self.path))

    def close(self) -> None:
        """Close every thread's connection."""
        self._closed = True
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

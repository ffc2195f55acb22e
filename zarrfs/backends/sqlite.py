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

A read transaction runs its first statement on its own (one statement is atomic) and issues
``BEGIN`` only before a second one, which is when it needs a snapshot; most read transactions
(a lookup is one statement) then cost no ``BEGIN``/``COMMIT``. The first statement is run again
after the ``BEGIN``: if its answer changed, the transaction is retried, so everything a read
transaction returns still comes from one state of the database. Statements that can return
large values begin the transaction first instead of running twice.

Commits run with ``synchronous=NORMAL`` (in WAL mode a crash of the process never loses or
corrupts a committed transaction; a crash of the machine may lose the last ones) and
``Driver.sync()`` (a file's ``fsync``) checkpoints the WAL, which syncs it; ``?sync=1`` makes
every commit durable on its own (``synchronous=FULL``). Checkpoints run in a background thread
(a commit never waits for the WAL to be copied into the database and synced): once commits
pause, or during a burst once it has written enough to be worth one; SQLite's own automatic
checkpoint stays on the writers' connections, at a higher threshold, as the bound on the WAL.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
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

log = logging.getLogger("zarrfs.backends.sqlite")

TABLES = {DATA: "zarr", SIDE: "zarrfs_side"}
PAGE_SIZE = 32768  # for databases this driver creates
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


_SIZE = "CASE WHEN typeof(v) = 'text' THEN length(CAST(v AS BLOB)) ELSE coalesce(length(v), 0) END"


def _decode_rows(rows: list[tuple[Any, ...]], where: str) -> list[tuple[str, Any]]:
    """``(key, x)`` rows with the keys decoded; a key that is not UTF-8 is skipped (logged)."""
    try:
        return [(raw.decode("utf-8"), x) for raw, x in rows]
    except UnicodeDecodeError:
        out = []
        for raw, x in rows:
            key = decode_key(raw, where)
            if key is not None:
                out.append((key, x))
        return out


class SQLiteTxn(Txn):
    """One SQLite transaction on the calling thread's connection; also its own context manager
    (leaving the block commits, or rolls back when the block raised)."""

    #: Rows fetched per statement while scanning, by fetch mode (values can be large).
    batch = {KEYS: 1024, SIZES: 1024}
    value_batch = 16

    def __init__(self, driver: SQLiteDriver, conn: sqlite3.Connection, write: bool) -> None:
        self._driver = driver
        self._conn = conn
        self._write = write
        # A read transaction runs its first statement on its own (autocommit: a statement is
        # atomic) and begins at the second; see _begin_now. Most are a single lookup.
        self._begun = write
        self._first: tuple[str, Sequence[Any], list[Any]] | None = None
        self._written = 0  # bytes this write transaction puts in the WAL, roughly
        if write:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _translate(exc, driver.path) from exc

    def __enter__(self) -> SQLiteTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        conn = self._conn
        if exc_type is not None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return
        if not self._begun:
            return
        try:
            conn.execute("COMMIT")
        except BaseException as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise _translate(err, self._driver.path) from err
            raise
        if self._write:
            self._driver.committed(self._written)

    def _has(self, space: str) -> str | None:
        table = _table(space)
        return table if table in self._driver.tables else None

    def _begin_now(self) -> None:
        """Begin the read transaction (its snapshot) before a statement that is not its first,
        or that may return large values. The first statement, run before on its own, is run
        again: if its answer changed, the transaction has seen two states of the database and
        is retried (RetryableError); otherwise everything it read belongs to this snapshot."""
        conn = self._conn
        try:
            conn.execute("BEGIN")
            self._begun = True
            if self._first is not None:
                sql, params, rows = self._first
                self._first = None
                if conn.execute(sql, params).fetchall() != rows:
                    raise RetryableError(f"{self._driver.path}: changed between two reads of a transaction")
        except sqlite3.Error as exc:
            raise _translate(exc, self._driver.path) from exc

    def _rows(self, sql: str, params: Sequence[Any], lazy: bool = True) -> list[Any]:
        """The rows of one statement. ``lazy=False`` for statements that may return large
        values, which are not worth running twice: the transaction begins before them."""
        if not self._begun:
            if not lazy or self._first is not None:
                self._begin_now()
            else:
                try:
                    rows = self._conn.execute(sql, params).fetchall()
                except sqlite3.Error as exc:
                    raise _translate(exc, self._driver.path) from exc
                self._first = (sql, params, rows)
                return rows
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc, self._driver.path) from exc

    def _one(self, sql: str, params: Sequence[Any], lazy: bool = True) -> tuple[Any, ...] | None:
        rows = self._rows(sql, params, lazy)
        return rows[0] if rows else None

    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key`` or ``None``."""
        encode_key(key)
        table = self._has(space)
        if table is None:
            return None
        # Data values can be large; side values are small records.
        row = self._one(f"SELECT v FROM {table} WHERE k = ?", (key,), lazy=space != DATA)
        return None if row is None else _blob(row[0])

    def size(self, key: str, space: str = DATA) -> int | None:
        """Return ``length(v)`` without reading the value."""
        encode_key(key)
        table = self._has(space)
        if table is None:
            return None
        row = self._one(f"SELECT {_SIZE} FROM {table} WHERE k = ?", (key,))
        return None if row is None else row[0]

    def read_many(self, requests: Sequence[tuple[str, str, str]]) -> list[Any]:
        """All the reads as scalar subqueries of one statement (one statement costs less than
        the five a lookup would otherwise run); the statement text is built once per shape."""
        if not requests:
            return []
        params: list[Any] = []
        shape: list[tuple[str, str, bool]] = []
        for op, key, space in requests:
            encode_key(key)
            if op == "prefix":
                stop = prefix_stop(key)
                params.append(key)
                if stop is not None:
                    params.append(stop)
                shape.append((op, space, stop is None))
            else:
                params.append(key)
                shape.append((op, space, False))
        sql, kinds, keep, big = self._driver.read_many_sql(tuple(shape))
        if len(keep) != len(params):
            params = [params[i] for i in keep]
        row = self._one(sql, params, lazy=not big)
        assert row is not None
        out: list[Any] = []
        for kind, value in zip(kinds, row, strict=True):
            if kind == "prefix":
                out.append(value is not None)
            elif kind == "get":
                out.append(value if value is None or type(value) is bytes else _blob(value))
            else:
                out.append(value)
        return out

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """Return a byte range through SQLite's incremental blob I/O where possible."""
        encode_key(key)
        table = self._has(space)
        if table is None:
            return None
        # The transaction begins first: the blob is opened by the rowid this reads.
        row = self._one(f"SELECT rowid, typeof(v), length(v) FROM {table} WHERE k = ?", (key,), lazy=False)
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
        sql = _PUT.get(space)
        if sql is None:
            raise ValueError(f"unknown key space {space!r}")
        value = as_buffer(value)
        try:
            self._conn.execute(sql, (key, value))
        except sqlite3.Error as exc:
            raise _translate(exc, self._driver.path) from exc
        self._written += len(value) + PAGE_SIZE  # the value, and at least its leaf page

    def delete(self, key: str, space: str = DATA) -> None:
        """Remove ``key`` if present."""
        encode_key(key)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        try:
            self._conn.execute(f"DELETE FROM {_table(space)} WHERE k = ?", (key,))
        except sqlite3.Error as exc:
            raise _translate(exc, self._driver.path) from exc
        self._written += PAGE_SIZE

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
            rows = self._rows(sql, (bound, n) if stop is None else (bound, stop, n), fetch in (KEYS, SIZES))
            out = _decode_rows(rows, where)
            if fetch == SIZES:
                if any(x is None for _, x in out):
                    out = [(k, 0 if x is None else x) for k, x in out]
            elif fetch != KEYS:
                out = [(k, x if type(x) is bytes else _blob(x)) for k, x in out]
            yield from out
            if len(rows) < n:
                return
            if remaining is not None:
                remaining -= len(out)
                if remaining <= 0:
                    return
            sql, bound = more, rows[-1][0]


_PUT = {
    space: f"INSERT INTO {table}(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v"
    for space, table in TABLES.items()
}


class _Checkpointer:
    """Checkpoints the WAL in the background, so that a commit does not pay for copying the
    WAL into the database (and its two fsyncs): a passive checkpoint runs on a connection of
    its own once commits have paused for ``interval`` seconds, or, during a burst, once they
    have written ``burst`` bytes since the last one. A checkpoint costs two fsyncs however
    little it copies, and a page changed by many commits is copied once: a burst of small
    files then checkpoints every few hundred files instead of ten times a second (through a
    mount, the commit of a 4 KiB file cost the daemon 271 us of CPU with a checkpoint 0.1 s
    after any commit, 190 us with none). The writers keep SQLite's own automatic checkpoint,
    at a higher threshold, as the bound on the WAL when this thread falls behind."""

    interval = 0.1
    burst = 32 << 20

    def __init__(self, driver: SQLiteDriver) -> None:
        self.path = driver.path
        self.timeout = driver.timeout
        self.lock = driver.checkpoint_lock
        self.wake = threading.Event()  # a commit since the last checkpoint
        self.full = threading.Event()  # ``burst`` bytes since the last checkpoint
        self.pending = 0
        self.last = 0.0
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="zarrfs-sqlite-checkpoint", daemon=True)
        self.thread.start()

    def committed(self, written: int) -> None:
        """A write transaction put about ``written`` bytes in the WAL (called by the writer)."""
        self.last = time.monotonic()
        self.pending += written
        if not self.wake.is_set():
            self.wake.set()
        if self.pending >= self.burst and not self.full.is_set():
            self.full.set()

    def _due(self) -> bool:
        """Wait until a checkpoint is worth running; False when stopping."""
        self.wake.wait()
        while not self.stopping:
            quiet = self.last + self.interval - time.monotonic()
            if quiet <= 0 or self.full.is_set():
                # Counted from here: a commit racing this reset lands in the next round.
                self.wake.clear()
                self.full.clear()
                self.pending = 0
                return True
            self.full.wait(quiet)
        return False

    def _run(self) -> None:
        conn = None
        try:
            while self._due():
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                    with self.lock:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # the writers' automatic checkpoint still bounds the WAL
                    log.debug("%s: background checkpoint failed: %s", self.path, exc)
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        self.full.set()
        self.thread.join(timeout=10)


class SQLiteDriver(Driver):
    """Driver for SQLite databases; see the module docstring."""

    schemes = ("sqlite",)
    batched = True  # read_many is one statement
    #: SQLite's own automatic checkpoint (pages of WAL), the bound behind the background one.
    autocheckpoint = 8192

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
        self._read_many_sql: dict[tuple[Any, ...], tuple[str, tuple[str, ...], list[int], bool]] = {}
        self._checkpointer: _Checkpointer | None = None
        #: Held while this driver checkpoints (background or sync), so the two never collide.
        self.checkpoint_lock = threading.Lock()
        self.tables: set[str] = set()
        conn = self._conn()
        with _translated(path):
            if not readonly:
                # Only a database with no pages yet takes a page size (an existing one keeps its
                # own). Chunks are blobs of MiB: in-process a 2 MiB value took 10.2 ms to store
                # with the default 4 KiB pages (512 WAL frames), 2.2 ms with 32 KiB, 2.0 ms with
                # 64 KiB; but each commit writes whole pages, and a 4 KiB file took 105, 167
                # and 273-350 us. 32 KiB serves both.
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                # WAL is persistent in the file; it lets readers run while a writer commits.
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(CREATE_DATA)
                conn.execute(CREATE_SIDE)
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('zarr', 'zarrfs_side')"
            ).fetchall()
            wal = conn.execute("PRAGMA journal_mode").fetchone()[0] == b"wal"
        self.tables = {name.decode() for (name,) in rows}
        if not readonly and wal:
            self._checkpointer = _Checkpointer(self)

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
            if not self.readonly:
                conn.execute(f"PRAGMA wal_autocheckpoint = {self.autocheckpoint}")
        with self._conns_lock:
            self._conns.append(conn)
        self._local.conn = conn
        return conn

    def _begin(self, write: bool) -> SQLiteTxn:
        return SQLiteTxn(self, self._conn(), write)

    def committed(self, written: int) -> None:
        """A write transaction committed about ``written`` bytes: tell the checkpointer."""
        checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer.committed(written)

    def read_many_sql(self, shape: tuple[Any, ...]) -> tuple[str, tuple[str, ...], list[int], bool]:
        """The statement answering a batch of reads of this shape (``(op, space, unbounded)``
        each), what each column is, which of the batch's parameters it binds, and whether it
        reads data values (which can be large)."""
        found = self._read_many_sql.get(shape)
        if found is not None:
            return found
        parts: list[str] = []
        keep: list[int] = []
        kinds: list[str] = []
        i = 0
        for op, space, unbounded in shape:
            table = _table(space)
            if table not in self.tables:
                table = None
            if op == "size" or op == "get":
                if table is None:
                    parts.append("NULL")
                else:
                    column = _SIZE if op == "size" else "v"
                    parts.append(f"(SELECT {column} FROM {table} WHERE k = ?)")
                    keep.append(i)
                i += 1
            elif op == "prefix":
                n = 1 if unbounded else 2
                if table is None:
                    parts.append("NULL")
                elif unbounded:
                    parts.append(f"(SELECT 1 FROM {table} WHERE k >= ? LIMIT 1)")
                    keep.append(i)
                else:
                    parts.append(f"(SELECT 1 FROM {table} WHERE k >= ? AND k < ? LIMIT 1)")
                    keep += [i, i + 1]
                i += n
            else:
                raise ValueError(f"unknown read {op!r}")
            kinds.append(op)
        big = any(op == "get" and space == DATA for op, space, _ in shape)
        found = ("SELECT " + ", ".join(parts), tuple(kinds), keep, big)
        if len(self._read_many_sql) < 256:
            self._read_many_sql[shape] = found
        return found

    def get_on(self, conn: sqlite3.Connection, key: str, space: str) -> bytes | None:
        """``get`` on a given connection (inside or outside a transaction)."""
        encode_key(key)
        table = _table(space)
        if table not in self.tables:
            return None
        try:
            row = conn.execute(f"SELECT v FROM {table} WHERE k = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        return None if row is None else _blob(row[0])

    def size_on(self, conn: sqlite3.Connection, key: str, space: str) -> int | None:
        """``size`` on a given connection: ``length(v)`` reads no value pages of a BLOB."""
        encode_key(key)
        table = _table(space)
        if table not in self.tables:
            return None
        try:
            row = conn.execute(f"SELECT {_SIZE} FROM {table} WHERE k = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
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
        if self.synchronous == "FULL":
            return
        conn = self._conn()
        deadline = time.monotonic() + self.timeout
        with self.checkpoint_lock, _translated(self.path):
            # A checkpoint that another connection runs makes this one return busy (PASSIVE
            # never waits), without the sync: try again until it is done.
            while conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise RetryableError(f"{self.path}: the WAL stayed busy, not synced")
                time.sleep(0.002)

    def statfs(self) -> dict[str, int] | None:
        """Space of the filesystem holding the database file."""
        return statvfs(os.path.dirname(self.path))

    def close(self) -> None:
        """Stop the background checkpoint and close every thread's connection."""
        self._closed = True
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.stop()
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

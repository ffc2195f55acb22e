"""SQLite driver: ``sqlite:///abs/path/x.db[?timeout=10&sync=0]`` (``sqlite:////abs`` works too).

Data is zarr-python 2's ``SQLiteStore`` table ``zarr(k TEXT PRIMARY KEY, v BLOB)``; side data is
``zarrfs_side``, which ``SQLiteStore`` never reads or drops. Keys are bound as UTF-8 bytes cast to
TEXT (as ``SQLiteStore`` stores them); listings are ranges ``k >= ? AND k < ?`` on the primary key
(binary collation, UTF-8 byte order; never ``LIKE``), in batches that restart after the last key,
so no statement stays open across a ``yield``. One connection per thread, WAL (readers never block
the writer), a busy timeout, ``BEGIN IMMEDIATE`` for writes (writers queue at the start; busy past
the timeout is :class:`RetryableError`). A read runs its first statement alone and begins only
before a second, running the first again inside and retrying if its answer changed (a lookup costs
no ``BEGIN``); statements of large values begin first. Commits use ``synchronous=NORMAL`` (a
machine crash may lose the last ones); ``Driver.sync()`` checkpoints, ``?sync=1`` makes each
commit ``FULL``. Checkpoints run in a thread of their own when commits pause or a burst wrote
enough (``checkpoint``); SQLite's own, at a higher threshold, bounds the WAL. Statements and
connections: ``sql``; the change feed: ``feed``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

from ..base import (
    DATA,
    KEYS,
    RESERVE_FOR,
    SIZES,
    Driver,
    Fetch,
    RetryableError,
    Space,
    StorageFullError,
    Txn,
    check_space,
    encode_key,
)
from ..filespace import Reserve, statvfs
from ..filewatch import FileWatch
from ..urloptions import check_options, parse_bool, parse_file_url, parse_seconds
from ..writer_wait import begin_sqlite_write
from . import feed
from . import sql as sq
from .about import ABOUT
from .checkpoint import Checkpointer, checkpoint, truncate
from .holder import Holder
from .snapshot import hold as hold_snapshot
from .sql import PAGE_SIZE, TABLES, BatchStatements, Connections, blob, prepare, translate, translated

log = logging.getLogger("zarrfs.backends.sqlite")
__all__ = ["PAGE_SIZE", "SQLiteDriver", "SQLiteTxn"]


class SQLiteTxn(Txn):
    """One SQLite transaction on the calling thread's connection; also its own context manager
    (leaving the block commits, or rolls back when the block raised)."""

    value_limit = "SQLite's SQLITE_LIMIT_LENGTH, less room for the key"
    most_reads = sq.BATCH_READS

    #: Rows fetched per statement while scanning, by fetch mode (values can be large).
    batch = {KEYS: 1024, SIZES: 1024}
    value_batch = 16

    def __init__(self, driver: SQLiteDriver, conn: sqlite3.Connection, write: bool) -> None:
        super().__init__(write, driver.path)
        self.max_value = driver.max_value
        self._driver = driver
        self._conn = conn
        # A read transaction runs its first statement on its own (autocommit: a statement is
        # atomic) and begins at the second; see begin_now. Most are a single lookup.
        self._begun = write
        self._first: tuple[str, Any, list[Any]] | None = None
        self._written = 0  # bytes this write transaction puts in the WAL, roughly
        self._log_from: int | None = None  # the last change-log id before its first change
        if write:
            try:  # a lock another program holds: logged, bounded by -o timeout= (writer_wait)
                busy_ms = int(driver.conns.args[2] * 1000)
                begin_sqlite_write(conn, driver.path, driver.timeout, busy_ms, driver.waiting_for_writer)
            except sqlite3.Error as exc:
                raise translate(exc, driver.path) from exc

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
            logged = None
            if self._log_from is not None:
                logged = (self._log_from, conn.execute(feed.LAST_ID).fetchone()[0])
            behind = self._driver.checkpointer is not None and self._driver.checkpointer.behind
            if behind and self.write and self.put_bytes > RESERVE_FOR:
                raise StorageFullError(f"{self.where}: the disk is full: its last commits are in the WAL")
            conn.execute("COMMIT")
        except BaseException as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise translate(err, self.where) from err
            raise
        if self.write:
            self._driver.committed(self._written)
        if logged is not None:
            self._driver.own.add(*logged)

    def _has(self, space: Space) -> bool:
        return TABLES[space] in self._driver.tables

    def begin_now(self) -> None:
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
                    raise RetryableError(f"{self.where}: changed between two reads of a transaction")
        except sqlite3.Error as exc:
            raise translate(exc, self.where) from exc

    def _rows(self, sql: str, params: Any, lazy: bool = True) -> list[Any]:
        """The rows of one statement. ``lazy=False`` for statements that may return large
        values, which are not worth running twice: the transaction begins before them."""
        if not self._begun:
            if not lazy or self._first is not None:
                self.begin_now()
            else:
                try:
                    rows = self._conn.execute(sql, params).fetchall()
                except sqlite3.Error as exc:
                    raise translate(exc, self.where) from exc
                self._first = (sql, params, rows)
                return rows
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, self.where) from exc

    def _one(self, sql: str, params: Any, lazy: bool = True) -> tuple[Any, ...] | None:
        rows = self._rows(sql, params, lazy)
        return rows[0] if rows else None

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        if not self._has(space):
            return None
        # Data values can be large; side values are small records.
        row = self._one(sq.GET[space], (raw,), lazy=space is not DATA)
        return None if row is None else blob(row[0])

    def _size(self, raw: bytes, space: Space) -> int | None:
        # length(v) reads no value pages of a BLOB.
        if not self._has(space):
            return None
        row = self._one(sq.SIZE_OF[space], (raw,))
        return None if row is None else row[0]

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        # Through SQLite's incremental blob I/O where possible.
        if not self._has(space):
            return None
        table = TABLES[space]
        if table in self._driver.rowless:  # no rowid to open the value by: read whole, cut
            value = self._get(raw, space)
            return None if value is None else value[offset : offset + length]
        # The transaction begins first: the blob is opened by the rowid this reads.
        row = self._one(sq.LOCATE[space], (raw,), lazy=False)
        if row is None:
            return None
        rowid, kind, size = row
        if offset >= (size or 0) or length == 0:
            return b""
        if kind == b"blob" and hasattr(self._conn, "blobopen"):
            with translated(self.where), self._conn.blobopen(table, "v", rowid, readonly=True) as blob:
                blob.seek(offset)
                return blob.read(length)
        row = self._one(
            f"SELECT substr(CAST(v AS BLOB), ?, ?) FROM {table} WHERE rowid = ?", (offset + 1, length, rowid)
        )
        return blob(row[0]) if row else b""

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        # All the reads as scalar subqueries of one statement (one statement costs less than
        # the five a lookup would otherwise run); the statement text is built once per shape.
        sql, params, big = self._driver.batches.bind(plan)
        row = self._one(sql, params, lazy=not big)
        assert row is not None
        return sq.answers(plan, row)

    def _note_log(self) -> None:
        # Where this transaction's change-log entries start, so that its own feed skips them.
        if self._log_from is None and self._driver.logged:
            self._log_from = self._one(feed.LAST_ID, ())[0]

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        self._note_log()
        try:
            self._conn.execute(sq.PUT[space], (raw, value))
        except sqlite3.Error as exc:
            raise translate(exc, self.where) from exc
        self._written += len(value) + PAGE_SIZE  # the value, and at least its leaf page

    def _delete(self, raw: bytes, space: Space) -> None:
        self._note_log()
        try:
            self._conn.execute(sq.DELETE[space], (raw,))
        except sqlite3.Error as exc:
            raise translate(exc, self.where) from exc
        self._written += PAGE_SIZE

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        # A batch of rows per statement, each restarting after the last key: no statement
        # stays open across a yield, so the caller may write while iterating.
        if not self._has(space):
            return
        first, more = sq.scan_statements(TABLES[space], fetch, hi is not None)
        batch = self.batch.get(fetch, self.value_batch)
        sql, bound, wanted = first, lo, limit
        while True:
            n = min(batch, wanted) if wanted is not None and wanted > 0 else batch
            rows = self._rows(sql, (bound, n) if hi is None else (bound, hi, n), fetch is not Fetch.VALUES)
            if fetch is Fetch.VALUES:
                rows = [(k, x if type(x) is bytes else blob(x)) for k, x in rows]
            yield from rows
            if len(rows) < n:
                return
            if wanted is not None:
                wanted -= len(rows)
            sql, bound = more, rows[-1][0]


class SQLiteDriver(Driver):
    """Driver for SQLite databases; see the module docstring."""

    snapshots = True
    snapshot = hold_snapshot  # -o snapshot: the state of now, held
    batched = True  # read_many is one statement
    #: SQLite's own automatic checkpoint (pages of WAL), the bound behind the background one.
    autocheckpoint = 8192

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        self.file_watch: FileWatch | None = None  # made when the daemon asks (feed_fileno)
        path, options = parse_file_url(url)
        check_options(url, options, set(ABOUT.options))
        self.path = path
        self.timeout = parse_seconds("timeout", options.get("timeout", "10"))
        self.synchronous = "FULL" if parse_bool("sync", options.get("sync", "0")) else "NORMAL"
        self.conns = Connections(url, path, readonly, self.timeout, self.synchronous, self.autocheckpoint)
        self._conn = self.conns.get  # the calling thread's connection
        self.checkpointer: Checkpointer | None = None
        #: Held while this driver checkpoints (background or sync), so the two never collide.
        self.checkpoint_lock = threading.Lock()
        self.tables: set[str] = set()
        self.tables, self.wal = prepare(self._conn(), path, readonly)
        self.rowless = sq.rowless(self._conn())  # tables read whole for a range (sql.CREATE_SIDE)
        if "zarrfs_side" in self.rowless:
            log.warning(
                "%s: its zarrfs_side table has no rowids, so a read of part of a large file reads "
                "a whole 16 MiB part; 'zarrfs copy' it to a new database for the faster layout", path,
            )
        self.batches = BatchStatements(self.tables)
        self.max_value = sq.max_value(self._conn())
        # SQLite needs more than LMDB: the commits still in the WAL may need the database file
        # to grow when they are checkpointed, and a delete appends to the WAL until then.
        self.reserve = None if readonly else Reserve(path + ".zarrfs-reserve", 4 << 20)

        # The change log (feed): the id ranges of this driver's entries, and whether
        # the triggers are there.
        self.own, self.logged = feed.start(self._conn(), path, self.tables, readonly)
        if not readonly and self.wal:
            self.checkpointer = Checkpointer(path, self.timeout, self.checkpoint_lock)
        # Values held by a read transaction and read at first use (holder); a reader outside
        # WAL mode would keep every writer out.
        self.holder: Holder | None = None
        if self.wal:
            self.holder = Holder(self, lambda conn: SQLiteTxn(self, conn, False))

    def _begin(self, write: bool) -> SQLiteTxn:
        if write and self.holder is not None:  # a held reader stops checkpoints (holder)
            self.holder.tidy()
        if write and self.reserve is not None:
            self.reserve.again()
            if self.checkpointer is not None and self.checkpointer.behind:
                self.checkpointer.run_now(self._conn())  # room freed meanwhile, maybe
        return SQLiteTxn(self, self._conn(), write)

    def free_reserve(self) -> bool:
        """Make room for removals on a full disk: SQLite records a delete in the WAL, which
        grows until a checkpoint. Free the room kept in reserve (``filespace.Reserve``), then
        copy the WAL into the database and truncate it, which frees the WAL's blocks: the
        copy grows the database by the pages not copied yet (few: the checkpointer keeps them
        under an eighth of the free room), into the reserve's room. Done at once, the next
        removals find the WAL's room free; left to the background checkpoint, its copy would
        take the reserve's room and leave the WAL full (the removal after next failed)."""
        if self.readonly:
            return False
        if self.holder is not None:  # the truncating checkpoint waits for no reader
            self.holder.let_go_all()
        freed = self.reserve is not None and self.reserve.free()
        return truncate(self._conn, self.path, self.checkpoint_lock) or freed

    def committed(self, written: int) -> None:
        """A write transaction committed about ``written`` bytes: tell the checkpointer."""
        checkpointer = self.checkpointer
        if checkpointer is not None and checkpointer.committed(written):
            checkpointer.run_now(self._conn())

    # A one-shot size is one statement, atomic on its own, so it needs no transaction; the
    # mount asks a file's stored size before each read of it, and without the Txn object and
    # the retry loop the call costs measurably less (docs/performance.md).
    def size(self, key: str, space: Space = DATA) -> int | None:
        """One-shot :meth:`Txn.size` (one statement, autocommit; the same checks)."""
        raw, sp = encode_key(key), check_space(space)
        if TABLES[sp] not in self.tables:
            return None
        try:
            row = self._conn().execute(sq.SIZE_OF[sp], (raw,)).fetchone()
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc
        return None if row is None else row[0]

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other writers committed since ``since`` (see ``feed``), asked on the
        calling thread's connection."""
        if self.holder is not None:
            self.holder.tidy()
        if self.file_watch is not None:
            self.file_watch.drain()  # first: a commit after this look wakes the loop again
        with translated(self.path):
            return feed.changes(self._conn(), since, self.own, None if self.readonly else self.tables)

    def feed_fileno(self) -> int | None:
        """Readable when the database file or its WAL was written (``filewatch``)."""
        if self.file_watch is None:
            name = os.path.basename(self.path)
            self.file_watch = FileWatch(os.path.dirname(self.path) or ".", (name, name + "-wal"))
        return self.file_watch.fileno()

    def sync(self) -> None:
        """With ``sync=1`` (``synchronous=FULL``) every commit is already durable; otherwise
        checkpoint the WAL, which syncs it."""
        if self.synchronous != "FULL":
            # A held reader would stop the checkpoint short of the last commits, unsynced.
            if self.holder is not None:
                self.holder.let_go_all()
            checkpoint(self._conn(), self.path, self.checkpoint_lock, self.timeout)

    def statfs(self) -> dict[str, int] | None:
        """Space of the filesystem holding the database file."""
        return statvfs(os.path.dirname(self.path))

    def close(self) -> None:
        """Stop the background checkpoint and close every thread's connection."""
        self.conns.closed = True  # no new connection meanwhile
        if self.file_watch is not None:
            self.file_watch.close()
        checkpointer, self.checkpointer = self.checkpointer, None
        if checkpointer is not None:
            checkpointer.stop()
        if self.holder is not None:
            self.holder.close()
        self.conns.close()

"""The SQLite driver's values held (see ``heldvalues``): an open file's content kept readable as
the version the open found, by a read transaction held on a connection of its own, and read
only when a descriptor first reads it.

An open reads its file's content so that its descriptors read that version whoever replaces
the file (``zarrfs.fs.handles``). Copied out of SQLite, a chunk of a few MiB costs the open
milliseconds (fresh memory, a page at a time); when the kernel holds the file's pages the
descriptors may never read it at all. In WAL mode a read transaction sees the database as it
was when it began, writers going on beside it, so the open's transaction is kept and the value
read through it at the first read (a :class:`~zarrfs.backends.heldvalues.Deferred`). Each held
transaction has a connection of its own (one connection runs one transaction), taken from a
pool. The bounds are LMDB's (``lmdb.holder``): at most :data:`MOST` at once, each for at most
:data:`SECONDS`, checked at each hold and each write transaction; past either, and before a
checkpoint that must pass every reader (``sync``, a full disk), a value is read and its
transaction ended. A held transaction stops a checkpoint at its snapshot, so the bounds also
bound the WAL's growth. Reads, ends and the bookkeeping run under one lock: any thread may
read a value, or let one go.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..base import DATA, BackendError, RetryableError, Txn, encode_key
from ..heldvalues import Deferred, Held, View, copied
from . import sql as sq

T = TypeVar("T")

#: Read transactions held at once, at most.
MOST = 16
#: Seconds a transaction is held, at most.
SECONDS = 1.0
#: Values smaller than this are read at once: a copy costs less than holding a transaction.
SMALLEST = 64 << 10
READ = f"SELECT v FROM {sq.TABLES[DATA]} WHERE rowid = ?"
# Where the value is, and the value itself when it is read at once (small, or not a blob).
LOCATE = (
    f"SELECT rowid, typeof(v), length(v), CASE WHEN typeof(v) != 'blob' OR length(v) < {SMALLEST}"
    f" THEN v END FROM {sq.TABLES[DATA]} WHERE k = {sq.K}"
)


class Holder:
    """The read transactions ``driver`` (an SQLiteDriver in WAL mode) holds for values read
    later; ``txn_on(conn)`` is a read transaction of the driver's on ``conn``."""

    smallest = SMALLEST

    def __init__(self, driver: Any, txn_on: Callable[[sqlite3.Connection], Txn]) -> None:
        self.driver = driver
        self.txn_on = txn_on
        self.lock = threading.Lock()
        self.idle: list[sqlite3.Connection] = []
        self.since: dict[Held, tuple[float, Unread]] = {}  # when, and its value; oldest first
        self.closed = False

    def hold(self, fn: Callable[[Any, View], tuple[T, Any]], begin: bool = False) -> tuple[T, Held | None]:
        """``heldvalues.hold`` for the SQLite driver; ``begin``: the transaction begins before
        ``fn``'s first statement, which it would otherwise run again at the value's."""
        conn = self._take()
        txn = self.txn_on(conn)

        def view(key: str) -> Any:
            row = txn._one(LOCATE, (encode_key(key),), lazy=False)  # begins the transaction
            if row is None:
                return None
            rowid, kind, size, value = row
            if kind != b"blob" or size < SMALLEST:
                return sq.blob(value)
            return Unread(self, conn, rowid, size)

        try:
            if begin:
                txn.begin_now()
            result, value = fn(txn, view)
        except BaseException as exc:
            self._give_back(conn)
            if isinstance(exc, RetryableError):  # the retrying path copes
                return copied(self.driver, fn)
            raise
        if not isinstance(value, Unread):
            self._give_back(conn)
            return result, None if value is None else Held(value)
        held = Held(value, self._end)
        with self.lock:
            self.since[held] = (time.monotonic(), value)
        self.tidy()
        return result, held

    def _take(self) -> sqlite3.Connection:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return sq.connect(*self.driver.conns.args)

    def _give_back(self, conn: sqlite3.Connection) -> None:
        """End ``conn``'s transaction, if one began, and keep it for the next hold."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            conn.close()
            return
        with self.lock:
            if self.closed or len(self.idle) >= MOST:
                conn.close()
            else:
                self.idle.append(conn)

    def _end(self, held: Held) -> None:
        with self.lock:
            _, unread = self.since.pop(held, (None, None))
            if unread is None:  # ended already (by another thread's let-go)
                return
            conn, unread.conn = unread.conn, None  # a late read may not use it: it is reused
        self._give_back(conn)

    def tidy(self) -> None:
        """Read and let go of the values held too long, or beyond :data:`MOST`."""
        if not self.since:
            return
        now = time.monotonic()
        with self.lock:
            due = [
                held
                for n, (held, (since, _)) in enumerate(self.since.items())
                if now - since > SECONDS or len(self.since) - n > MOST
            ]
        for held in due:
            held.let_go()

    def let_go_all(self) -> None:
        """Read and let go of every value held (a checkpoint must pass every reader, or the
        driver closes)."""
        with self.lock:
            held = list(self.since)
        for value in held:
            value.let_go()

    def close(self) -> None:
        """Let go of every value and close the pool's connections."""
        self.let_go_all()
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class Unread(Deferred):
    """A value of at least :data:`SMALLEST` bytes, read through the transaction held on
    ``conn`` at the first call of :meth:`read`."""

    __slots__ = ("holder", "conn", "rowid", "got")

    def __init__(self, holder: Holder, conn: sqlite3.Connection, rowid: int, size: int) -> None:
        super().__init__(size)
        self.holder = holder
        self.conn: sqlite3.Connection | None = conn  # None once its transaction ended
        self.rowid = rowid
        self.got: bytes | None = None

    def read(self) -> bytes:
        with self.holder.lock:
            if self.got is None:
                where = self.holder.driver.path
                if self.conn is None:  # released unread: nobody was to read it
                    raise BackendError(f"{where}: a held value read after its release")
                with sq.translated(where):
                    row = self.conn.execute(READ, (self.rowid,)).fetchone()
                if row is None:  # the transaction sees the row it located: never
                    raise BackendError(f"{where}: a held value is gone from its transaction")
                self.got = bytes(row[0])
            return self.got


__all__ = ["MOST", "SECONDS", "SMALLEST", "Holder", "Unread"]

"""Waiting for a database's write lock that another program holds (a SQLite ``BEGIN
EXCLUSIVE`` in a shell, an LMDB write transaction left open): said in the log within
:data:`NOTICE` seconds, with who holds it where that can be known, and bounded by the driver's
``timeout`` (``-o timeout=``), after which the transaction fails with :class:`StalledError`
(``ETIMEDOUT``) instead of waiting on, or being retried for minutes. Between two looks the
waits call ``between`` (the driver's ``waiting_for_writer``): a mount answers the requests
that need no write meanwhile.

SQLite: ``BEGIN IMMEDIATE`` runs with a busy timeout of :data:`NOTICE` first, then again in
steps until the driver's timeout. LMDB has no timed lock: :class:`LMDBWriterLock` reads the
writer mutex in the environment's lock file (``MDB_txninfo``: the magic, then the writer's
mutex at the second cache line; glibc keeps the owner's thread id in the mutex's first word),
and waits while a live thread of another process owns it. Where the lock file's layout is not
the one known, nothing is waited for here and LMDB's own lock waits as it always did.
"""

from __future__ import annotations

import logging
import mmap
import os
import sqlite3
import struct
import time
from collections.abc import Callable
from typing import Any

from .errors import StalledError

log = logging.getLogger("zarrfs.backends")

#: Seconds a write waits on a held lock before the log says so.
NOTICE = 0.5
_POLL = 0.02
_STEP = 0.05  # seconds of SQLite's own busy wait between two attempts, once the lock is held
_LMDB_LOCK_MAGIC = 0xBEEFC0DE
_WMUTEX_AT = 64  # the writer mutex: the second cache line of MDB_txninfo
_TID_MASK = 0x3FFFFFFF  # a robust futex word: the owner's tid, below the WAITERS/OWNER_DIED bits


def _nothing() -> None:
    """No work between two looks."""


def _holder_text(tid: int | None) -> str:
    if tid is None:
        return "another program"
    try:
        with open(f"/proc/{tid}/status", encoding="utf-8") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return f"another program ({fields['Name'].strip()}, pid {fields['Tgid'].strip()})"
    except (OSError, KeyError):
        return "another program"


def _giving_up(where: str, holder: str, timeout: float) -> StalledError:
    return StalledError(
        f"{where}: {holder} holds the database's write lock; gave up after {timeout:g} s (-o timeout=)"
    )


def begin_sqlite_write(
    conn: sqlite3.Connection, where: str, timeout: float, busy_ms: int, between: Callable[[], None] = _nothing
) -> None:
    """``BEGIN IMMEDIATE`` on ``conn``, waiting for a held write lock as the module docstring
    says; ``busy_ms``: the connection's own busy timeout, set again afterwards; ``between``
    is called between attempts once the lock was found held."""
    started = time.monotonic()
    noticed = False
    step = NOTICE
    try:
        while True:
            conn.execute(f"PRAGMA busy_timeout = {int(step * 1000)}")
            try:
                conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc).lower():
                    raise
            waited = time.monotonic() - started
            if waited >= timeout:
                raise _giving_up(where, "another program", timeout)
            if not noticed:
                noticed = True
                log.warning(
                    "%s: another program holds the database's write lock; waiting up to %g s "
                    "(-o timeout=)", where, timeout,
                )
            between()
            step = min(_STEP, max(0.0, timeout - (time.monotonic() - started)))
        if noticed:
            log.warning("%s: the write lock is free again after %.1f s", where, time.monotonic() - started)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")


class LMDBWriterLock:
    """The writer mutex of an LMDB environment as its lock file shows it; see the module
    docstring."""

    def __init__(self, lock_path: str) -> None:
        self._map: Any = None
        # The descriptor stays open until close(): closing any descriptor of the lock file
        # drops every fcntl lock this process holds on it, LMDB's mark of a live reader among
        # them, and another process would then take this process's readers for dead ones and
        # reuse the pages they read.
        self._fd: int | None = None
        try:
            self._fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(self._fd).st_size >= _WMUTEX_AT + 4:
                self._map = mmap.mmap(self._fd, _WMUTEX_AT + 4, prot=mmap.PROT_READ)
        except OSError:
            self._map = None
        if self._map is not None and struct.unpack_from("<I", self._map, 0)[0] != _LMDB_LOCK_MAGIC:
            self._map.close()
            self._map = None

    def holder(self) -> int | None:
        """The thread id of another process's thread that holds the writer lock, if any."""
        if self._map is None:
            return None
        tid = struct.unpack_from("<I", self._map, _WMUTEX_AT)[0] & _TID_MASK
        if not tid or os.path.exists(f"/proc/self/task/{tid}") or not os.path.exists(f"/proc/{tid}"):
            return None  # free, ours, or its owner died (LMDB recovers the lock)
        return tid

    def wait(self, where: str, timeout: float, between: Callable[[], None] = _nothing) -> None:
        """Return once no other process holds the lock; :class:`StalledError` after ``timeout``;
        ``between`` is called between looks."""
        tid = self.holder()
        if tid is None:
            return
        started = time.monotonic()
        noticed = False
        while tid is not None:
            waited = time.monotonic() - started
            if waited >= timeout:
                raise _giving_up(where, _holder_text(tid), timeout)
            if not noticed and waited >= NOTICE:
                noticed = True
                log.warning(
                    "%s: %s holds the database's write lock; waiting up to %g s (-o timeout=)",
                    where, _holder_text(tid), timeout,
                )
            between()
            time.sleep(_POLL)
            tid = self.holder()
        if noticed:
            log.warning("%s: the write lock is free again after %.1f s", where, time.monotonic() - started)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

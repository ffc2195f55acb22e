"""The SQLite driver's WAL checkpoints: the one ``sync()`` waits for, the background
checkpointer, and the truncating one that frees room on a full disk."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable

from ..base import RetryableError
from .sql import translated

log = logging.getLogger("zarrfs.backends.sqlite")


def checkpoint(conn: sqlite3.Connection, path: str, lock: threading.Lock, timeout: float) -> None:
    """Checkpoint the WAL now (which syncs it), waiting up to ``timeout`` seconds for one that
    another connection runs."""
    deadline = time.monotonic() + timeout
    with lock, translated(path):
        # A checkpoint that another connection runs makes this one return busy (PASSIVE
        # never waits), without the sync: try again until it is done.
        while conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]:
            if time.monotonic() > deadline:
                raise RetryableError(f"{path}: the WAL stayed busy, not synced")
            time.sleep(0.002)


def truncate(conn: Callable[[], sqlite3.Connection], path: str, lock: threading.Lock) -> bool:
    """Copy the WAL into the database and truncate it, on the connection ``conn()`` returns, to
    make room for a removal on a full disk (a delete frees pages inside the database, so the
    copy needs no new room: the WAL's blocks are free then). Whether it was done (not when
    busy, nor on an error)."""
    try:
        with lock, translated(path):
            busy = conn().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    except Exception as exc:
        log.warning("%s: checkpoint on a full disk failed: %s", path, exc)
        return False
    if busy:
        log.warning("%s: checkpoint on a full disk busy", path)
    return not busy


class Checkpointer:
    """Checkpoints the WAL in the background, so that a commit does not pay for copying the
    WAL into the database (and its two fsyncs): a passive checkpoint runs on a connection of
    its own once commits have paused for ``interval`` seconds, or, during a burst, once they
    have written ``burst`` bytes since the last one. A checkpoint costs two fsyncs however
    little it copies, and a page changed by many commits is copied once: a burst of small
    files then checkpoints every few hundred files instead of ten times a second, which costs
    the daemon less CPU per file written through a mount. The writers keep SQLite's own
    automatic checkpoint, at a higher threshold, as the bound on the WAL when this thread falls
    behind.

    On a disk nearly full the WAL must never hold more pages not copied yet than the room kept
    in reserve, or a removal on the full disk finds no room for the checkpoint that frees the
    WAL's blocks (``truncate``): the burst is an eighth of the free room, the writer that
    reaches it there checkpoints at once (this thread could fall behind it), and once the
    disk refuses a copy, only removals commit till a copy succeeds (:attr:`behind`)."""

    interval = 0.1
    burst_max = 32 << 20
    burst_min = 256 << 10

    def __init__(self, path: str, timeout: float, lock: threading.Lock) -> None:
        self.path = path
        self.timeout = timeout
        self.lock = lock  # held while checkpointing, so a sync() never collides with this one
        self.wake = threading.Event()  # a commit since the last checkpoint
        self.full = threading.Event()  # ``burst`` bytes since the last checkpoint
        self.pending = 0
        self.last = 0.0
        self.stopping = False
        self.burst = self.burst_max
        self._size_burst()
        #: The last checkpoint found the disk full: pages committed are not copied out of the
        #: WAL, and only removals may commit (``SQLiteTxn``) till one is.
        self.behind = False
        self.thread = threading.Thread(target=self._run, name="zarrfs-sqlite-checkpoint", daemon=True)
        self.thread.start()

    def committed(self, written: int) -> bool:
        """A write transaction put about ``written`` bytes in the WAL (called by the writer);
        whether the writer must checkpoint now: a burst's worth on a disk nearly full, where a
        writer outrunning this thread would fill the disk with pages not copied yet."""
        self.last = time.monotonic()
        self.pending += written
        if not self.wake.is_set():
            self.wake.set()
        if self.pending >= self.burst:
            if self.burst < self.burst_max:
                self.pending = 0
                return True
            if not self.full.is_set():
                self.full.set()
        return False

    def run_now(self, conn: sqlite3.Connection) -> None:
        """A passive checkpoint on ``conn`` (this thread's, or a writer's when ``committed``
        asked for one, or before a write while :attr:`behind`); :attr:`behind` says whether
        the disk refused its copy."""
        try:
            with self.lock:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.behind = False
        except sqlite3.Error as exc:  # the writers' automatic checkpoint still bounds the WAL
            self.behind = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            log.debug("%s: checkpoint failed: %s", self.path, exc)
        self._size_burst()

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
                except sqlite3.Error as exc:
                    log.debug("%s: no connection for the background checkpoint: %s", self.path, exc)
                    continue
                self.run_now(conn)
        finally:
            if conn is not None:
                conn.close()

    def _size_burst(self) -> None:
        """The burst for the room the disk has now: an eighth of it, within the bounds."""
        try:
            st = os.statvfs(os.path.dirname(self.path) or ".")
        except OSError:
            return
        self.burst = max(self.burst_min, min(self.burst_max, st.f_bavail * st.f_frsize // 8))

    def stop(self) -> None:
        """End the thread and wait for it (no last checkpoint: ``sync()`` is the barrier)."""
        self.stopping = True
        self.wake.set()
        self.full.set()
        self.thread.join(timeout=10)

"""Reading a listing's next keys ahead, in a thread of its own (``Driver.warm``).

A cold listing of a large folder of a database file waits on the disk at each page its scan
reaches, while the request loop's Python, not the disk, is most of its time (docs/performance.md,
"A cold listing's pages read ahead"). A thread that reads the next keys ahead of the scan, in
transactions of its own, takes those page faults while the loop works: py-lmdb and sqlite3 let
go of the GIL while a read may wait on the disk, so the walk does not hold the loop. The
driver gives the step (LMDB: a cursor over keys, whose small values lie in their leaf pages;
SQLite: the rows' sizes, which its listing reads); this class keeps the walk within what the
listing asked for, one step of :data:`STEP` keys at a time, and ends with the driver.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("zarrfs.backends")

#: Keys read in one step (one read transaction).
STEP = 256

#: ``step(start, stop, count)``: read up to ``count`` keys from ``start`` on (before ``stop``,
#: None: to the end) and return the last one read, or None when there was none.
Step = Callable[[bytes, "bytes | None", int], "bytes | None"]


class Warmer:
    """Walks the keys a listing will read next (:meth:`ask`), in a thread started at the first
    ask; only the newest ask is kept (a listing asks again after each window it reads)."""

    def __init__(self, step: Step, where: str) -> None:
        self.step = step
        self.where = where
        #: The key the last walk ended at (b"" before any): a walk goes on from there.
        self.reached = b""
        self._cond = threading.Condition()
        self._wanted: tuple[bytes, bytes | None, int] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def ask(self, start: bytes, stop: bytes | None, count: int) -> None:
        """Have about ``count`` keys from ``start`` on (before ``stop``; None: to the end) read
        into memory soon. When the last walk ended past ``start`` (those keys are in memory
        already), the walk goes on from there for ``count // 2`` keys: a listing that asks after
        each window for two windows' keys keeps the walk one to two windows ahead of its scan."""
        with self._cond:
            if self._closed:
                return
            self._wanted = (start, stop, count)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zarrfs-warm", daemon=True)
                self._thread.start()
            self._cond.notify()

    def settled(self, timeout: float) -> bool:
        """Wait until no walk is asked for or under way; whether that came within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._wanted is None and not self._busy, timeout)

    def close(self) -> None:
        """End the thread: a walk under way stops after its step, which this waits for (the
        driver closes its database next, which no step may still be reading)."""
        with self._cond:
            self._closed = True
            self._wanted = None
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._wanted is not None or self._closed)
                if self._closed:
                    return
                start, stop, count = self._wanted  # type: ignore[misc]
                self._wanted = None
                self._busy = True
            try:
                self._walk(start, stop, count)
            except Exception as exc:  # noqa: BLE001 - a hint only: the listing reads the keys itself
                log.debug("%s: reading keys ahead stopped: %s", self.where, exc)

    def _walk(self, start: bytes, stop: bytes | None, count: int) -> None:
        pos = start
        if start < self.reached and (stop is None or self.reached < stop):
            pos, count = self.reached, count // 2
        while count > 0 and not self._closed and self._wanted is None:
            last = self.step(pos, stop, STEP)
            if last is None or last == pos:
                return  # the end of the range or of the database
            pos = self.reached = last
            if stop is not None and pos >= stop:
                return
            count -= STEP

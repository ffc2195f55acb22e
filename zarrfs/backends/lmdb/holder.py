"""The LMDB driver's values read in place (see ``heldvalues``): read transactions kept open so that
an open file's content is a view of the memory map rather than a copy of it.

LMDB does not reuse a page that an open read transaction may still see: while one is held,
writers (this process or another) grow the file instead. So the holder bounds them: at most
:data:`MOST` at once and each for at most :data:`SECONDS`; past either, or before a map is
resized (which needs no transaction open, ``maps``), a value is copied out and its
transaction ended. Those checks run on the thread that made the holds (the mount's request
thread), at each new hold, at each write transaction and at each look at the change feed,
because only that thread reads the views: a copy made on another thread could race a read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..base import DATA, RetryableError, StorageFullError, encode_key
from ..heldvalues import Held, View, copied
from . import pages

T = TypeVar("T")

#: Read transactions held at once, at most (LMDB's reader table has 126 slots by default).
MOST = 16
#: Seconds a transaction is held, at most.
SECONDS = 1.0
#: Values smaller than this are copied at once: a copy costs less than holding a reader.
SMALLEST = 64 << 10


class _MapHeld(Held):
    """A value held in place in an LMDB map, whose pages count as touched (``pages.touched``:
    they enter the process's resident set) when it is first read, not when it is held: an
    open whose pages the kernel holds never reads it, and counting each such open's whole
    value had the maps released (a read of ``/proc/self/maps`` and an ``madvise`` of each
    map, 0.2-0.4 ms) every eight opens of a 4 MiB chunk."""

    __slots__ = ("_driver",)

    def __init__(self, data: Any, end: Callable[[Held], None], driver: Any) -> None:
        super().__init__(data, end)
        self._driver = driver

    @property
    def data(self) -> Any:
        driver = self._driver
        if driver is not None:
            self._driver = None
            pages.touched(driver, len(self._value))
        return self._value


class Holder:
    """The read transactions ``driver`` holds for values read in place."""

    smallest = SMALLEST

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.since: dict[Held, tuple[float, Any]] = {}  # when, and its transaction; oldest first
        self.thread: int | None = None

    def hold(self, fn: Callable[[Any, View], tuple[T, Any]], begin: bool = False) -> tuple[T, Held | None]:
        """``heldvalues.hold`` for the LMDB driver (whose transactions begin at once)."""
        driver = self.driver
        try:
            txn = driver._begin(False)
        except (RetryableError, StorageFullError):  # the retrying path copes
            return copied(self.driver, fn)

        def view(key: str) -> Any:
            raw = encode_key(key)
            if len(raw) > driver.key_fit:
                return txn.get(key)  # a long key's value lives in the side environment: a copy
            return txn._value(raw, DATA)  # a view of the map (copies come as bytes)

        try:
            result, value = fn(txn, view)
        except BaseException as exc:
            txn.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, (RetryableError, StorageFullError)):
                return copied(self.driver, fn)
            raise
        if not isinstance(value, memoryview) or len(value) < SMALLEST:
            kept = None if value is None else Held(bytes(value))
            txn.__exit__(None, None, None)
            return result, kept
        held = _MapHeld(value, self._end, driver)
        self.thread = threading.get_ident()
        self.since[held] = (time.monotonic(), txn)
        self.tidy()
        return result, held

    def _end(self, held: Held) -> None:
        _, txn = self.since.pop(held)
        txn.__exit__(None, None, None)

    def _mine(self) -> bool:
        return self.thread is None or self.thread == threading.get_ident()

    def tidy(self) -> None:
        """Copy out and let go of the values held too long, or beyond :data:`MOST`."""
        if not self.since or not self._mine():
            return
        now = time.monotonic()
        for held, (since, _) in list(self.since.items()):
            if now - since > SECONDS or len(self.since) > MOST:
                held.let_go()

    def let_go_all(self) -> None:
        """Copy out and let go of every value held (a map is about to be resized, or closed)."""
        if self._mine():
            for held in list(self.since):
                held.let_go()


__all__ = ["MOST", "SECONDS", "SMALLEST", "Holder"]

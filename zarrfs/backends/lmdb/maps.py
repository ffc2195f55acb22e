"""Growing the LMDB driver's maps when a transaction finds one full.

An environment's map is a fixed span of address space: a write that needs more pages fails with
``MDB_MAP_FULL``. The side environment (parts of large files, ``zarrfs.fs.parts``; values of long
keys, ``longkeys``) starts at ``?side_map_size=`` (64 GiB) and doubles on demand up to
``?map_max=`` or the data map's size, the larger; the data map starts at ``?map_size=`` (1 TiB)
and grows up to ``?map_max=`` (by default its own size: a full data map stays ``ENOSPC``, a small
``?map_size=`` a quota). After a growth the transaction runs again; a full disk is ``ENOSPC``.

``mdb_env_set_mapsize`` needs the process to have no transaction open on the environment (it maps
the file elsewhere: a reader's pointers would dangle), so every transaction of the driver passes
:data:`gate`; a growth closes it, waits for the open ones to end, grows the map, then opens it.
When another process grew the map, this one's next transaction fails with ``MDB_MAP_RESIZED``
once the data outgrows the old size; the driver then adopts the new size (``set_mapsize(0)``)
through the same gate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lmdb

from ..base import DATA, Space, StorageFullError
from ..urloptions import parse_size

log = logging.getLogger("zarrfs.backends.lmdb")

#: The side environment's map at first (address space only: the file grows with its pages).
SIDE_MAP_SIZE = 2**36
#: Seconds a growth waits for the process's open transactions to end before it gives up.
DRAIN = 5.0


class MapTooSmall(StorageFullError):
    """A transaction found the map of ``space``'s environment full, or, with ``adopt``, another
    process grew that map past this process's (``MDB_MAP_RESIZED``)."""

    def __init__(self, message: str, space: Space, adopt: bool = False) -> None:
        super().__init__(message)
        self.space = space
        self.adopt = adopt


class Gate:
    """The LMDB transactions open in this process: a map is resized only when there are none.

    A transaction adds a token to :attr:`open` and then looks whether a resize is waiting
    (:attr:`closed`); the resizer sets :attr:`closed` and then waits for :attr:`open` to empty.
    Under the GIL one of the two sees the other, so neither a lock nor a counter is taken on
    the way in: a lookup pays a set insertion."""

    def __init__(self) -> None:
        self.open: set[object] = set()
        self.closed = False
        self.lock = threading.Lock()

    def enter(self, token: object) -> None:
        """Count ``token``'s transaction as open (waiting while a map is being resized)."""
        self.open.add(token)
        if self.closed:
            self.open.discard(token)
            with self.lock:
                self.open.add(token)

    def leave(self, token: object) -> None:
        """``token``'s transaction ended."""
        self.open.discard(token)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A transaction begun and ended in the block."""
        token = object()
        self.enter(token)
        try:
            yield
        finally:
            self.leave(token)

    def resize(self, env: lmdb.Environment, size: int) -> bool:
        """``env.set_mapsize(size)`` once no transaction is open; False when some stayed open
        for :data:`DRAIN` seconds (a transaction of this thread that called the growth, say)."""
        with self.lock:
            self.closed = True
            try:
                deadline = time.monotonic() + DRAIN
                while self.open:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.001)
                env.set_mapsize(size)
                return True
            finally:
                self.closed = False


#: The gate of every LMDB environment of this process.
gate = Gate()


class Maps:
    """The bounds of a driver's two maps (from its URL options) and their growth."""

    def __init__(self, driver: Any, options: dict[str, str]) -> None:
        self.driver = driver
        self.side_size = parse_size("side_map_size", options.get("side_map_size", str(SIDE_MAP_SIZE)))
        self.data_max = parse_size("map_max", options.get("map_max", str(driver.map_size)))
        self.side_max = max(self.data_max, driver.map_size, self.side_size)

    def grow(self, exc: BaseException) -> bool:
        """Make room for the transaction that failed with ``exc``: grow the full map (doubling,
        up to its bound) or adopt another process's growth. Whether the transaction may run
        again."""
        if not isinstance(exc, MapTooSmall):
            return False
        env = self.driver.env if exc.space is DATA else self.driver.side.env(False)
        if env is None:
            return False
        before = env.info()["map_size"]
        if exc.adopt:
            return gate.resize(env, 0) and env.info()["map_size"] > before
        bound = self.data_max if exc.space is DATA else self.side_max
        if before >= bound or not gate.resize(env, min(before * 2, bound)):
            return False
        which = "data" if exc.space is DATA else "side"
        log.info("%s: the %s map grew to %d bytes", self.driver.path, which, env.info()["map_size"])
        return True

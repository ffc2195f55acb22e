"""A snapshot mount (``-o snapshot``): one committed state of a database, held for the life of
the mount, read-only, whatever other mounts and programs write meanwhile.

:class:`SnapshotDriver` wraps the driver of the database: it takes one read transaction when the
mount starts (the driver's ``snapshot(name)``, a :class:`HeldState`) and answers every read of
the mount from it; it follows no change feed, since nothing it serves changes. A driver that
can name states (PostgreSQL's exported snapshots) takes ``name`` to join a state another
transaction holds, and names the state it holds so that another mount can join it.

Holding a state costs the writers (``HeldState.cost`` says what, ``zarrfs status`` shows it):
so it is bounded, ``limit`` seconds at most (``-o snapshot_hold=``); past that the state is let
go and every read fails with :class:`ExpiredError` (``ESTALE``), which the daemon turns into
an unmount with a message in its log. A state lost otherwise (a PostgreSQL connection closed)
fails the same way: a snapshot mount never falls back to newer data.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .base import Driver, ReadOnlyError, Txn
from .errors import BackendError, ExpiredError, UnavailableError

log = logging.getLogger("zarrfs.backends.snapshot")
T = TypeVar("T")


@dataclass
class HeldState:
    """One committed state a driver holds open: the read transaction that sees it, how to
    end it, its name (None: the driver cannot name states) and what holding it costs the
    database's writers. ``errors`` wraps each use of ``txn`` (the driver's translation of its
    client's exceptions)."""

    txn: Txn
    end: Callable[[], None]
    cost: str
    name: str | None = None
    errors: Callable[[], AbstractContextManager[Any]] = field(default=nullcontext)


class SnapshotDriver(Driver):
    """The read-only driver of a snapshot mount; see the module docstring."""

    #: Nothing changes: the idle loop looks at the (empty) feed rarely.
    feed_interval = 3600.0

    @staticmethod
    def check(cls: type[Driver]) -> None:
        """Refuse, before the database is opened, a driver that cannot hold a state."""
        if not cls.snapshots:
            raise BackendError(
                f"{cls.__name__.removesuffix('Driver')} keeps no state a reader can hold: "
                "-o snapshot works on LMDB, SQLite and PostgreSQL (copy the data to one with zarrfs copy)"
            )

    def __init__(self, inner: Driver, name: str | None = None, limit: float | None = None) -> None:
        super().__init__(inner.url, readonly=True)
        self.check(type(inner))
        take = inner.snapshot
        self.inner = inner
        self.remote, self.batched = inner.remote, inner.batched
        self.max_key_size = inner.max_key_size
        self.limit = limit
        self.lock = threading.RLock()
        self.state: HeldState | None = take(name)
        self.taken = time.time()
        self._since = time.monotonic()
        self.ended: str | None = None  # why the state was let go

    def transact(self, fn: Callable[[Txn], T], write: bool = True) -> T:
        """Run ``fn`` on the held state (one at a time); writes are refused."""
        if write:
            raise ReadOnlyError(f"{self.url} is mounted as a snapshot (-o snapshot): read-only")
        with self.lock:
            state = self._current()
            try:
                with state.errors():
                    return fn(state.txn)
            except UnavailableError as exc:  # the connection, and the state with it, is gone
                self._end(f"the snapshot was lost ({exc})")
                raise ExpiredError(f"{self.url}: {self.ended}; mount it again for a new one") from None

    def _current(self) -> HeldState:
        if self.state is not None and self.limit and time.monotonic() - self._since > self.limit:
            self._end(f"the snapshot was held {self.limit:g} s, its limit (-o snapshot_hold=)")
        if self.state is None:
            raise ExpiredError(f"{self.url}: {self.ended or 'the snapshot was let go'}")
        return self.state

    def _begin(self, write: bool) -> Iterator[Txn]:  # transact is overridden: never called
        raise NotImplementedError

    def _end(self, why: str) -> None:
        state, self.state = self.state, None
        self.ended = self.ended or why
        if state is not None:
            try:
                state.end()
            except Exception as exc:  # a state lost with its connection ends with an error
                log.debug("%s: ending the snapshot: %s", self.url, exc)

    def version(self) -> dict[str, Any]:
        """What this mount serves, for ``zarrfs status``."""
        state = self.state
        return {
            "kind": "snapshot",
            "name": None if state is None else state.name,
            "taken": self.taken,
            "age": round(time.time() - self.taken, 1),
            "limit": self.limit,
            "cost": "none (let go: " + (self.ended or "") + ")" if state is None else state.cost,
        }

    def expires_in(self) -> float | None:
        """Seconds until the state is let go (None: never)."""
        return None if not self.limit else max(0.0, self.limit - (time.monotonic() - self._since))

    def changes(self, since: Any) -> tuple[Any, list | None]:
        """Nothing changes in a held state."""
        return 0, []

    def statfs(self) -> dict[str, int] | None:
        """The database's storage, as its driver sees it."""
        return self.inner.statfs()

    def close(self) -> None:
        """Let the state go and close the database."""
        with self.lock:
            self._end("the mount ended")
            self.inner.close()


__all__ = ["HeldState", "SnapshotDriver"]

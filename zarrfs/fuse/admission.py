"""Which requests may run together, and the one lock the filesystem code runs under: readers
together, a writer alone, in the kernel's order, and a door for other files' requests while a
close commits. The reasoning is in docs/architecture.md, "Design notes by module"."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

_allocate_lock = threading.Lock

#: Seconds a writer letting readers through gives them to start (see :meth:`let_through`).
THROUGH_WINDOW = 0.002
#: Seconds a writer waits for the readers running when it starts to answer, before those still
#: waiting on their servers are made to run again after it (a stalled one holds it up no longer).
GRACE = 0.1
#: The kernel's step between two requests' uniques (odd ones are its interrupts).
STEP = 2
#: Seconds a request waits for one before it in the kernel's queue to be seen by a thread.
GAP_WAIT = 0.05
_UNTIL_ASKED = float("inf")  # a reader waits for a release before it to ask for its turn


class Cancelled(Exception):
    """The request was interrupted while it waited for its turn."""


class _Seen:
    """Which requests of the kernel's queue (their uniques) were seen: each one up to
    :attr:`low`, and those in :attr:`above`."""

    __slots__ = ("low", "above")

    def __init__(self) -> None:
        self.low: int | None = None
        self.above: set[int] = set()

    def add(self, order: float) -> bool:
        """Record ``order`` (a fraction or an odd number is no request); whether :attr:`low`
        moved."""
        low = self.low
        if low is not None and order == low + STEP and not self.above:  # the next, in order
            self.low = low + STEP
            return True
        if order != int(order) or int(order) % STEP:
            return False
        unique = int(order)
        if self.low is None:  # the first request (INIT, read alone)
            self.low = unique
            return False
        if unique <= self.low:
            return False
        above = self.above
        above.add(unique)
        moved = False
        while self.low + STEP in above:
            self.low += STEP
            above.discard(self.low)
            moved = True
        return moved

    def all_below(self, order: float) -> bool:
        """Whether every request before ``order`` was seen."""
        return self.low is None or order <= self.low + STEP or order != int(order)

    def missing_until(self, order: float, gap_until: float | None) -> float | None:
        """None when every request before ``order`` was seen, or :data:`GAP_WAIT` seconds
        were waited for the ones missing (``gap_until``: since when), which are then taken as
        gone (the kernel took them back before anyone read them); else the time until which
        to wait for them."""
        if self.all_below(order):
            return None
        now = time.monotonic()
        if gap_until is None:
            return now + GAP_WAIT
        if now < gap_until:
            return gap_until
        assert self.low is not None
        self.low = max(self.low, int(order) - STEP)  # not waited for again
        self.above = {u for u in self.above if u > self.low}
        return None


class Admission:
    """The readers/writer rule and the filesystem lock; docs/architecture.md, "Design notes by module"."""

    def __init__(self) -> None:
        self.turn = threading.Lock()
        #: The threads waiting for a change: each one's lock (released to wake it) and the test
        #: of whether it may go on (None: any change may let it), see :meth:`_wait`.
        self._sleeping: dict[Any, Callable[[], bool] | None] = {}
        self.readers = 0  # readers running
        self.writing = False  # a writer running
        # The queue places (uniques) of the requests waiting for their turn.
        #: Readers waiting for their turn: their order, and the key they take turns on.
        self._readers_waiting: dict[float, Hashable] = {}
        self._writers_waiting: set[float] = set()
        self._busy: set[Hashable] = set()  # the keys of the readers running
        self._through: int | None = None  # a writer lets readers of other nodes in
        # A close's commit waiting on its server lets in the requests about other nodes than
        # these (see open_door); those running through it, counted.
        self._door_nodes: frozenset[int] | None = None
        self._door_owner: int | None = None
        self._door: frozenset[int] | None = None
        self._passed = 0  # requests let in through the door, running
        self._passed_writers = 0  # of which writers (never run again: waited for)
        self.passes = 0  # requests let in through a door, since the mount began
        self.upgrades = 0  # of which writers that then waited to write (upgrade)
        # The writers waiting that a close's door or a group of closes may pass: their node,
        # and whether they are closes or may pass themselves (see enter_writer).
        self._passable: dict[float, tuple[int, bool]] = {}
        self._local = threading.local()  # whether the calling thread runs a request
        self.last_order = 0  # the latest queue place seen (set by fuse.workers)
        self._seen = _Seen()  # the requests that asked for their turn (see _seen_below)
        # The requests read from the device (see arrived), and those of them the kernel sends
        # without waiting for an answer that have not asked for their turn yet: guarded by
        # _read_lock, as threads record them without the filesystem lock.
        self._read_lock = threading.Lock()
        self._read = _Seen()
        self._unregistered: set[int] = set()
        self._read_moved = False  # the read mark moved since a reader waiting for it was told
        self._gap_waiters = 0  # readers waiting for requests before them to be read
        #: Called when a writer starts, holding the lock: readers waiting on a server then
        #: end their waits and run again (``fuse.workers``).
        self.on_writer: Callable[[], None] = lambda: None
        #: Called by a thread about to wait (for its turn, or with the lock let go around a
        #: server's answer): ``fuse.workers`` then lets another thread read the next request.
        self.before_wait: Callable[[], None] = lambda: None

    # -- waiting for a change of the lock's state: a change wakes only the threads it may let
    # -- go on, and one nobody waits for costs nothing (most requests wait for nothing) --------
    def _wait(self, timeout: float | None = None, ready: Callable[[], bool] | None = None) -> None:
        """Wait for a change (called holding :attr:`turn`, which is let go meanwhile).
        ``ready``, asked by the thread making each change (holding the lock), says whether
        this one may now go on: it is woken only then (None: at every change). Woken at every
        change, each waiting thread would mostly find its turn not come and wait again: with
        16 writers queued, 20 wake-ups a file of five requests (docs/performance.md)."""
        self.before_wait()
        waiter = _allocate_lock()
        waiter.acquire()
        self._sleeping[waiter] = ready
        self.turn.release()
        try:
            if timeout is None:
                waiter.acquire()
            elif timeout > 0:
                waiter.acquire(True, timeout)
        finally:
            self.turn.acquire()
            self._sleeping.pop(waiter, None)  # still there: the wait timed out

    def _wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """:meth:`_wait` until ``predicate()`` holds, or ``timeout`` seconds passed."""
        end = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._wait(left, predicate)
        return True

    def _notify(self) -> None:
        """Wake the threads waiting that the change just made may let go on (called holding
        :attr:`turn`)."""
        sleeping = self._sleeping
        if sleeping:
            for waiter in [w for w, ready in sleeping.items() if ready is None or ready()]:
                del sleeping[waiter]
                waiter.release()

    def _notify_all(self) -> None:
        """Wake every thread waiting, whatever it waits for (called holding :attr:`turn`)."""
        sleeping = self._sleeping
        for waiter in list(sleeping):
            del sleeping[waiter]
            waiter.release()

    def runs_alone(self) -> bool:
        """Whether the calling thread runs a request as the writer: the only one running."""
        return getattr(self._local, "alone", False)

    def holds(self) -> bool:
        """Whether the calling thread runs a request (holds :attr:`turn`): other threads (a
        lock's waiter, the status socket) never let go of a lock they do not hold."""
        return getattr(self._local, "held", False)

    # -- requests: entered without the lock, held by the caller until it leaves -----------------
    def enter_reader(
        self, key: Hashable, node: int, order: float = 0, cancelled=lambda: False, held: bool = False
    ) -> None:
        """Wait until a reader about ``key`` (of node ``node``) may run; return holding
        :attr:`turn`. ``order``: the request's place in the kernel's queue (its unique): no
        writer that came before it is overtaken. ``cancelled()`` is asked at each wake-up
        (:class:`Cancelled`). ``held``: the caller holds :attr:`turn` already (it classified
        the request under it; one handoff of the lock fewer)."""
        if not held:
            self.turn.acquire()
        self._readers_waiting[order] = key
        gap_until = None

        def may_go() -> bool:
            through = self._through is not None and node != self._through
            door = self._door is not None and node not in self._door and self.passable_before(order, node)
            before = self._writers_waiting and min(self._writers_waiting) < order
            return bool(through or door or not (self.writing or before)) and self._free(key, order)

        try:
            self._saw(order)
            while True:
                if cancelled():
                    raise Cancelled
                if may_go():
                    gap_until = self._read_below(order, gap_until)
                    if gap_until is None:
                        break
                    self._gap_waiters += 1
                    left = gap_until - time.monotonic()
                    self._wait(None if gap_until == _UNTIL_ASKED else max(0.0, left))
                    self._gap_waiters -= 1
                    continue
                self._wait(None, lambda: cancelled() or may_go())  # made only to wait
        except BaseException:
            self._readers_waiting.pop(order, None)
            self._notify()
            self.turn.release()
            raise
        self._readers_waiting.pop(order, None)
        self.readers += 1
        self._busy.add(key)
        self._local.held = True
        self._local.passed = self.writing  # let in by a writer: it waits for this one to end
        if self.writing:
            self._passed += 1
            self.passes += 1
        if self._writers_waiting:  # a writer after it waited for it to start
            self._notify()

    def _free(self, key: Hashable, order: float) -> bool:
        """Whether a reader about ``key`` at ``order`` may start: no reader of that key runs,
        and none that came before it waits (readers of one thing go in the kernel's order: a
        release read just before an open is served first, or the open would find the closed
        descriptor's version still read, and show the file as that one)."""
        if key in self._busy:
            return False
        return not any(o < order and k == key for o, k in self._readers_waiting.items())

    def leave_reader(self, key: Hashable) -> None:
        """End a reader (called holding :attr:`turn`; returns without it)."""
        self._local.held = False
        if getattr(self._local, "passed", False):
            self._local.passed = False
            self._passed -= 1
        self.readers -= 1
        self._busy.discard(key)
        self._notify()
        self.turn.release()

    def enter_writer(
        self,
        order: float = 0,
        cancelled=lambda: False,
        grace: float | None = GRACE,
        restart: bool = True,
        passing: tuple[Hashable, int] | None = None,
        close: bool = False,
        close_node: int = 0,
        held: bool = False,
    ) -> bool:
        """Wait until nothing else runs and no request that came before it (``order``, as
        :meth:`enter_reader`) waits; return holding :attr:`turn`, alone until
        :meth:`leave_writer`. A close's release, which the kernel sends without waiting for
        it, so stays ahead of the open that follows it.

        ``passing`` ``(key, node)``: a writer that may also run through a close's open door
        (:meth:`open_door`) when its node is not the close's, no reader of ``key`` runs and
        no writer but closes came before it; True is then returned, and it ends with
        :meth:`leave_passing`. ``close``: the writer is a close of node ``close_node``
        (closes of other nodes may pass it, see ``fuse.workers``). ``held``: as
        :meth:`enter_reader`."""
        if not held:
            self.turn.acquire()
        self._writers_waiting.add(order)
        if close or passing is not None:
            self._passable[order] = (passing[1] if passing is not None else close_node, close)
        gap_until = None
        passed = False

        def first() -> bool:
            return not (
                self.writing
                or min(self._writers_waiting) < order
                or (self._readers_waiting and min(self._readers_waiting) < order)
            )

        try:
            self._saw(order)
            while True:
                if cancelled():
                    raise Cancelled
                if first():
                    gap_until = self._seen_below(order, gap_until)
                    if gap_until is None:
                        break
                elif passing is not None and self._may_pass(order, *passing):
                    gap_until = self._seen_below(order, gap_until)
                    if gap_until is None:
                        passed = True
                        break
                if gap_until is None:  # the test made only to wait
                    self._wait(None, lambda: cancelled() or first() or (
                        passing is not None and self._may_pass(order, *passing)))
                else:  # requests before it not seen yet: any change may be theirs
                    self._wait(max(0.0, gap_until - time.monotonic()))
        except BaseException:
            self._writers_waiting.discard(order)
            self._passable.pop(order, None)
            self._notify()
            self.turn.release()
            raise
        self._writers_waiting.discard(order)
        self._passable.pop(order, None)
        if passed:
            assert passing is not None
            self._busy.add(passing[0])
            self._passed += 1
            self._passed_writers += 1
            self.passes += 1
            self._notify()  # those it held back in the queue may pass too
            self._local.held = True
            return True
        self.writing = True
        self._local.held = True
        self._local.alone = True
        if self.readers:  # no new reader starts now; those running get a moment to answer
            self._wait_for(lambda: not self.readers, grace)
            if self.readers and restart:
                self.on_writer()
        return False

    def _may_pass(self, order: float, key: Hashable, node: int) -> bool:
        door = self._door
        if door is None or node in door or key in self._busy:
            return False
        return self.passable_before(order, node)

    def passable_before(self, order: float, node: int) -> bool:
        """Whether a request about ``node`` at ``order`` may go before every writer waiting
        ahead of it: each is a close or a create, write or release (see ``enter_writer``), of
        another node (called holding the lock)."""
        passable = self._passable
        for o in self._writers_waiting:
            if o < order:
                found = passable.get(o)
                if found is None or found[0] == node:
                    return False
        return True

    def leave_passing(self, key: Hashable) -> None:
        """End a writer let in through a close's door (returns without :attr:`turn`)."""
        self._local.held = False
        self._passed -= 1
        self._passed_writers -= 1
        self._busy.discard(key)
        self._notify()
        self.turn.release()

    def upgrade(self, key: Hashable, order: float) -> None:
        """A request let in through a door is about to write to the database: it stops being
        let in (the close waiting for those let in goes on) and waits for its turn as the
        writer, at its own place in the queue (called holding :attr:`turn`; returns holding
        it, as the writer: it ends with :meth:`leave_writer`)."""
        self._passed -= 1
        self._passed_writers -= 1
        self.upgrades += 1
        self._busy.discard(key)
        self._notify()
        self._local.held = False
        self.turn.release()
        self.enter_writer(order)

    @contextmanager
    def open_door(self, nodes: frozenset[int]) -> Iterator[None]:
        """Called by the writer running, a close: while its commit waits on its server, let
        in the readers of other nodes than ``nodes`` and the writers that may pass
        (``enter_writer``'s ``passing``: creates and writes of other files, which write
        nothing to the database). Its commit changes nothing they read before it ends: what
        it changes in the mount's tables it changes after its last wait, once every request
        let in has ended (:meth:`released`)."""
        self._door_nodes, self._door_owner = nodes, threading.get_ident()
        try:
            yield
        finally:
            self._door_nodes = self._door_owner = None

    def arrived(self, unique: int, unanswered: bool) -> None:
        """Record that the request ``unique`` was read from the device (called by the thread
        that read it, before it asks for its turn, without the lock); ``unanswered``: one the
        kernel sends without waiting for its answer (a release), which a reader that came
        after it waits for (see :meth:`_read_below`)."""
        with self._read_lock:
            if unanswered:
                self._unregistered.add(unique)
            if self._read.add(unique):
                self._read_moved = True

    def settled(self, unique: int) -> None:
        """The request ``unique`` ended (whether or not it asked for its turn): no reader
        waits for it any more."""
        if unique in self._unregistered:
            with self._read_lock:
                self._unregistered.discard(unique)
            with self.turn:
                self._notify()

    def _saw(self, order: float) -> None:
        """Record that the request ``order`` asked for its turn (called holding the lock)."""
        if self._seen.add(order):  # requests waiting for this one may now go
            self._notify()
        if self._unregistered or self._read_moved:
            with self._read_lock:
                told = self._read_moved or order in self._unregistered
                self._unregistered.discard(order)  # type: ignore[arg-type]
                self._read_moved = False
            if told and self._gap_waiters:
                self._notify()

    def _seen_below(self, order: float, gap_until: float | None) -> float | None:
        """For a writer: None when every request before ``order`` in the kernel's queue asked
        for its turn (or it waited :data:`GAP_WAIT` for the ones missing, then took them as
        gone); else the time until which to wait for them."""
        return self._seen.missing_until(order, gap_until)

    def _read_below(self, order: float, gap_until: float | None) -> float | None:
        """For a reader: None when every request before ``order`` was read from the device
        (or, as :meth:`_seen_below`, taken as gone) and none of them the kernel sent without
        waiting for its answer has yet to ask for its turn; else the time until which to wait
        (``inf``: until that one asks). A reader need not wait for the others: a program
        waits for each answer, so a request still unanswered and one that came after it were
        made at once, and may run in either order; a release is what a program's next open
        must not overtake."""
        if order != int(order):
            return None
        with self._read_lock:
            if any(u < order for u in self._unregistered):
                return _UNTIL_ASKED
            return self._read.missing_until(order, None if gap_until == _UNTIL_ASKED else gap_until)

    def leave_writer(self) -> None:
        """End a writer (called holding :attr:`turn`; returns without it)."""
        self._local.held = False
        self._local.alone = False
        self.writing = False
        self._notify()
        self.turn.release()

    def restart_readers(self) -> None:
        """Called by the writer running when it is about to change what readers may have
        read (the feed's poll found news): the readers still waiting run again after it."""
        if self.readers:
            self.on_writer()

    @contextmanager
    def alone(self, restart: bool = True) -> Iterator[None]:
        """Run a block as a writer (the change feed's poll, the daemon's last steps), after
        every request waiting now; ``restart=False``: the readers still waiting after the
        grace go on waiting unless the block calls :meth:`restart_readers`."""
        self.enter_writer(self.last_order + 0.5, restart=restart)
        try:
            yield
        finally:
            self.leave_writer()

    def wake(self) -> None:
        """Make every request waiting for its turn look again (one was interrupted)."""
        with self.turn:
            self._notify_all()

    # -- inside a request: called holding the lock ------------------------------------------
    @contextmanager
    def released(self) -> Iterator[None]:
        """Let go of :attr:`turn` around a wait (a server's socket, a sleep), if the calling
        thread holds it."""
        if not self.holds():
            yield
            return
        door = self._door_nodes is not None and self._door_owner == threading.get_ident()
        if door:
            self._door = self._door_nodes
            self._notify()
        self.before_wait()
        self.turn.release()
        try:
            yield
        finally:
            self.turn.acquire()
            if door:  # the door shuts; those let in end first (readers: see enter_writer)
                self._door = None
                self._wait_for(lambda: not self._passed, GRACE)
                if self._passed > self._passed_writers:
                    self.on_writer()
                while self._passed_writers:
                    self._wait(None, lambda: not self._passed_writers)

    def let_through(self, node: int) -> None:
        """Called by the writer running: let the readers waiting now, about other nodes than
        ``node``, run to their replies, then go on alone. Readers that come later wait, so a
        stream of them cannot hold the writer up."""
        if not (self.writing and self.holds()):
            return
        self._through = node
        self._notify()
        self._wait(THROUGH_WINDOW)
        self._through = None
        while self.readers:
            self._wait(None, lambda: not self.readers)

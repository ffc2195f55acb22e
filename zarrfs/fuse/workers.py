"""Requests served by several threads on a database server (``-o workers=N``): each thread reads
``/dev/fuse`` and runs under :class:`~zarrfs.fuse.admission.Admission`, so waits on the server
overlap; interrupts are matched to their request (docs/architecture.md, "Requests served
together")."""

from __future__ import annotations

import errno
import logging
import os
import select
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from zarrfs.fs.api import InterruptedCallError, RestartedError
from zarrfs.fuse import abi as k
from zarrfs.fuse.admission import Admission, Cancelled
from zarrfs.fuse.loop import IDLE_POLL_MS, catch_stop_signals, drain

log = logging.getLogger("zarrfs.fuse.workers")

DEFAULT_WORKERS = 16
#: Times a reader is run again after writers before it runs alone (and so surely ends).
RESTARTS = 3
#: Closes waiting that one close's thread serves with its own, at most.
GROUP_MAX = 64

#: Requests the kernel sends without waiting for their answer that may write: a reader that
#: came after one waits until it asked for its turn (``Admission.arrived``).
UNANSWERED = frozenset({k.RELEASE, k.RELEASEDIR})

_HEAD = struct.Struct("<IIQQ")  # len, opcode, unique, nodeid: the start of every request

#: What a request is, given its bytes: None for a writer, else the key readers about the same
#: thing take turns on (``fuse.session.Session.reader_key``).
Classify = Callable[[memoryview, int], Hashable | None]


class _Request:
    """The request a thread serves: what an INTERRUPT of it does."""

    __slots__ = (
        "unique", "node", "running", "reader", "interrupted", "cancelled", "stale", "efd", "grouped",
        "passed", "poked",
    )

    def __init__(self, efd: int) -> None:
        self.efd = efd
        self.unique = 0
        self.node = 0
        self.running = False
        self.reader = False
        self.interrupted = False
        self.cancelled = False
        self.stale = False  # a reader whose wait a writer's start ended (RestartedError)
        self.grouped = False  # serving closes of others too: its interrupt does not end them
        self.passed: Hashable | None = None  # let in beside a close's commit: its key
        self.poked = False  # its eventfd written (under Workers._requests_lock): read it at the end

    def poke(self) -> None:
        """Wake its wait on a server (called holding ``Workers._requests_lock``)."""
        self.poked = True
        os.eventfd_write(self.efd, 1)


class _Close:
    """A close waiting for its turn that another close's thread may serve with its own
    (``Workers.group``): its request, copied, and when it was answered."""

    __slots__ = ("req", "unique", "node", "data", "taken", "done")

    def __init__(self, req: _Request, unique: int, node: int, data: bytes) -> None:
        self.req = req
        self.unique = unique
        self.node = node
        self.data = data
        self.taken = False  # served by another thread, which answers it
        self.done = threading.Event()


class Waits:
    """What a driver waiting on its server uses (its ``watch``) when requests are served by
    several threads: the calling thread's request, its eventfd (readable when it was
    interrupted), and the lock let go of around the wait."""

    def __init__(self, admission: Admission) -> None:
        self._local = threading.local()
        self.admission = admission

    def request(self) -> _Request:
        """The calling thread's request record (made at its first use)."""
        req = getattr(self._local, "req", None)
        if req is None:
            req = self._local.req = _Request(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
        return req

    def fileno(self) -> int:
        """The descriptor a wait polls beside its socket: readable when interrupted."""
        return self.request().efd

    def check(self) -> None:
        """Raise :class:`InterruptedCallError` when the calling thread's request was interrupted."""
        req = self.request()
        try:
            os.eventfd_read(req.efd)
        except BlockingIOError:
            pass
        if req.interrupted and not req.grouped:
            raise InterruptedCallError("interrupted by the caller (FUSE_INTERRUPT)")

    def restart(self) -> None:
        """Raise :class:`RestartedError` when a writer started since the calling reader began
        (a driver calls it where its connection can be left: after a whole exchange, or
        having dropped it). A reader stalled on its server is left waiting: no writer waits
        for it."""
        if self.request().stale:
            raise RestartedError("a writer started: read again after it")

    def poll(self, poller: select.poll, timeout_ms: float) -> list[tuple[int, int]]:
        """``poller.poll(timeout_ms)`` with the filesystem lock let go meanwhile."""
        with self.admission.released():
            return poller.poll(timeout_ms)

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` with the filesystem lock let go meanwhile."""
        with self.released():
            time.sleep(seconds)

    @contextmanager
    def released(self) -> Iterator[None]:
        """Let go of the filesystem lock around a block that waits in a client's own code
        (redis-py's cluster client); a reader a writer made stale meanwhile runs again."""
        with self.admission.released():
            yield
        self.restart()

    def before_write(self) -> None:
        """A write transaction begins: a request let in beside a close's commit
        (``Admission.open_door``) first waits for its turn as the writer."""
        req = self.request()
        if req.passed is not None:
            key, req.passed = req.passed, None
            self.admission.upgrade(key, req.unique)

    def serve_waiting(self) -> None:
        """A writer waiting (another program's lock, a large file's parts) lets readers of
        other nodes run meanwhile (``Admission.let_through``)."""
        self.admission.let_through(self.request().node)


class _Ahead(deque):
    """Work read ahead of the requests (a listing's next window, ``fuse.dirreq``), each item
    called until it returns False: done alone by the thread that polls the change feed while
    no request waits, which a request thread's :meth:`append` wakes."""

    def __init__(self) -> None:
        super().__init__()
        self.wake_w = -1  # the pipe that wakes the polling thread, while it runs

    def append(self, item: Callable[[], bool]) -> None:
        super().append(item)
        if self.wake_w >= 0:
            try:
                os.write(self.wake_w, b"a")
            except OSError:  # full (it is woken already), or closed on the way out
                pass


class Workers:
    """Serves the requests read from ``fd`` with ``count`` threads (docs/architecture.md).
    ``handle`` answers one request (called holding the filesystem lock); ``classify`` tells a
    reader's key (None: a writer); ``idle`` is the change feed's poll."""

    def __init__(
        self,
        fd: int,
        handle: Callable[[memoryview], None],
        classify: Classify,
        buffer_size: int,
        count: int = DEFAULT_WORKERS,
        idle: Callable[[], None] | None = None,
        idle_interval: float = 0.01,
        idle_fd: int | None = None,
        admission: Admission | None = None,
        group: Callable[[memoryview], bool] | None = None,
        handle_group: Callable[[list[memoryview]], None] | None = None,
        passing: Classify | None = None,
    ) -> None:
        self.fd = fd
        self.handle = handle
        self.classify = classify
        self.buffer_size = buffer_size
        self.count = max(1, count)
        self.idle = idle
        self.idle_interval = idle_interval
        self.idle_fd = idle_fd
        self.group = group if handle_group is not None else None
        self.handle_group = handle_group
        self.passing = passing if handle_group is not None else None
        self.grouped = 0  # closes served by another close's thread
        self._closes: dict[int, _Close] = {}  # unique -> a close waiting that may be grouped
        self.admission = admission or Admission()
        self.admission.on_writer = self._readers_restart
        self.admission.before_wait = self._step_aside
        # The thread that reads the device next, and serves what it read unless it has to wait
        # (leader and followers): see _serve.
        self._lead = threading.Lock()
        self._leader: int | None = None
        self.waits = Waits(self.admission)
        self.restarts = 0  # readers run again after a writer started (RestartedError)
        self.served = [0, 0]  # requests served as writers, as readers
        self._requests: dict[int, _Request] = {}  # unique -> the request, while served
        self._requests_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()  # the mount is gone (a thread read ENODEV)
        #: Work read ahead of the requests (fuse.dirreq), done alone between them.
        self.ahead = _Ahead()
        self.stopping = False
        self.stop_signal: int | None = None
        self._wake_w = -1

    def stop(self, signum: int | None = None, _frame: Any = None) -> None:
        """End serving (a signal handler): the running requests finish first."""
        self.stopping = True
        self.stop_signal = signum

    # -- the threads ------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until unmounted or stopped; the calling thread polls the change feed. On the
        way out the filesystem lock is kept (no request runs after this returns)."""
        # The stop signals are caught before any thread answers INIT: a program that sees the
        # mount and signals the daemon at once gets a clean exit, not a dead mount.
        wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ahead.wake_w = self._wake_w
        restore = self._catch_signals(self._wake_w)
        for i in range(self.count):
            t = threading.Thread(target=self._serve, name=f"zarrfs-request-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        try:
            self._watch_idle(wake_r)
        finally:
            restore()
            self.ahead.wake_w = -1
            os.close(wake_r)
            os.close(self._wake_w)
            # Running requests end; those read later wait for a turn that never comes (the
            # kernel drops them at the unmount).
            self.admission.enter_writer(self.admission.last_order + 0.5, grace=None)
            log.debug(
                "%d requests served alone, %d together; %d readers run again after a writer;"
                " %d closes served with another's; %d requests let in beside a close's commit,"
                " %d of which then waited to write",
                self.served[0], self.served[1], self.restarts, self.grouped,
                self.admission.passes, self.admission.upgrades,
            )

    def _watch_idle(self, wake_r: int) -> None:
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        if self.idle_fd is not None:
            poller.register(self.idle_fd, select.POLLIN)
        idle = self.idle
        # A feed that says when it has news is polled then (and now and then); one that does
        # not, every idle_interval. Each poll runs alone: it waits for the running requests.
        wait_ms = IDLE_POLL_MS
        if idle is not None and self.idle_fd is None:
            wait_ms = max(1, int(self.idle_interval * 1000))
        ahead = self.ahead
        while not self.stopping and not self._stopped.is_set():
            poller.poll(wait_ms)
            drain(wake_r)
            if idle is not None and not self.stopping:
                with self.admission.alone(restart=False):  # the poll says if it found news
                    idle()
            # A listing's next window, read while the kernel takes the last reply in, a step
            # at a time, while no request waits (a request coming meanwhile waits for one).
            while ahead and not self.stopping and not select.select([self.fd], [], [], 0)[0]:
                with self.admission.alone(restart=False):
                    if not ahead[0]():
                        ahead.popleft()

    def _serve(self) -> None:
        """Read requests and serve them, one thread at a time: the leader reads the device and
        serves what it read; about to wait (its turn, a server's answer), it steps aside
        (:meth:`_step_aside`) and one of the threads waiting to lead reads the next request.
        Every thread reading the device at once cost each request several handoffs of the GIL
        and of the lock between threads that then all ran Python (docs/performance.md,
        "Request threads: one reads at a time")."""
        buf = bytearray(self.buffer_size)
        view = memoryview(buf)
        fd = self.fd
        req = self.waits.request()
        me = threading.get_ident()
        lead = self._lead
        while True:
            if self._leader != me:
                lead.acquire()
                self._leader = me
            if self._stopped.is_set():
                self._step_aside()
                return
            try:
                n = os.readv(fd, [buf])
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.EAGAIN):  # interrupted before it was read
                    if exc.errno == errno.EAGAIN:
                        select.select([fd], [], [], 0.5)
                    continue
                if exc.errno != errno.ENODEV:
                    log.error("reading /dev/fuse failed: %s", exc)
                self._gone()
                self._step_aside()
                return
            if n == 0:
                self._gone()
                self._step_aside()
                return
            if n < k.IN_HEADER_SIZE:
                log.warning("a request of %d bytes, shorter than a header, ignored", n)
                continue
            _len, opcode, unique, nodeid = _HEAD.unpack_from(buf)
            if opcode == k.INTERRUPT:
                self._interrupt(view[:n], unique)
                continue
            self.admission.arrived(unique, opcode in UNANSWERED)
            self._serve_one(view[:n], req, unique, nodeid)

    def _serve_one(self, data: memoryview, req: _Request, unique: int, nodeid: int) -> None:
        admission = self.admission
        req.unique, req.node = unique, nodeid
        req.interrupted = req.cancelled = req.running = False
        with self._requests_lock:
            self._requests[unique] = req
        restarted = 0
        close = None
        passing = None
        passed = False
        try:
            while True:  # a reader a writer made stale runs again
                admission.turn.acquire()  # held on into enter_reader/enter_writer
                try:
                    key = None if restarted >= RESTARTS else self.classify(data, nodeid)
                    if unique > admission.last_order:
                        admission.last_order = unique
                    if key is None and self.group is not None and self.group(data):
                        close = _Close(req, unique, nodeid, bytes(data))
                        with self._requests_lock:
                            self._closes[unique] = close
                    elif key is None and self.passing is not None:
                        passing = self.passing(data, nodeid)
                except BaseException:
                    admission.turn.release()
                    raise
                req.reader, req.stale = key is not None, False
                self.served[req.reader] += 1
                try:
                    if key is None:
                        ended = lambda c=close: req.cancelled or (c is not None and c.taken)  # noqa: E731
                        through = None if passing is None else (passing, nodeid)
                        passed = admission.enter_writer(
                            unique, ended, passing=through, close=close is not None, close_node=nodeid,
                            held=True,
                        )
                        req.passed = passing if passed else None
                    else:
                        admission.enter_reader(key, nodeid, unique, lambda: req.cancelled, held=True)
                except Cancelled:
                    with self._requests_lock:
                        taken = close is not None and close.taken
                        self._closes.pop(unique, None)
                    if taken:  # another thread serves it with its own, and answers it
                        self._step_aside()
                        close.done.wait()
                    else:
                        self._answer(unique, errno.EINTR)
                    return
                req.running = True
                try:
                    if close is not None:
                        self._serve_closes(data, req, unique, close)
                    else:
                        self.handle(data)
                    return
                except RestartedError:
                    self.restarts += 1
                    restarted += 1
                    try:
                        os.eventfd_read(req.efd)  # the writer's poke: read
                    except BlockingIOError:
                        pass
                finally:
                    req.running = False
                    if req.passed is not None:  # (not made a writer by Waits.before_write)
                        req.passed = None
                        admission.leave_passing(passing)
                    elif key is None:
                        admission.leave_writer()
                    else:
                        admission.leave_reader(key)
        finally:
            with self._requests_lock:
                self._requests.pop(unique, None)
                poked, req.poked = req.poked, False
            admission.settled(unique)
            if poked:  # an interrupt or a writer's poke that came too late is forgotten
                try:
                    os.eventfd_read(req.efd)
                except BlockingIOError:
                    pass

    def _serve_closes(self, data: memoryview, req: _Request, unique: int, close: _Close) -> None:
        """Serve the close ``data`` (this thread's turn as the writer) with the closes of other
        files waiting right behind it: before any other writer in the kernel's queue, not
        interrupted (their requests are answered EINTR by their own threads), one a file. Their
        commits then share one transaction (``Session.flushes``); each is answered as its own.
        Why: closes of new chunks all change their folder's record, so run side by side they
        would conflict and retry; served together they cost one commit's round trips."""
        admission = self.admission
        with self._requests_lock:
            self._closes.pop(unique, None)
            nodes = {close.node}
            group: list[_Close] = []
            for order, other in sorted(self._closes.items()):
                if order < unique:  # read before this one, not waiting yet: it waits its turn
                    continue
                if len(group) >= GROUP_MAX or not admission.passable_before(order, other.node):
                    break
                if other.req.cancelled or other.node in nodes:
                    continue
                other.taken = True
                nodes.add(other.node)
                group.append(other)
            for other in group:
                self._closes.pop(other.unique, None)
        if not group:
            with admission.open_door(frozenset(nodes)):
                self.handle(data)
            return
        self.grouped += len(group)
        req.grouped = True
        try:
            assert self.handle_group is not None
            with admission.open_door(frozenset(nodes)):
                self.handle_group([data, *(memoryview(other.data) for other in group)])
        except Exception as exc:  # never left unanswered: the kernel would wait for ever
            log.error("closes served together failed: %s", exc)
            for other in group:
                self._answer(other.unique, errno.EIO)
            self._answer(unique, errno.EIO)
        finally:
            req.grouped = False
            for other in group:  # their threads, woken when this writer leaves, end
                other.done.set()

    def _step_aside(self) -> None:
        """The calling thread is about to wait: if it leads, another thread reads the next
        request meanwhile (it leads again once that one steps aside)."""
        if self._leader == threading.get_ident():
            self._leader = None
            self._lead.release()

    def _readers_restart(self) -> None:
        """A writer starts: every reader waiting on a server ends its wait (see admission)."""
        with self._requests_lock:
            for req in self._requests.values():
                if req.running and req.reader and not req.stale:
                    req.stale = True
                    req.poke()

    def _interrupt(self, data: memoryview, unique: int) -> None:
        if len(data) < k.IN_HEADER_SIZE + k.INTERRUPT_IN.size:
            return
        (target,) = k.INTERRUPT_IN.unpack_from(data, k.IN_HEADER_SIZE)
        with self._requests_lock:
            req = self._requests.get(target)
            if req is not None and req.unique == target:
                if req.running:
                    req.interrupted = True
                    req.poke()
                else:
                    req.cancelled = True
            else:
                req = None
        if req is None:
            self._answer(unique, errno.EAGAIN)  # not read yet: the kernel sends it again
        elif req.cancelled:
            self.admission.wake()

    def _answer(self, unique: int, code: int) -> None:
        try:
            os.write(self.fd, k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, -code, unique))
        except OSError:
            pass  # gone meanwhile

    def _gone(self) -> None:
        self._stopped.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _catch_signals(self, wake_w: int) -> Callable[[], None]:
        return catch_stop_signals(self.stop, wake_w)

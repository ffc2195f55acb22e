"""The request loop: reads ``/dev/fuse``, spinning briefly before it sleeps.

Every request is a round trip, and waking a thread asleep on another CPU is often most of its
cost (figures in docs/performance.md). So after each request the loop keeps reading for up to
``spin`` microseconds before it blocks: a client whose next request comes within that window (a
``stat`` loop, a chunk written in pieces, create + write + close) finds the daemon awake. The
window halves after each request that comes later than ``spin``, down to nothing, and is full
again once one comes within it; an idle mount sleeps. ``-o spin=0`` turns spinning off;
``scripts/bench_loop.py`` measures the choice.

While no request waits, the loop does the work a request left to be read ahead (a listing's
next window, read while the kernel takes in the last reply) before it spins or sleeps.

Requests that arrived while a request waited on a server (read by the driver's wait, see
``interrupts``) are served first, in order, before ``/dev/fuse`` is read again. SIGINT, SIGTERM
and SIGHUP end the loop between two requests (never inside one), whichever thread the signal
reaches: it wakes a sleeping loop through Python's wakeup fd.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Callable

from zarrfs.spin import next_window

log = logging.getLogger("zarrfs.fuse.loop")

DEFAULT_SPIN_US = 200
# How long a sleeping loop waits before it looks again (a safety net: signals wake it).
IDLE_POLL_MS = 500
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Loop:
    """Reads requests from ``fd`` into one buffer and hands each to ``handle``, until the
    mount goes away or a stop signal arrives."""

    def __init__(
        self,
        fd: int,
        handle: Callable[[memoryview], None],
        buffer_size: int,
        spin_us: float = DEFAULT_SPIN_US,
        idle: Callable[[], None] | None = None,
        idle_interval: float = 0.01,
        idle_fd: int | None = None,
        pending: deque[bytes] | None = None,
        ahead: deque[Callable[[], bool]] | None = None,
    ) -> None:
        self.fd = fd
        self.pending: deque[bytes] = deque() if pending is None else pending
        # Work read ahead of the requests (a listing's next window): done while no request
        # waits, each item called until it returns False (fuse.dirreq).
        self.ahead: deque[Callable[[], bool]] = deque() if ahead is None else ahead
        self.handle = handle
        self.buffer_size = buffer_size
        self.spin = spin_us / 1e6
        self.stopping = False
        self.stop_signal: int | None = None
        # Work between requests (the change feed): every idle_interval, also under load, and
        # when idle_fd becomes readable.
        self.idle = idle
        self.idle_interval = idle_interval
        self.idle_fd = idle_fd

    def stop(self, signum: int | None = None, _frame=None) -> None:
        """End the loop after the request being answered (a signal handler)."""
        self.stopping = True
        self.stop_signal = signum

    def run(self) -> None:
        """Serve until unmounted or stopped."""
        fd = self.fd
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        if self.idle_fd is not None:
            poller.register(self.idle_fd, select.POLLIN)
        restore = self._catch_signals(wake_w)
        try:
            self._serve(poller, wake_r)
        finally:
            restore()
            os.close(wake_r)
            os.close(wake_w)

    def _serve(self, poller, wake_r: int) -> None:
        buf = bytearray(self.buffer_size)
        view = memoryview(buf)
        readv, handle, clock = os.readv, self.handle, time.perf_counter
        bufs = [buf]
        fd = self.fd
        longest = window = self.spin
        last = clock()
        idle, interval, idle_fd = self.idle, self.idle_interval, self.idle_fd
        # A sleeping loop wakes for the idle work only if there is some to do.
        sleep_ms = IDLE_POLL_MS if idle is None or idle_fd is not None else max(1, int(interval * 1000))
        idle_at = last
        pending, ahead = self.pending, self.ahead
        while not self.stopping:
            if pending:  # read while a request waited on a server: theirs is the first turn
                handle(memoryview(pending.popleft()))
                last = clock()
                continue
            try:
                n = readv(fd, bufs)
            except BlockingIOError:
                if ahead:  # nothing waits: the work read ahead, a step at a time
                    if not ahead[0]():
                        ahead.popleft()
                    last = clock()
                    continue
                if clock() - last > window:
                    ready = poller.poll(sleep_ms)
                    if any(w == wake_r for w, _ in ready):
                        drain(wake_r)
                    now = clock()
                    window = next_window(window, now - last, longest)
                    last = now
                    # The idle work after a sleep: when its descriptor woke the loop (another
                    # writer's commit), when it has none to wake it, or when it is due; not
                    # before every request of a client that makes the loop sleep between them.
                    if idle is not None and (
                        idle_fd is None or now - idle_at > interval or any(w == idle_fd for w, _ in ready)
                    ):
                        idle()
                        idle_at = now
                continue
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # a request interrupted before it was read
                    continue
                if exc.errno != errno.ENODEV:  # ENODEV: unmounted
                    log.error("reading /dev/fuse failed: %s", exc)
                return
            if n == 0:
                return
            handle(view[:n])
            last = clock()
            if idle is not None and last - idle_at > interval:
                idle()
                idle_at = last

    def _catch_signals(self, wake_w: int) -> Callable[[], None]:
        return catch_stop_signals(self.stop, wake_w)


def catch_stop_signals(stop: Callable[..., None], wake_w: int) -> Callable[[], None]:
    """Have SIGINT, SIGTERM and SIGHUP call ``stop`` and wake a sleeping loop through
    ``wake_w`` (on the main thread only); returns what puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    saved_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def restore() -> None:
        signal.set_wakeup_fd(saved_fd)
        for s, handler in saved.items():
            signal.signal(s, handler)

    return restore


def drain(fd: int) -> None:
    """Read a non-blocking pipe empty."""
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass

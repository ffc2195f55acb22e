"""How the PostgreSQL driver waits on its server: bounded by ``-o timeout=``, and interruptible.

psycopg runs each exchange as a generator naming the socket readiness it needs next, and a
``wait`` that sleeps until the socket has it. :class:`WatchedConnection`'s wait also polls the
driver's ``watch`` (``/dev/fuse`` while mounted, :mod:`zarrfs.fuse.interrupts`), as the Redis
links do: requests arriving meanwhile are queued by ``watch.check()``; a ``FUSE_INTERRUPT`` of the
request served raises :class:`InterruptedCallError` (EINTR); no progress within the driver's
``timeout`` raises :class:`StalledError` (ETIMEDOUT: a paused server, a partition; the server's
``statement_timeout`` bounds what it runs). Either way the statement is cancelled (on a connection
of its own, within :data:`CANCEL_WAIT` seconds) and the connection closed, its state unknown; the
driver makes a new one for the next transaction.
"""

from __future__ import annotations

import logging
import select
import time
from typing import Any

import psycopg
from psycopg.waiting import READY_R, READY_W, Wait

from ..errors import InterruptedCallError, StalledError

log = logging.getLogger("zarrfs.backends.postgres")

#: Seconds a cancel request may take before the connection is closed without it.
CANCEL_WAIT = 1.0
_EVENTS = {Wait.R: select.POLLIN, Wait.W: select.POLLOUT, Wait.RW: select.POLLIN | select.POLLOUT}
_BAD = select.POLLERR | select.POLLHUP | select.POLLNVAL


class WatchedConnection(psycopg.Connection):
    """A psycopg connection whose waits honour its driver's ``watch`` and ``timeout``; see the
    module docstring. ``driver`` is set right after connecting."""

    driver: Any = None
    #: Seconds this connection's waits last at most, when shorter than the driver's timeout
    #: (a best-effort statement: a reading transaction's deferred ``COMMIT``).
    limit: float | None = None
    #: The statements prepared on this connection (``rawpipe.Named``), set with ``driver``.
    named: Any = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        """Run ``gen`` (psycopg's protocol generator) to its end; see the module docstring.
        A caller's own ``timeout`` (psycopg's, raising its ``_WaitTimeout``) keeps psycopg's
        wait."""
        driver = self.driver
        if driver is None or timeout is not None:
            return super().wait(gen, interval, timeout)
        fd = self.pgconn.socket
        watch = driver.watch
        poller = select.poll()
        watch_fd = None
        if watch is not None:
            watch_fd = watch.fileno()
            poller.register(watch_fd, select.POLLIN)
        try:
            state = next(gen)
            poller.register(fd, _EVENTS[state])
            bound = driver.timeout if self.limit is None else min(self.limit, driver.timeout)
            deadline = time.monotonic() + bound
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._abandon(driver)
                    raise StalledError(f"{driver.where}: no reply within {bound:g} s (-o timeout=)")
                ready = 0
                # Ready at once (room to send the query, an answer already in): no wait, so
                # no other request is let in and no request thread woken for it.
                polled = poller.poll(0)
                if not polled:
                    ms = left * 1000 + 1
                    polled = poller.poll(ms) if watch is None else watch.poll(poller, ms)
                for got_fd, events in polled:
                    if got_fd == fd:
                        ready = (READY_R if events & (select.POLLIN | _BAD) else 0) | (
                            READY_W if events & select.POLLOUT else 0
                        )
                    elif watch is not None:
                        try:
                            watch.check()  # raises when this request was interrupted
                        except InterruptedCallError:
                            self._abandon(driver)
                            raise
                if ready:
                    state = gen.send(ready)
                    poller.modify(fd, _EVENTS[state])
                    deadline = time.monotonic() + bound  # progress: a new bound
        except StopIteration as stop:
            return stop.value

    def gone(self) -> bool:
        """Whether the server closed this idle connection (it restarted, or ended the
        session): a closed socket reads as an end of file, found without waiting, so that a
        transaction starts on a new connection rather than failing on this one."""
        if self.closed:
            return True
        poller = select.poll()
        poller.register(self.pgconn.socket, select.POLLIN)
        for _ in range(4):  # a notice, or the server's last words, then the end of file
            if not poller.poll(0):
                return False
            try:
                self.pgconn.consume_input()
            except psycopg.OperationalError:
                return True
        return self.closed

    def _abandon(self, driver: Any) -> None:
        """Cancel what the server runs for this connection (bounded) and close it."""
        try:
            self.cancel_safe(timeout=CANCEL_WAIT)
        except Exception as exc:  # noqa: BLE001 - best effort: the connection is closed anyway
            log.debug("%s: cancel failed: %s", driver.where, exc)
        self.pgconn.finish()

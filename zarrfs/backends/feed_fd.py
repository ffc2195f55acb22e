"""A descriptor number for a change feed that stays the same while its connection is renewed.

The daemon's request loop registers :meth:`~zarrfs.backends.base.Driver.feed_fileno` once,
at the start. A feed whose connection is lost and made again (a server restart, a failover)
gets a new socket, likely under another number: the loop would go on polling the old one
(closed: always "ready", a busy loop; or reused by something else). :class:`FeedFd` holds one
number for the life of the feed: a duplicate of the current connection's socket, or, while
there is none, of a pipe nobody writes to (never readable: the loop then looks at the feed
every ``feed_interval`` only while it handles requests, or after its idle poll).
"""

from __future__ import annotations

import os
from collections.abc import Callable


class FeedFd:
    """One descriptor number standing for whichever connection the feed has now."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_CLOEXEC)
        self.fd: int | None = os.dup(self._r)

    def first(self, connect: Callable[[], None]) -> None:
        """Run ``connect``, the feed's first connection (which points this number at its
        socket); when it fails the descriptors are released and the error raised: the feed
        is not made."""
        try:
            connect()
        except BaseException:
            self.close()
            raise

    def point(self, fd: int) -> None:
        """Make the number stand for ``fd`` (a connection's socket), from now on."""
        if self.fd is not None:
            os.dup2(fd, self.fd, inheritable=False)

    def park(self) -> None:
        """Make the number stand for nothing that ever becomes readable (no connection)."""
        if self.fd is not None:
            os.dup2(self._r, self.fd, inheritable=False)

    def close(self) -> None:
        """Release the descriptors."""
        for fd in (self.fd, self._r, self._w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = None

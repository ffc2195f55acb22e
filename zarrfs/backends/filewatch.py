"""A descriptor that becomes readable when a file in the database's folder is written: the
wake-up of an embedded database's change feed (LMDB, SQLite).

Another process committing to the same LMDB or SQLite file writes to it (``pwrite`` of LMDB's
pages and meta page, SQLite's database and WAL files); inotify tells of that at once. With it
the daemon's idle loop sleeps until a write happens instead of looking at the feed 50 times a
second (:attr:`~zarrfs.backends.base.Driver.feed_interval`), and sees another writer's commit
sooner. A writer that changes the file through a writable map (LMDB's ``writemap``) makes no
event: the loop's safety-net look (``IDLE_POLL_MS``) and every request's look still find it.

Three calls of the C library through ctypes: the standard library has no inotify and the
packages that wrap it make the same three calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("zarrfs.backends.filewatch")

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
WRITES = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return _libc


class FileWatch:
    """An inotify descriptor watching ``folder`` for writes to the files in it."""

    def __init__(self, folder: str) -> None:
        self.fd: int | None = None
        try:
            libc = _lib()
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            if libc.inotify_add_watch(fd, os.fsencode(folder), WRITES) < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, os.strerror(err))
        except (OSError, AttributeError) as exc:  # no inotify, or no watch left: polled instead
            log.info("%s: no inotify watch (%s): the change feed is polled", folder, exc)
            return
        self.fd = fd

    def fileno(self) -> int | None:
        """The descriptor (readable after a write), or None when there is no watch."""
        return self.fd

    def drain(self) -> None:
        """Read the events waiting, so that the descriptor is readable again only after the
        next write. Called before the feed is looked at: a write after it wakes the loop."""
        if self.fd is None:
            return
        try:
            while os.read(self.fd, 65536):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Release the descriptor."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

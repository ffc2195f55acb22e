"""A descriptor that becomes readable when one of an embedded database's files is written: the
wake-up of its change feed (LMDB, SQLite).

Another process committing to the same LMDB or SQLite file writes to it (``pwrite`` of LMDB's
pages and meta page, SQLite's database and WAL files); inotify tells of that at once. With it
the daemon's idle loop sleeps until a write happens instead of looking at the feed 50 times a
second (:attr:`~zarrfs.backends.base.Driver.feed_interval`), and sees another writer's commit
sooner. A writer that changes the file through a writable map (LMDB's ``writemap``) makes no
event: the loop's safety-net look (``IDLE_POLL_MS``) and every request's look still find it.

Only the database's own files are watched for writes, each by name; the folder only for files
appearing (one of them made later, such as LMDB's side environment at its first write, or put
in place by a rename). A watch on the whole folder woke the daemon for every write of any
program to any file beside the database (a log appended to there kept it at 60% of a CPU).

Three calls of the C library through ctypes: the standard library has no inotify and the
packages that wrap it make the same three calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Iterable

log = logging.getLogger("zarrfs.backends.filewatch")

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
WRITES = IN_MODIFY | IN_CLOSE_WRITE
APPEARS = IN_CREATE | IN_MOVED_TO
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (of the name that follows)

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return _libc


class FileWatch:
    """An inotify descriptor watching the files ``names`` of ``folder`` for writes (those not
    there yet from when they appear)."""

    def __init__(self, folder: str, names: Iterable[str]) -> None:
        self.fd: int | None = None
        self.folder = folder
        self.names = frozenset(names)
        self._folder_wd = -1
        try:
            libc = _lib()
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            self._folder_wd = libc.inotify_add_watch(fd, os.fsencode(folder), APPEARS)
            if self._folder_wd < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, os.strerror(err))
        except (OSError, AttributeError) as exc:  # no inotify, or no watch left: polled instead
            log.info("%s: no inotify watch (%s): the change feed is polled", folder, exc)
            return
        self.fd = fd
        for name in self.names:
            self._watch(name)

    def _watch(self, name: str) -> None:
        """Watch the file ``name`` for writes, if it is there (else its appearing tells)."""
        assert self.fd is not None
        path = os.path.join(self.folder, name)
        if _lib().inotify_add_watch(self.fd, os.fsencode(path), WRITES) < 0:
            err = ctypes.get_errno()
            if err != errno.ENOENT:  # no watch left: the loop's safety-net look finds its commits
                log.info("%s: no inotify watch (%s): the change feed is polled", path, os.strerror(err))

    def fileno(self) -> int | None:
        """The descriptor (readable after a write), or None when there is no watch."""
        return self.fd

    def drain(self) -> None:
        """Read the events waiting, so that the descriptor is readable again only after the
        next write. Called before the feed is looked at: a write after it wakes the loop."""
        if self.fd is None:
            return
        while True:
            try:
                got = os.read(self.fd, 65536)
            except OSError:  # BlockingIOError: none left
                return
            if not got:
                return
            for name in self._appeared(got):  # made, or put in place: follow the new file
                self._watch(name)

    def _appeared(self, events: bytes) -> set[str]:
        """Which of :attr:`names` the folder's events in ``events`` say appeared."""
        appeared = set()
        at = 0
        while at + _EVENT.size <= len(events):
            wd, _, _, length = _EVENT.unpack_from(events, at)
            at += _EVENT.size
            if wd == self._folder_wd and length:
                name = os.fsdecode(events[at : at + length].rstrip(b"\0"))
                if name in self.names:
                    appeared.add(name)
            at += length
        return appeared

    def close(self) -> None:
        """Release the descriptor."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

"""Disk space of the file databases (LMDB, SQLite): what their filesystem has free, and blocks
reserved ahead of a growing file so that a commit does not pay for their allocation."""

from __future__ import annotations

import ctypes
import errno
import os
import time


def statvfs(path: str) -> dict[str, int]:
    """Return ``{"total", "free"}`` bytes of the filesystem holding ``path``."""
    st = os.statvfs(path)
    return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


FALLOC_FL_KEEP_SIZE = 1
PREALLOCATE_MIN = 8 << 20
PREALLOCATE_MAX = 256 << 20


class Preallocator:
    """Keeps disk blocks reserved ahead of the end of a growing database file.

    Extending a file costs its filesystem a block allocation per write, which on ext4 costs an
    appending commit several times what the same commit costs into blocks reserved beforehand
    (``scripts/bench.py``'s zarr write is made of such commits; see docs/performance.md).
    ``fallocate(FALLOC_FL_KEEP_SIZE)`` reserves them without changing the file's size, so the
    database sees nothing. The reserve is an eighth of the file, 8 to 256 MiB, never more than
    a quarter of the free space; where the filesystem cannot reserve, nothing is done. What is
    still unused is given back by :meth:`release` (a truncation to the file's own size, which
frees the blocks past its end), so a database
    written by another program, such as zarr-python 2's ``LMDBStore``, keeps no more blocks
    than its own writes took: the caller holds the database's writer lock meanwhile, since the
    release truncates the file to the size it has, which must not race another writer's growth.

    The file stays open from the first reservation until :meth:`close`. Not for SQLite: closing
    any descriptor of a file drops every POSIX lock the process holds on it, and SQLite locks
    its database file that way (LMDB locks only its lock file).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.reserved_to = 0
        self._fd: int | None = None
        self._fallocate = _libc_fallocate()

    def grow(self) -> None:
        """Call before a write: reserve more when the file's end nears the reserve's."""
        if self._fallocate is None:
            return
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            size = os.fstat(self._fd).st_size
        except OSError:
            return
        margin = min(max(size // 8, PREALLOCATE_MIN), PREALLOCATE_MAX)
        if size + margin // 2 <= self.reserved_to:
            return
        try:
            free = os.fstatvfs(self._fd)
        except OSError:
            return
        margin = min(margin, free.f_bavail * free.f_frsize // 4)
        start = max(size, self.reserved_to)
        end = size + margin
        if end > start and self._fallocate(self._fd, FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
            if ctypes.get_errno() in (errno.EOPNOTSUPP, errno.ENOSYS):
                self._fallocate = None  # this filesystem cannot: stop trying
            return  # (no room: the database's own writes will say so)
        self.reserved_to = max(end, self.reserved_to)

    def release(self) -> None:
        """Give back the unused reserve; the caller holds the database's writer lock (nobody
        may grow the file meanwhile)."""
        if self._fd is None or self.reserved_to == 0:
            return
        try:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size)  # the same size: frees the reserve
            self.reserved_to = 0
        except OSError:
            pass  # the blocks stay reserved: only disk space

    def close(self) -> None:
        """Close the file (after the database was closed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _libc_fallocate():
    try:
        func = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    func.restype = ctypes.c_int
    return func


class Reserve:
    """Disk room kept next to a database file, freed when a small transaction (a removal)
    finds the disk full, so cleanup stays possible (see ``Driver.transact``): SQLite's WAL and
    LMDB's copy-on-write pages need room to record even a delete. ``size`` bytes, at most an
    eighth of the free space, taken with ``posix_fallocate`` (all or nothing); made again, at
    most every ``retry`` seconds, once the disk has room."""

    def __init__(self, path: str, size: int = 1 << 20, retry: float = 10.0) -> None:
        self.path = path
        self.size = size
        self.retry = retry
        self._next = 0.0
        self.make()

    def make(self) -> None:
        """Take the room, unless it is taken or the disk has too little."""
        self._next = time.monotonic() + self.retry
        try:
            if os.path.exists(self.path):
                return
            st = os.statvfs(os.path.dirname(self.path) or ".")
            size = min(self.size, st.f_bavail * st.f_frsize // 8)
            if size <= 0:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError:
                os.close(fd)
                os.unlink(self.path)
                return
            os.close(fd)
        except OSError:
            pass  # a reserve is a convenience: a folder we cannot write to has none

    def again(self) -> None:
        """Before a write: make the room again if it was freed and the retry time has come."""
        if time.monotonic() >= self._next:
            self.make()

    def free(self) -> bool:
        """Free the room; whether there was any."""
        try:
            os.unlink(self.path)
        except OSError:
            return False
        self._next = time.monotonic() + self.retry
        return True

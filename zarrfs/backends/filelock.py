"""One writer, or any number of readers, on a database file whose format has no locking of its
own (DBM, a zip archive being written): an open file description lock (``F_OFD_SETLK``) on the
file, shared for a reader and exclusive for a writer, taken at open and held until close.

OFD locks, unlike ``fcntl``'s process locks, are not dropped when the process closes another
descriptor of the file (``dbm.dumb`` opens and closes its files at every access) and exclude
two drivers of one process as they do two processes; they are independent of ``flock``, which
``dbm.gnu`` takes on its own file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from .errors import BackendError

# struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for an OFD lock), padding.
_FLOCK = struct.Struct("hhqqi4x")


class BusyDatabaseError(BackendError):
    """Another driver holds the database in a way this one may not share."""


class FileLock:
    """The lock on ``path`` (which must exist), taken at once or refused with
    :class:`BusyDatabaseError` naming ``what`` (say ``"DBM database"``); :meth:`release` drops it."""

    def __init__(self, path: str, write: bool, what: str) -> None:
        self.fd: int | None = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)
        kind = fcntl.F_WRLCK if write else fcntl.F_RDLCK
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise BackendError(f"{path}: cannot lock it: {exc.strerror}") from None
            now = "already open elsewhere" if write else "open for writing elsewhere"
            raise BusyDatabaseError(
                f"{what} {path} is {now} (a mount, a copy): it takes one writer and no reader "
                "beside it; LMDB and SQLite share a database between mounts"
            ) from None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

"""The one table that maps exceptions to errno values.

The tree, the handles, the format layer and the drivers raise meaningful exceptions; the FUSE
operations class asks :func:`to_errno` what the kernel should hear, and logs one line when the
error is worth a line.
"""

from __future__ import annotations

import errno
import logging

from zarrfs.backends import base
from zarrfs.backends.errors import ExpiredError


class FsError(OSError):
    """A POSIX condition found by the filesystem logic (ENOENT, EEXIST, ENOTEMPTY, ...).

    ``quiet`` errors are part of normal operation (a lookup of a missing name) and are not logged.
    """

    def __init__(self, code: int, message: str = "", quiet: bool = False) -> None:
        super().__init__(code, message or errno.errorcode.get(code, str(code)))
        self.quiet = quiet


class Refused(FsError):
    """One of several files committed in one transaction (``Tree.store``) was refused
    (a check, a format rule, a value too large): none was stored, and each is committed alone
    so that each hears its own answer."""

    def __init__(self, key: str, cause: BaseException) -> None:
        super().__init__(to_errno(cause), f"{key}: {cause}")
        self.cause = cause


def _format_error_types() -> tuple[type[BaseException], ...]:
    try:
        from zarrfs.format.errors import FormatError
    except ImportError:  # the format layer is optional for the tree's own tests
        return ()
    return (FormatError,)


# Ordered: the first matching class wins, so subclasses come before their bases.
_TABLE: list[tuple[type[BaseException], int]] = [
    (base.KeyTooLongError, errno.ENAMETOOLONG),
    (base.InvalidKeyError, errno.EINVAL),
    (base.ReadOnlyError, errno.EROFS),
    (base.StorageFullError, errno.ENOSPC),
    (base.StalledError, errno.ETIMEDOUT),
    (base.InterruptedCallError, errno.EINTR),
    (base.ValueTooLargeError, errno.EFBIG),
    (base.UnavailableError, errno.EIO),
    (ExpiredError, errno.ESTALE),
    (base.RetryableError, errno.EAGAIN),
    (base.DriverNotFoundError, errno.ENODEV),
    (base.BackendError, errno.EIO),
    (MemoryError, errno.ENOMEM),
    (UnicodeError, errno.EINVAL),
]


def to_errno(exc: BaseException) -> int:
    """Return the errno that the caller of the failed system call should see for ``exc``."""
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno
    for cls in _format_error_types():
        if isinstance(exc, cls):
            return errno.EINVAL
    for cls, code in _TABLE:
        if isinstance(exc, cls):
            return code
    return errno.EIO


def log_level(exc: BaseException) -> int:
    """The level of the log line of a failed call: a warning for what the caller asked that
    cannot be (an ``OSError`` of the filesystem's, a path longer than the database holds), an
    error for the rest."""
    return logging.WARNING if isinstance(exc, (OSError, base.KeyTooLongError)) else logging.ERROR


def is_quiet(exc: BaseException) -> bool:
    """Whether ``exc`` is routine (a missing name, a full folder on rmdir) and needs no log line."""
    return bool(getattr(exc, "quiet", False))

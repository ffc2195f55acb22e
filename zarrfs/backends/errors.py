"""The exceptions of the driver interface: every driver raises these, so one table
(``zarrfs.fs.errors``) maps them to errno values."""

from __future__ import annotations


class BackendError(Exception):
    """Base class of every error a driver raises."""


class RetryableError(BackendError):
    """A conflict or a busy database: running the transaction again may succeed."""


class GuessedWrongError(RetryableError):
    """A transaction that took answers without reading them (what it last saw) found one
    wrong at its commit, which wrote nothing: it runs again at once, reading."""


class UnavailableError(BackendError):
    """The database cannot be reached (a dead Redis, a vanished file)."""


class StalledError(UnavailableError):
    """The server did not answer within the mount's ``timeout`` (paused, partitioned,
    overloaded): the call fails with ETIMEDOUT rather than holding the mount. The connection is
    dropped and the next call opens a new one. A commit that stalls has an unknown outcome:
    the server may still apply it when it comes back."""


class ExpiredError(BackendError):
    """A version the mount served is gone (a snapshot held past its limit, or lost with its
    connection): reads fail with ESTALE rather than fall back to newer data."""


class InterruptedCallError(BackendError):
    """The request waiting on the database was interrupted (its caller got a signal and the
    kernel sent FUSE_INTERRUPT): the call fails with EINTR. Like a stall, it drops the
    connection, and an interrupted commit has an unknown outcome."""

    quiet = True  # the caller asked for it: not worth a log line


class RestartedError(InterruptedCallError):
    """A request that writes nothing was waiting on the database when a writer started
    (``fuse.admission``): its wait ends as an interrupt's does, and the request is run again
    from its start once the writer is done, never answered with this."""


class MissingDatabaseError(UnavailableError):
    """The database (a table, a file) does not exist, and opening it read-only does not make it."""


class StorageFullError(BackendError):
    """The database has no room left for the write (a full disk, LMDB map or Redis maxmemory)."""


class ValueTooLargeError(BackendError):
    """A value larger than the database can hold in one record (checked before it is sent)."""


class ReadOnlyError(BackendError):
    """A write was attempted on a driver opened read-only."""


class InvalidKeyError(BackendError, ValueError):
    """A key that the database cannot hold exactly (empty, or not encodable as UTF-8)."""


class KeyTooLongError(InvalidKeyError):
    """A key longer than the database can hold: the path is too long."""


class DriverNotFoundError(BackendError, LookupError):
    """No driver is registered for a URL's scheme, or its dependency is not installed."""

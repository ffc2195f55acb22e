"""The errors of the fsspec filesystems as fsspec's callers expect them: a missing key is
``FileNotFoundError``, a write to a read-only database ``PermissionError`` (``EROFS``), a bad URL
or option ``ValueError``; each one line, without the driver's traceback chained to it, and
without the password, whatever a driver's message held."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

from zarrfs.backends.base import BackendError, DriverNotFoundError, MissingDatabaseError
from zarrfs.backends.errors import InvalidKeyError, ReadOnlyError
from zarrfs.format.errors import FormatError
from zarrfs.urls import MountFailure


def read_only(where: str) -> PermissionError:
    """The error of a write to a database opened or served read-only."""
    return PermissionError(errno.EROFS, f"{where} is read-only")


@contextmanager
def translated(where: str, password: str | None) -> Iterator[None]:
    """Raise what the block raised from a driver as fsspec's callers expect it."""

    def text(exc: BaseException) -> str:
        words = str(exc)
        if password:
            for secret in {password, quote(password, safe="")}:
                words = words.replace(secret, "****")
        return words

    try:
        yield
    except ReadOnlyError as exc:
        raise PermissionError(errno.EROFS, f"{where} is read-only: {text(exc)}") from None
    except MissingDatabaseError as exc:
        raise FileNotFoundError(errno.ENOENT, text(exc)) from None
    except (DriverNotFoundError, InvalidKeyError, MountFailure, FormatError) as exc:
        raise ValueError(text(exc)) from None
    except BackendError as exc:  # its own type, its words cleaned, its driver frames dropped
        exc.args = (text(exc),)
        raise exc.with_traceback(None) from None

"""The driver interface: the smallest transactional key/value API the filesystem needs.

Contract (every driver honours it; ``tests/test_backends.py`` checks it against each one):

* Two key spaces. ``DATA`` holds the Zarr keys and their values exactly as zarr-python 2's
  ``LMDBStore`` / ``SQLiteStore`` / ``RedisStore`` hold them. ``SIDE`` holds the filesystem's
  bookkeeping (mtimes, modes, empty folders, symlinks) somewhere those classes never list or
  delete. Side data is advisory: it never makes a Zarr key appear or vanish.
* Keys are ``str``. They are stored as their UTF-8 bytes; a key that cannot be encoded
  (lone surrogates) or is empty raises :class:`InvalidKeyError`, never a mangled key.
  Order is the byte order of the UTF-8 encoding, which equals Python's ``str`` order.
* Values are bytes-like. ``put`` accepts ``bytes``, ``bytearray``, ``memoryview`` or any object
  with the buffer protocol (an ``mmap`` of a spill file, so a huge value need not be copied into
  RAM first). Reads return ``bytes``.
* All access goes through a :class:`Txn` obtained from :meth:`Driver.transact` (or the one-shot
  helpers on :class:`Driver` that wrap it). A transaction sees its own writes. When the function
  returns, the transaction commits; when it raises, nothing it wrote is kept. Retryable
  failures (write conflicts, a busy database) rerun the function, a bounded number of times,
  after a jittered exponential back-off; the function must therefore have no side effects
  outside the transaction.
* ``scan(start, stop)`` yields ``(key, x)`` pairs for ``start <= key < stop`` in key order,
  where ``x`` is ``None`` (``fetch=KEYS``), the value's size (``SIZES``) or the value
  (``VALUES``). The iterator is valid only inside its transaction.
* Errors are the exception classes below, so one table (``zarrfs.fs.errors``) maps them to errno.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

DATA = "data"
SIDE = "side"

KEYS = "keys"
SIZES = "sizes"
VALUES = "values"

T = TypeVar("T")


class BackendError(Exception):
    """Base class of every error a driver raises."""


class RetryableError(BackendError):
    """A conflict or a busy database: running the transaction again may succeed."""


class UnavailableError(BackendError):
    """The database cannot be reached (a dead Redis, a vanished file)."""


class StorageFullError(BackendError):
    """The database has no room left for the write (a full disk, LMDB map or Redis maxmemory)."""


class ReadOnlyError(BackendError):
    """A write was attempted on a driver opened read-only."""


class InvalidKeyError(BackendError, ValueError):
    """A key that the database cannot hold exactly (empty, or not encodable as UTF-8)."""


class KeyTooLongError(InvalidKeyError):
    """A key longer than the database can hold (LMDB's 511 bytes): the path is too long."""


class DriverNotFoundError(BackendError, LookupError):
    """No driver is registered for a URL's scheme, or its dependency is not installed."""


def encode_key(key: str) -> bytes:
    """Return the UTF-8 bytes of ``key``; raise :class:`InvalidKeyError` if it has none."""
    if not key:
        raise InvalidKeyError("empty key")
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"key {key!r} is not valid UTF-8") from exc


def prefix_stop(prefix: str) -> str | None:
    """Return the smallest string greater than every string starting with ``prefix``.

    ``scan(prefix, prefix_stop(prefix))`` then yields exactly the keys under ``prefix``;
    ``None`` means "no upper bound" (an empty prefix).
    """
    while prefix:
        last = prefix[-1]
        if ord(last) < 0x10FFFF:
            nxt = chr(ord(last) + 1)
            if 0xD800 <= ord(nxt) <= 0xDFFF:  # skip the surrogate block, which UTF-8 cannot hold
                nxt = "\ue000"
            return prefix[:-1] + nxt
        prefix = prefix[:-1]
    return None


class Txn(ABC):
    """One transaction: reads see the transaction's own writes; see the module docstring."""

    @abstractmethod
    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key``, or ``None`` when it does not exist."""

    def size(self, key: str, space: str = DATA) -> int | None:
        """Return the length of the value of ``key`` (``None`` if absent), without fetching it
        where the database allows."""
        value = self.get(key, space)
        return None if value is None else len(value)

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """Return ``length`` bytes of the value of ``key`` from ``offset`` (fewer at its end)."""
        value = self.get(key, space)
        return None if value is None else bytes(value[offset : offset + length])

    @abstractmethod
    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """Set ``key`` to the bytes of ``value`` (any buffer-protocol object). The caller
        leaves ``value`` unchanged until the transaction ends: a driver may send it then."""

    @abstractmethod
    def delete(self, key: str, space: str = DATA) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    @abstractmethod
    def scan(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: str = DATA,
        fetch: str = KEYS,
        limit: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(key, x)`` for ``start <= key < stop`` in key order (``stop=None``: no bound);
        ``x`` is ``None``, the size or the value according to ``fetch``; at most ``limit``."""

    def read_many(self, requests: Sequence[tuple[str, str, str]]) -> list[Any]:
        """Answer several independent reads together: one round trip where the database is
        remote. Each request is ``(op, key, space)``: ``"size"`` gives the value's size or
        ``None``, ``"get"`` the value or ``None``, ``"prefix"`` whether any key starts with
        ``key``. This default answers them one by one."""
        out: list[Any] = []
        for op, key, space in requests:
            if op == "size":
                out.append(self.size(key, space))
            elif op == "get":
                out.append(self.get(key, space))
            elif op == "prefix":
                out.append(next(iter(self.scan_prefix(key, space=space, limit=1)), None) is not None)
            else:
                raise ValueError(f"unknown read {op!r}")
        return out

    def scan_prefix(self, prefix: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """``scan`` of exactly the keys that start with ``prefix``."""
        return self.scan(prefix, prefix_stop(prefix), **kwargs)

    def exists(self, key: str, space: str = DATA) -> bool:
        """Return whether ``key`` exists."""
        return self.size(key, space) is not None


class Driver(ABC):
    """A key/value database seen through the :class:`Txn` API.

    Subclasses implement :meth:`_begin` (and may override the one-shot helpers with faster
    paths, which must behave exactly like the transactional ones). ``retryable`` lists the
    exception types that mean "run the transaction again"; drivers translate their database's
    own errors into the classes of this module.
    """

    #: URL schemes this driver serves, e.g. ``("lmdb",)``.
    schemes: tuple[str, ...] = ()
    #: Whether reads cost a round trip to a server (callers then batch what they can).
    remote = False
    #: Whether one :meth:`Txn.read_many` costs about one read however many it holds (a round
    #: trip, one SQL statement): then callers ask for what they may need in one batch rather
    #: than in steps that stop early.
    batched = False
    #: How often :meth:`transact` runs a function that keeps failing with ``RetryableError``.
    max_attempts = 10
    #: First back-off in seconds; doubles each attempt, with full jitter.
    backoff = 0.005

    def __init__(self, url: str, readonly: bool = False) -> None:
        self.url = url
        self.readonly = readonly

    @abstractmethod
    def _begin(self, write: bool) -> AbstractContextManager[Txn]:
        """Return a context manager yielding a :class:`Txn` that commits on a normal exit and
        rolls back when the block raises."""

    def transact(self, fn: Callable[[Txn], T], write: bool = True) -> T:
        """Run ``fn(txn)`` in one transaction and return its result; commit on success, roll
        back on error, rerun on :class:`RetryableError` with bounded, jittered back-off."""
        if write and self.readonly:
            raise ReadOnlyError(f"{self.url} is opened read-only")
        delay = self.backoff
        for attempt in range(self.max_attempts):
            try:
                with self._begin(write) as txn:
                    return fn(txn)
            except RetryableError:
                if attempt == self.max_attempts - 1:
                    raise
                time.sleep(random.uniform(0, delay))
                delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable")

    # One-shot helpers: each is one transaction. Drivers may override them with faster paths.
    def get(self, key: str, space: str = DATA) -> bytes | None:
        """One-shot :meth:`Txn.get`."""
        return self.transact(lambda t: t.get(key, space), write=False)

    def size(self, key: str, space: str = DATA) -> int | None:
        """One-shot :meth:`Txn.size`."""
        return self.transact(lambda t: t.size(key, space), write=False)

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """One-shot :meth:`Txn.read`."""
        return self.transact(lambda t: t.read(key, offset, length, space), write=False)

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """One-shot :meth:`Txn.put`."""
        self.transact(lambda t: t.put(key, value, space))

    def delete(self, key: str, space: str = DATA) -> None:
        """One-shot :meth:`Txn.delete`."""
        self.transact(lambda t: t.delete(key, space))

    def scan(self, start: str = "", stop: str | None = None, **kwargs: Any) -> list[tuple[str, Any]]:
        """One-shot :meth:`Txn.scan`, returned as a list (bound it with ``limit``)."""
        return self.transact(lambda t: list(t.scan(start, stop, **kwargs)), write=False)

    def sync(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Make every committed transaction durable (``fsync`` of a file calls this).

        Drivers may commit without forcing data to disk (as zarr-python's ``LMDBStore`` does) as
        long as a crash of the process never corrupts the database; this is the barrier."""

    def statfs(self) -> dict[str, int] | None:
        """Return ``{"total": bytes, "free": bytes}`` for the storage behind the database, or
        ``None`` when it cannot be known."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release the database; the driver is unusable afterwards."""

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

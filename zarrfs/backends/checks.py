"""The vocabulary of the driver interface and the checks of its arguments: key spaces, fetch
modes, batch read requests, keys and scan bounds. :class:`~zarrfs.backends.base.Txn` runs
these checks once, above the drivers."""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple

from .errors import InvalidKeyError, KeyTooLongError


class Space(str, Enum):
    """A key space. A ``str`` too, so the plain names ``"data"`` and ``"side"`` still work.

    ``PARTS`` holds values written once and never changed (the parts of large files): read by
    key and range, deleted, listed only by a check for orphans. A driver stores them among its
    ``SIDE`` keys (the same key in ``SIDE``) unless it keeps them apart (``Txn.spaces``): a
    Redis Cluster spreads them over every slot."""

    DATA = "data"
    SIDE = "side"
    PARTS = "parts"

    def __str__(self) -> str:  # the name a message or a table shows, not "Space.DATA"
        return str.__str__(self)


class Fetch(str, Enum):
    """What a scan yields with each key: nothing, the value's size or the value."""

    KEYS = "keys"
    SIZES = "sizes"
    VALUES = "values"

    def __str__(self) -> str:
        return str.__str__(self)


DATA = Space.DATA
SIDE = Space.SIDE
PARTS = Space.PARTS
KEYS = Fetch.KEYS
SIZES = Fetch.SIZES
VALUES = Fetch.VALUES

# Both lookups accept an enum member or its plain string (equal and of equal hash). SPACES is
# what a driver's primitives receive: PARTS folded into SIDE; OWN_SPACES keeps PARTS apart.
OWN_SPACES: dict[Any, Space] = {s: s for s in Space}
SPACES: dict[Any, Space] = {**OWN_SPACES, PARTS: SIDE}
FETCHES: dict[Any, Fetch] = {f: f for f in Fetch}


# -- batch reads -----------------------------------------------------------------------------------


class Size(NamedTuple):
    """A :meth:`Txn.read_many` request: the size of ``key``'s value, or ``None`` if absent."""

    key: str
    space: Space = DATA


class Get(NamedTuple):
    """A :meth:`Txn.read_many` request: the value of ``key``, or ``None`` if absent."""

    key: str
    space: Space = DATA


class HasPrefix(NamedTuple):
    """A :meth:`Txn.read_many` request: whether any key starts with ``prefix``."""

    prefix: str
    space: Space = DATA


Read = Size | Get | HasPrefix
READS = {Size, Get, HasPrefix}  # the request types, to tell them from anything else
# The older spelling, ("size" | "get" | "prefix", key, space), still accepted by read_many.
_LEGACY_READS = {"size": Size, "get": Get, "prefix": HasPrefix}


def legacy_read(request: Any) -> Read:
    """The typed request for an ``(op, key, space)`` tuple; ``ValueError`` for anything else."""
    try:
        op, key, space = request
        kind = _LEGACY_READS[op]
    except (TypeError, ValueError, KeyError):
        raise ValueError(f"unknown read {request!r}") from None
    return kind(key, space)


# -- the checks ------------------------------------------------------------------------------------


def encode_key(key: str, max_key: int | None = None) -> bytes:
    """Return the UTF-8 bytes of ``key``; raise :class:`InvalidKeyError` if it has none, or more
    than ``max_key`` of them."""
    if not key:
        raise InvalidKeyError("empty key")
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"key {key!r} is not valid UTF-8") from exc
    if max_key is not None and len(raw) > max_key:
        raise KeyTooLongError(f"key of {len(raw)} bytes is longer than the database's {max_key}")
    return raw


def encode_bound(bound: str) -> bytes:
    """Encode a scan bound; ``""`` is a valid bound (unlike a key)."""
    try:
        return bound.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"scan bound {bound!r} is not valid UTF-8") from exc


def check_space(space: Any, spaces: dict[Any, Space] = SPACES) -> Space:
    """Return the :class:`Space` that ``space`` names among ``spaces`` (PARTS as SIDE by
    default); ``ValueError`` when it names none."""
    try:
        return spaces[space]
    except (KeyError, TypeError):
        raise ValueError(f"unknown key space {space!r}") from None


def check_fetch(fetch: Any) -> Fetch:
    """Return the :class:`Fetch` mode that ``fetch`` names; ``ValueError`` when it names none."""
    try:
        return FETCHES[fetch]
    except (KeyError, TypeError):
        raise ValueError(f"unknown fetch mode {fetch!r}") from None


def as_buffer(value: Any) -> bytes | memoryview:
    """Return ``value`` as ``bytes`` or a flat byte ``memoryview``, copying only when the object
    is not contiguous (an ``mmap`` of a spill file stays uncopied)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        # str has no buffer protocol, but a clear message beats memoryview's TypeError.
        raise TypeError("values must be bytes-like, not str")
    view = memoryview(value)
    if view.format == "B" and view.ndim == 1 and view.contiguous:
        return view
    if view.c_contiguous:
        return view.cast("B")
    return view.tobytes()


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


def bytes_stop(prefix: bytes) -> bytes | None:
    """:func:`prefix_stop` on bytes: the smallest byte string above every one starting with
    ``prefix`` (``None``: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])

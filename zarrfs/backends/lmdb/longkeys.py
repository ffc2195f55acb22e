"""Keys longer than LMDB's key limit, held where they fit: the LMDB driver's long-key store.

LMDB refuses keys over ``env.max_key_size()`` (511 bytes); a path may take 4,096. A key that fits
stays as it is. A longer one, of either space, goes to the side environment (every record of the
data environment is a key to ``LMDBStore.keys()``) under the prefix 0xFE, which no UTF-8 key
starts with (``feed``'s change log is 0xFF), as two records: the name ``0xFE tag "k" <first PREFIX
bytes of the key> <digest>``, holding the value's size (8 bytes, big-endian) and the whole key
(scans and sizes read these only), and the value ``0xFE tag "v" <digest>``. ``tag`` is ``d`` or
``s`` (the space); the digest is BLAKE2b-256 (a name is 475 bytes). Names sort by the first
:data:`PREFIX` bytes, then digest: a scan sorts each group sharing those bytes by the whole key
(:func:`rows`, one group in memory), merges it with the environment's keys, and looks once per
transaction whether the space has long keys. The values share the side map (``maps``; past its
bound, :class:`StorageFullError`). Writes go through the side transaction, which records what it
overwrote (``before``), so a long key shares its transaction's outcome.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

import lmdb

from ..base import DATA, KEYS, SIZES, Fetch, Space

#: The first byte of every record of the store (no UTF-8 text holds 0xFE).
MARK = b"\xfe"
#: Bytes of a key that its name's key holds in the clear: what orders the names.
PREFIX = 440
_SIZE = struct.Struct(">Q")


def _area(space: Space, kind: bytes) -> bytes:
    return MARK + (b"d" if space is DATA else b"s") + kind


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=32).digest()


def name_key(raw: bytes, space: Space) -> bytes:
    """The key of the record naming ``raw`` (its size and the whole key)."""
    return _area(space, b"k") + raw[:PREFIX] + _digest(raw)


def value_key(raw: bytes, space: Space) -> bytes:
    """The key of the record holding ``raw``'s value."""
    return _area(space, b"v") + _digest(raw)


def value(side: lmdb.Transaction | None, raw: bytes, space: Space) -> Any:
    """The value of ``raw`` (a buffer when the transaction has ``buffers=True``), or None."""
    return None if side is None else side.get(value_key(raw, space))


def size(side: lmdb.Transaction | None, raw: bytes, space: Space) -> int | None:
    """The size of ``raw``'s value, from its name (the value is not touched), or None."""
    if side is None:
        return None
    name = side.get(name_key(raw, space))
    return None if name is None else _SIZE.unpack_from(name)[0]


def _remember(side: lmdb.Transaction, key: bytes, before: dict[bytes, bytes | None]) -> None:
    # What to put back if the data commit fails (a copy of the old value: a rewrite of a large
    # value under a long key holds both in memory until the commit).
    if key not in before:
        old = side.get(key)
        before[key] = None if old is None else bytes(old)


def put(
    side: lmdb.Transaction, raw: bytes, data: Any, space: Space, before: dict[bytes, bytes | None]
) -> None:
    """Set ``raw`` to ``data`` in the write transaction ``side``; ``before`` keeps what the two
    records held before this transaction first changed them (None: absent)."""
    name, held = name_key(raw, space), value_key(raw, space)
    _remember(side, name, before)
    _remember(side, held, before)
    side.put(name, _SIZE.pack(len(data)) + raw)
    side.put(held, data)


def delete(side: lmdb.Transaction, raw: bytes, space: Space, before: dict[bytes, bytes | None]) -> bool:
    """Remove ``raw``; whether it was there."""
    name = name_key(raw, space)
    if side.get(name) is None:
        return False
    held = value_key(raw, space)
    _remember(side, name, before)
    _remember(side, held, before)
    side.delete(name)
    side.delete(held)
    return True


def any_in(side: lmdb.Transaction | None, space: Space) -> bool:
    """Whether the store holds any key of ``space`` (one seek)."""
    if side is None:
        return False
    area = _area(space, b"k")
    with side.cursor() as cur:
        return cur.set_range(area) and bytes(cur.key()).startswith(area)


class Presence:
    """Whether a space has long keys, kept per snapshot of the side environment: a read
    transaction of a snapshot already looked at asks no cursor (a lookup's prefix misses)."""

    def __init__(self) -> None:
        self._seen: dict[Space, tuple[int, bool]] = {}

    def any_in(self, side: lmdb.Transaction | None, space: Space, write: bool) -> bool:
        """:func:`any_in` of ``side``. A write transaction is answered with what was seen of
        the snapshot it follows (its id less one), before any write of its own: a long key it
        puts is counted by the transaction itself (``LMDBTxn._put_long``), one it deletes may
        leave a "yes" that finds nothing; what it sees itself is not kept."""
        if side is None:
            return False
        sid = side.id()
        seen = self._seen.get(space)
        if seen is not None and seen[0] == (sid - 1 if write else sid):
            return seen[1]
        found = any_in(side, space)
        if not write:
            self._seen[space] = (sid, found)
        return found

    def committed(self, sid: int, changed: dict[bytes, None]) -> None:
        """This process committed the side snapshot ``sid`` with a write transaction that
        changed the long keys ``changed``. What was seen of the snapshot it followed (``sid -
        1``: no other writer came between) holds for it when it changed none: the next lookup
        asks no cursor (a lookup after each close of a file written here)."""
        seen = self._seen
        if changed:
            seen.clear()
            return
        for space, (at, found) in tuple(seen.items()):
            if at == sid - 1:
                seen[space] = (sid, found)


def has_prefix(side: lmdb.Transaction | None, raw: bytes, space: Space) -> bool:
    """Whether a long key of ``space`` starts with ``raw``."""
    if side is None:
        return False
    area = _area(space, b"k")
    start = area + raw[:PREFIX]
    with side.cursor() as cur:
        found = cur.set_range(start)
        while found:
            if not bytes(cur.key()).startswith(start):
                return False
            if len(raw) <= PREFIX or bytes(cur.value()[_SIZE.size :]).startswith(raw):
                return True
            found = cur.next()
    return False


def rows(
    side: lmdb.Transaction, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch
) -> Iterator[tuple[bytes, Any]]:
    """Yield ``(key, x)`` for the long keys of ``space`` in ``[lo, hi)`` in byte order of the
    whole keys; ``x`` as ``fetch`` asks. The caller must not write while it pulls."""
    area = _area(space, b"k")
    start = len(area)
    top = None if hi is None else hi[:PREFIX]
    group: list[tuple[bytes, int]] = []
    shared = None  # the first PREFIX bytes the keys of ``group`` share
    with side.cursor() as cur:
        found = cur.set_range(area + lo[:PREFIX])
        while found:
            key = bytes(cur.key())
            if not key.startswith(area):
                break
            head = key[start : start + PREFIX]
            if top is not None and head > top:
                break  # every key from here on is at or above hi
            if head != shared:
                yield from _sorted(side, group, space, fetch)
                group, shared = [], head
            name = cur.value()
            raw = bytes(name[_SIZE.size :])
            if raw >= lo and (hi is None or raw < hi):
                group.append((raw, _SIZE.unpack_from(name)[0]))
            found = cur.next()
        yield from _sorted(side, group, space, fetch)


def _sorted(
    side: lmdb.Transaction, group: list[tuple[bytes, int]], space: Space, fetch: Fetch
) -> Iterator[tuple[bytes, Any]]:
    group.sort()
    for raw, n in group:
        if fetch is KEYS:
            yield raw, None
        elif fetch is SIZES:
            yield raw, n
        else:
            yield raw, bytes(side.get(value_key(raw, space)))

"""An in-process driver for tests: ``memory://`` (a fresh store) or ``memory://name`` (one store
per name and process, shared by every driver opened with that name).

Keys are kept sorted (``bisect``); a transaction holds the store's lock from start to end, writes
in place and keeps an undo log, which it replays when the transaction raises.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._util import as_buffer, empty_range, encode_bound
from .base import DATA, KEYS, SIDE, SIZES, Driver, ReadOnlyError, Txn, encode_key


class _Space:
    """One key space: a sorted key list plus a dict of values, keyed by the UTF-8 bytes."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: dict[bytes, bytes] = {}

    def set(self, key: bytes, value: bytes | None) -> None:
        """Set ``key`` to ``value``, or remove it when ``value`` is ``None``."""
        if value is None:
            if self.values.pop(key, None) is not None:
                del self.keys[bisect.bisect_left(self.keys, key)]
        else:
            if key not in self.values:
                bisect.insort(self.keys, key)
            self.values[key] = value


class _Store:
    """The shared state behind every driver opened on one ``memory://name``."""

    def __init__(self) -> None:
        # Reentrant so that a transaction function may use the driver's one-shot helpers.
        self.lock = threading.RLock()
        self.spaces = {DATA: _Space(), SIDE: _Space()}


_named: dict[str, _Store] = {}
_named_lock = threading.Lock()


def _space_of(store: _Store, space: str) -> _Space:
    try:
        return store.spaces[space]
    except KeyError:
        raise ValueError(f"unknown key space {space!r}") from None


class MemoryTxn(Txn):
    """A transaction on a :class:`_Store`; see the module docstring."""

    def __init__(self, store: _Store, write: bool) -> None:
        self._store = store
        self._write = write
        self.undo: list[tuple[_Space, bytes, bytes | None]] = []

    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key`` or ``None``."""
        return _space_of(self._store, space).values.get(encode_key(key))

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """Set ``key`` (copying the value: the caller may reuse its buffer)."""
        self._change(space, encode_key(key), bytes(as_buffer(value)))

    def delete(self, key: str, space: str = DATA) -> None:
        """Remove ``key`` if present."""
        self._change(space, encode_key(key), None)

    def _change(self, space: str, key: bytes, value: bytes | None) -> None:
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        sp = _space_of(self._store, space)
        self.undo.append((sp, key, sp.values.get(key)))
        sp.set(key, value)

    def scan(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: str = DATA,
        fetch: str = KEYS,
        limit: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield keys of ``[start, stop)`` in order; tolerates writes made while iterating."""
        sp = _space_of(self._store, space)
        lo, hi = encode_bound(start), encode_bound(stop)
        if empty_range(lo, hi, limit):
            return
        count = 0
        # Re-locate the position after every yield so the caller may change the store meanwhile.
        i = bisect.bisect_left(sp.keys, lo)
        while i < len(sp.keys):
            key = sp.keys[i]
            if hi is not None and key >= hi:
                return
            value = sp.values[key]
            x = None if fetch == KEYS else len(value) if fetch == SIZES else value
            yield key.decode("utf-8"), x
            count += 1
            if limit is not None and count >= limit:
                return
            i = bisect.bisect_right(sp.keys, key)


class MemoryDriver(Driver):
    """Driver for ``memory://`` URLs; see the module docstring."""

    schemes = ("memory",)

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        name = url.split("://", 1)[1] if "://" in url else ""
        name = name.strip("/")
        if not name:
            self._store = _Store()
        else:
            with _named_lock:
                self._store = _named.setdefault(name, _Store())

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        with self._store.lock:
            txn = MemoryTxn(self._store, write)
            try:
                yield txn
            except BaseException:
                for sp, key, old in reversed(txn.undo):
                    sp.set(key, old)
                raise


def forget(name: str) -> None:
    """Drop the named store (tests use it to start from scratch)."""
    with _named_lock:
        _named.pop(name, None)


__all__ = ["MemoryDriver", "forget"]

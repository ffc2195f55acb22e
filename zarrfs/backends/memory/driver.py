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
from urllib.parse import parse_qsl

from ..base import DATA, KEYS, SIDE, SIZES, Driver, Fetch, Space, Txn
from ..urloptions import check_options
from .about import ABOUT


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


class MemoryTxn(Txn):
    """A transaction on a :class:`_Store`; see the module docstring."""

    def __init__(self, store: _Store, write: bool, where: str) -> None:
        super().__init__(write, where)
        self._store = store
        self.undo: list[tuple[_Space, bytes, bytes | None]] = []

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        return self._store.spaces[space].values.get(raw)

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        self._change(space, raw, bytes(value))  # a copy: the caller may reuse its buffer

    def _delete(self, raw: bytes, space: Space) -> None:
        self._change(space, raw, None)

    def _change(self, space: Space, key: bytes, value: bytes | None) -> None:
        sp = self._store.spaces[space]
        self.undo.append((sp, key, sp.values.get(key)))
        sp.set(key, value)

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        sp = self._store.spaces[space]
        # Re-locate the position after every yield so the caller may change the store meanwhile.
        i = bisect.bisect_left(sp.keys, lo)
        while i < len(sp.keys):
            key = sp.keys[i]
            if hi is not None and key >= hi:
                return
            value = sp.values[key]
            yield key, None if fetch is KEYS else len(value) if fetch is SIZES else value
            i = bisect.bisect_right(sp.keys, key)


class MemoryDriver(Driver):
    """Driver for ``memory://`` URLs; see the module docstring."""

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        name, _, query = (url.split("://", 1)[1] if "://" in url else "").partition("?")
        check_options(url, dict(parse_qsl(query, keep_blank_values=True)), set(ABOUT.options))
        name = name.strip("/")
        if not name:
            self._store = _Store()
        else:
            with _named_lock:
                self._store = _named.setdefault(name, _Store())

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        with self._store.lock:
            txn = MemoryTxn(self._store, write, self.url)
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

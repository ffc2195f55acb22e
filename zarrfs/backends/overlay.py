"""A transaction that keeps its writes to itself until it commits, over a store that has no
transactions of its own (a zip archive, an Icechunk session): reads see the transaction's writes
first, then the store; a commit hands the writes to the driver in one call, a transaction that
raises leaves the store untouched.

A driver using it provides ``index(space)`` (the :class:`KeyIndex` of a key space, whose
``info`` is a value or its size), ``load(raw, space)`` (a value, or None), and
``apply(writes)`` (store ``{(space, raw): value or DELETED}``, keeping the index right). The
driver's lock is held from the start of the transaction to its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import KEYS, SIZES, Fetch, Space, Txn
from .buffered import DELETED, merge_buffered


class OverlayTxn(Txn):
    """One transaction over a store without transactions; see the module docstring."""

    def __init__(self, driver: Any, write: bool) -> None:
        super().__init__(write, driver.where, driver.max_key_size)
        self._driver = driver
        self.writes: dict[tuple[Space, bytes], Any] = {}

    def __enter__(self) -> OverlayTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None and self.writes:
            self._driver.apply(self.writes)

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        pending = self.writes.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else bytes(pending)
        return self._driver.load(raw, space)

    def _size(self, raw: bytes, space: Space) -> int | None:
        pending = self.writes.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else len(pending)
        return self._driver.size_of(raw, space)

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        self.writes[(space, raw)] = bytes(value)  # a copy: the caller may reuse its buffer

    def _delete(self, raw: bytes, space: Space) -> None:
        self.writes[(space, raw)] = DELETED

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        driver = self._driver

        def stored() -> Iterator[tuple[bytes, Any]]:
            for key, _ in driver.index(space).range(lo, hi):
                if fetch is KEYS:
                    yield key, None
                elif fetch is SIZES:
                    yield key, driver.size_of(key, space)
                else:
                    yield key, driver.load(key, space)

        mine = sorted(
            (raw, x)
            for (sp, raw), x in self.writes.items()
            if sp == space and raw >= lo and (hi is None or raw < hi)
        )
        buffered = [
            (raw, x if x is DELETED or fetch not in (KEYS, SIZES) else (None if fetch is KEYS else len(x)))
            for raw, x in mine
        ]
        return merge_buffered(stored(), buffered, limit)


__all__ = ["OverlayTxn"]

"""The keys of a store that cannot list a range in order (a zip archive's directory, an Icechunk
session), kept sorted in memory with what is known of each (its size, or its value).

Built once when the driver opens and changed only by the driver's own commits: the stores it
serves change under no one else's hand (an archive is read-only, an Icechunk session sees its
own writes and no one else's).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any


class KeyIndex:
    """Sorted UTF-8 keys, each with one piece of information (a size, a value, a zip entry)."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.info: dict[bytes, Any] = {}

    def set(self, key: bytes, info: Any) -> None:
        """Add ``key`` (or replace what is known of it)."""
        if key not in self.info:
            bisect.insort(self.keys, key)
        self.info[key] = info

    def remove(self, key: bytes) -> None:
        """Drop ``key`` if present."""
        if key in self.info:
            del self.info[key]
            del self.keys[bisect.bisect_left(self.keys, key)]

    def range(self, lo: bytes, hi: bytes | None) -> Iterator[tuple[bytes, Any]]:
        """``(key, info)`` for ``lo <= key < hi`` in order; the index may change between two
        pulls (the position is found again after each)."""
        keys = self.keys
        i = bisect.bisect_left(keys, lo)
        while i < len(keys):
            key = keys[i]
            if hi is not None and key >= hi:
                return
            yield key, self.info.get(key)
            i = bisect.bisect_right(keys, key)

    def __len__(self) -> int:
        return len(self.keys)


__all__ = ["KeyIndex"]

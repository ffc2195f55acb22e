"""A transaction's writes buffered until its commit (Redis, the overlay, the archive drivers):
:data:`DELETED` marks a key it deleted, :func:`merge_buffered` lets its own scans read its
writes back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def merge_buffered(
    stored: Iterator[tuple[bytes, Any]],
    buffered: list[tuple[bytes, Any]],
    limit: int | None,
) -> Iterator[tuple[bytes, Any]]:
    """Merge a key-ordered stream from the database with a transaction's own pending writes
    (sorted ``(key, x)`` pairs where ``x is DELETED`` hides the key), so a transaction that
    buffers its writes still reads them back; stops after ``limit`` results."""
    count = 0
    i = 0
    for key, x in stored:
        while i < len(buffered) and buffered[i][0] < key:
            if buffered[i][1] is not DELETED:
                yield buffered[i]
                count += 1
                if limit is not None and count >= limit:
                    return
            i += 1
        if i < len(buffered) and buffered[i][0] == key:
            pending = buffered[i]
            i += 1
            if pending[1] is DELETED:
                continue
            key, x = pending
        yield key, x
        count += 1
        if limit is not None and count >= limit:
            return
    for key, x in buffered[i:]:
        if x is not DELETED:
            yield key, x
            count += 1
            if limit is not None and count >= limit:
                return


class _Deleted:
    """Marker of a key deleted inside a transaction that has not committed yet."""

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()

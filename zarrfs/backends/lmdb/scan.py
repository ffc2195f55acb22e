"""Scans of the LMDB driver: an environment's own keys merged with the long-key store's.

A scan of a space yields, in byte order, the keys its environment holds (those that fit LMDB's
key limit, :func:`cursor_rows`) and the long keys of that space (``longkeys``, held in the side
environment), :func:`merged`; ``LMDBTxn._scan`` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from ..base import KEYS, SIZES, Fetch, Space
from . import pages

COUNT_EVERY = 1024  # rows between two counts of the pages a scan spanned
# A value from this size on lives on pages of its own (LMDB's overflow pages, over half a page
# of a node), which a scan does not read: its row spans its key and a node header.
SPANNED_VALUE = 2048


def cursor_rows(
    txn: lmdb.Transaction,
    lo: bytes,
    hi: bytes,
    fetch: Fetch,
    known: Callable[[bytes, Space], int | None],
    space: Space,
    driver: Any = None,
) -> Iterator[tuple[bytes, Any]]:
    """The keys of one environment in ``[lo, hi)``, with ``x`` as ``fetch`` asks (a size from
    ``known`` where it knows it); the caller does not write while it pulls.

    The pages a scan passes stay in the process's resident set like those a read copies: a
    small value lives in its key's leaf page, so listing a folder of a million 1 KB chunks
    maps a GiB. What the rows span (a key, and its value up to a page: a larger value lives
    on pages of its own, which a scan does not read) is counted for ``driver``'s
    :func:`pages.touched`, every :data:`COUNT_EVERY` rows and at the end."""
    spanned = rows = 0
    try:
        with txn.cursor() as cur:
            found = cur.set_range(lo) if lo else cur.first()
            while found:
                raw = bytes(cur.key())
                if raw >= hi:
                    return
                value = cur.value()
                n = len(value)
                if fetch is KEYS:
                    x = None
                elif fetch is SIZES:
                    x = known(raw, space)
                    if x is None:
                        x = n
                else:
                    x = bytes(value)
                spanned += len(raw) + (n if n < SPANNED_VALUE else 16)
                rows += 1
                if rows == COUNT_EVERY and driver is not None:
                    pages.touched(driver, spanned)
                    spanned = rows = 0
                yield raw, x
                found = cur.next()
    finally:
        if spanned and driver is not None:
            pages.touched(driver, spanned)


def merged(a: Iterator[tuple[bytes, Any]], b: Iterator[tuple[bytes, Any]]) -> Iterator[tuple[bytes, Any]]:
    """Merge two streams of rows in key order (no key is in both); closes both when done."""
    try:
        x, y = next(a, None), next(b, None)
        while x is not None and y is not None:
            if x[0] < y[0]:
                yield x
                x = next(a, None)
            else:
                yield y
                y = next(b, None)
        rest, last = (a, x) if x is not None else (b, y)
        if last is not None:
            yield last
            yield from rest
    finally:
        for rows in (a, b):
            close = getattr(rows, "close", None)
            if close is not None:
                close()

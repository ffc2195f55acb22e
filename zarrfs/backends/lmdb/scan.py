"""Scans of the LMDB driver: an environment's own keys merged with the long-key store's.

A scan of a space yields, in byte order, the keys its environment holds (those that fit LMDB's
key limit, :func:`cursor_rows`) and the long keys of that space (``longkeys``, held in the side
environment), :func:`merged`; ``LMDBTxn._scan`` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from ..base import KEYS, SIZES, Fetch
from . import pages

COUNT_EVERY = 1024  # rows a scan passes between two counts (pages.scanned)


def cursor_rows(
    txn: lmdb.Transaction,
    lo: bytes,
    hi: bytes,
    fetch: Fetch,
    known: Callable[[bytes], int | None] | None,
    driver: Any = None,
) -> Iterator[tuple[bytes, Any]]:
    """The keys of one environment in ``[lo, hi)``, with ``x`` as ``fetch`` asks (a size from
    ``known`` where it knows it; None: nothing does); the caller does not write while it pulls.

    The pages a scan passes stay in the process's resident set like those a read copies: a
    small value lives in its key's leaf page, so listing a folder of a million 1 KB chunks
    maps a GiB. The rows passed are counted for ``driver``'s :func:`pages.scanned`, which
    releases the maps' pages when they hold too much. A scan of keys never touches a value: a large one lives
    on pages of its own, which would then be read from disk."""
    rows = 0
    try:
        with txn.cursor() as cur:
            if not (cur.set_range(lo) if lo else cur.first()):
                return
            # The cursor's own iterator steps in C; it stays on the row it gave until the next
            # step, so a size nothing knew is read from that row's value.
            values = fetch is not KEYS and fetch is not SIZES
            for row in cur.iternext(keys=True, values=values):
                if values:  # the value past ``hi`` is fetched too: one row a scan
                    raw = bytes(row[0])
                    if raw >= hi:
                        return
                    x = bytes(row[1])
                else:
                    raw = bytes(row)
                    if raw >= hi:
                        return
                    if fetch is KEYS:
                        x = None
                    else:
                        x = None if known is None else known(raw)
                        if x is None:
                            x = len(cur.value())
                rows += 1
                if rows == COUNT_EVERY and driver is not None:
                    pages.scanned(driver, rows)
                    rows = 0
                yield raw, x
    finally:
        if rows and driver is not None:
            pages.scanned(driver, rows)


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

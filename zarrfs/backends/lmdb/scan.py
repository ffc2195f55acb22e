"""Scans of the LMDB driver: an environment's own keys merged with the long-key store's.

A scan of a space yields, in byte order, the keys its environment holds (those that fit LMDB's
key limit: :func:`cursor_page`, a list of rows read in one loop, which :func:`cursor_rows`
streams) and the long keys of that space (``longkeys``, held in the side environment),
:func:`merged`; ``LMDBTxn._scan`` and ``LMDBTxn._scan_rows`` run them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from ..base import KEYS, SIZES, Fetch
from . import pages
from .leaf import sizes_at

#: Rows a streaming scan reads at a time (:func:`cursor_rows`): one cursor, then a seek again.
PAGE = 256


def cursor_page(
    txn: lmdb.Transaction,
    lo: bytes,
    hi: bytes,
    fetch: Fetch,
    known: Callable[[bytes], int | None] | None,
    limit: int,
    driver: Any = None,
) -> list[tuple[bytes, Any]]:
    """Up to ``limit`` keys of one environment in ``[lo, hi)`` with ``x`` as ``fetch`` asks (a
    size from ``known`` where it knows it; None: nothing does), in one loop over the cursor's
    own iterator, which steps in C. The transaction's rows are buffers (memoryviews of the
    map): ``tobytes`` copies one in half the time ``bytes()`` takes.

    A scan of keys never reads a value, nor does a size: a large value lives on pages of its
    own, which would then be read from disk; its size is read from its key's leaf node
    (:mod:`.leaf`). The pages a
    scan passes stay in the process's resident set like those a read copies (a small value
    lives in its key's leaf page: listing a folder of a million 1 KB chunks maps a GiB), so the
    rows are counted for ``driver``'s :func:`pages.scanned`, which releases the maps' pages
    when they hold too much."""
    out: list[tuple[bytes, Any]] = []
    if limit <= 0:
        return out
    append = out.append
    with txn.cursor() as cur:
        if not (cur.set_range(lo) if lo else cur.first()):
            return out
        if fetch is KEYS:
            for row in cur.iternext(keys=True, values=False):
                raw = row.tobytes()
                if raw >= hi:
                    break
                append((raw, None))
                if len(out) == limit:
                    break
        elif fetch is SIZES:
            # Keys alone, their sizes from their leaf nodes at once (``leaf``): py-lmdb reads
            # every page of a value it returns; only a node that does not agree has its value
            # asked for (the rows are buffers of the transaction's pages: they stay).
            raws: list[bytes] = []
            views = []
            for row in cur.iternext(keys=True, values=False):
                raw = row.tobytes()
                if raw >= hi:
                    break
                raws.append(raw)
                views.append(row)
                if len(raws) == limit:
                    break
            sizes = sizes_at(views)
            if known is None and None not in sizes:
                out = list(zip(raws, sizes, strict=True))
            else:
                for raw, x in zip(raws, sizes, strict=True):
                    if known is not None and (k := known(raw)) is not None:
                        x = k
                    elif x is None:
                        value = txn.get(raw)
                        x = None if value is None else len(value)
                    append((raw, x))
        else:  # the value past ``hi`` is fetched too: one row a scan
            for row, value in cur.iternext(keys=True, values=True):
                raw = row.tobytes()
                if raw >= hi:
                    break
                append((raw, value.tobytes()))
                if len(out) == limit:
                    break
    if out and driver is not None:
        pages.scanned(driver, len(out))
    return out


def cursor_rows(
    txn: lmdb.Transaction,
    lo: bytes,
    hi: bytes,
    fetch: Fetch,
    known: Callable[[bytes], int | None] | None,
    driver: Any = None,
) -> Iterator[tuple[bytes, Any]]:
    """The keys of one environment in ``[lo, hi)``, streamed a :data:`PAGE` of rows at a time
    (:func:`cursor_page`, which counts them for ``driver``); the caller does not write while it
    pulls."""
    while True:
        rows = cursor_page(txn, lo, hi, fetch, known, PAGE, driver)
        yield from rows
        if len(rows) < PAGE:
            return
        lo = rows[-1][0] + b"\0"


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

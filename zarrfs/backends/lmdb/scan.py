"""Scans of the LMDB driver: an environment's own keys merged with the long-key store's.

A scan of a space yields, in byte order, the keys its environment holds (those that fit LMDB's
key limit) and the long keys of that space (``longkeys``, held in the side environment). The
two streams are merged; keys from 0xFE on are the long-key store's records and the change log
(``feed``), never keys, so a scan ends there.

The caller of a write transaction may write between two pulls. Cursors are not trusted after a
write: when the transaction wrote since the last pull, both streams are opened again after the
last key yielded (the keys a write added after it are then seen, the ones it removed are not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import lmdb

from ..base import KEYS, SIDE, SIZES, Fetch, Space
from . import longkeys, pages
from .environments import translate

if TYPE_CHECKING:
    from .driver import LMDBTxn


COUNT_EVERY = 1024  # rows between two counts of the pages a scan spanned
# A value from this size on lives on pages of its own (LMDB's overflow pages, over half a page
# of a node), which a scan does not read: its row spans its key and a node header.
SPANNED_VALUE = 2048


def scan(
    txn: LMDBTxn, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch
) -> Iterator[tuple[bytes, Any]]:
    """``Txn._scan`` for LMDB: ``(key, x)`` for the keys of ``space`` in ``[lo, hi)``."""
    if hi is None or hi > longkeys.MARK:
        hi = longkeys.MARK  # from 0xFE on: the long-key store and the change log, no keys
    try:
        own = txn._txn(space, False)
        long = txn._any_long(space)
        while True:
            writes = txn._writes
            rows: Iterator[tuple[bytes, Any]] = iter(())
            if own is not None:
                rows = cursor_rows(own, lo, hi, fetch, txn._known, space, txn._driver)
            if long:
                side = txn._txn(SIDE, False)
                assert side is not None
                rows = merged(rows, longkeys.rows(side, lo, hi, space, fetch))
            try:
                for raw, x in rows:
                    yield raw, x
                    if txn._writes != writes:
                        break  # the caller wrote while we were suspended: seek again after raw
                else:
                    return
            finally:
                close = getattr(rows, "close", None)
                if close is not None:
                    close()
            lo = raw + b"\0"
            long = long or txn._any_long(space)
            own = own or txn._txn(space, False)
    except lmdb.Error as exc:
        raise translate(exc, txn.where) from exc


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

"""The commit of an LMDB transaction: two environments, two commits, one outcome.

The side environment commits first, and the transaction keeps the side records it overwrote
(``LMDBTxn._side_before``: side keys, and the records of long keys of either space, see
``longkeys``); then the data commits. If the data commit fails (a full disk), the side
records are put back as they were and the error is raised: committed data implies committed
side data, and a failed commit leaves nothing new. The change log entry (``feed``) is put
in the side commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lmdb

from ..base import DATA, SIDE
from .environments import translate
from .feed import record
from .maps import gate

if TYPE_CHECKING:
    from .driver import LMDBTxn


def finish(txn: LMDBTxn, ok: bool) -> None:
    """Commit ``txn`` (side first, then data) when ``ok``, else abort both; a write transaction
    releases the driver's write lock either way, and the transaction leaves ``maps``'s
    gate."""
    try:
        if not txn.write:
            txn._data.abort()
            if txn._side is not None:
                txn._side.abort()
            return
        try:
            _finish(txn, ok)
        finally:
            txn._driver.write_lock.release()
    finally:
        gate.leave(txn)


def _abort(txn: LMDBTxn) -> None:
    side, txn._side = txn._side, None
    txn._data.abort()
    if side is not None:
        side.abort()


def _finish(txn: LMDBTxn, commit: bool) -> None:
    if not commit:
        _abort(txn)
        return
    driver = txn._driver
    try:
        logged = record(txn) if driver.log_changes else None
    except BaseException as exc:
        _abort(txn)
        if isinstance(exc, lmdb.Error):
            raise translate(exc, txn.where, SIDE) from exc
        raise
    side, txn._side = txn._side, None  # record() may have begun it
    try:
        if side is not None:
            side.commit()
    except BaseException as exc:
        txn._data.abort()
        if isinstance(exc, lmdb.Error):
            raise translate(exc, txn.where, SIDE) from exc
        raise
    try:
        txn._data.commit()
    except BaseException as exc:
        if txn._side_before:
            driver.side.restore(txn._side_before)
        if isinstance(exc, lmdb.Error):
            raise translate(exc, txn.where, DATA) from exc
        raise
    if txn._changes:
        driver.known.committed(txn._id + 1, txn._changes)
    if logged is not None:
        driver.own.add(logged)

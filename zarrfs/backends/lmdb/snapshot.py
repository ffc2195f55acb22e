"""The LMDB driver's held state (``-o snapshot``): a read transaction of the data environment
and of the side environment, begun at once and kept open for the life of the mount.

LMDB does not reuse a page an open reader may see, so while it is held every writer (in any
process) grows the file rather than reuse the pages freed since.
"""

from __future__ import annotations

from typing import Any

from ..base import SIDE
from ..errors import BackendError
from ..snapshot import HeldState

COST = "LMDB cannot reuse the pages this reader sees: writers grow the file instead"


def hold(driver: Any, name: str | None) -> HeldState:
    """Hold the state committed now in ``driver``'s environments (LMDB cannot name one)."""
    if name:
        raise BackendError(f"{driver.path}: LMDB cannot name a state; -o snapshot takes the one of now")
    txn = driver._begin(False)
    try:
        txn.exists("zarrfs-snapshot", SIDE)  # the side environment's state of now, not of its first use
    except BaseException as exc:
        txn.__exit__(type(exc), exc, exc.__traceback__)
        raise
    return HeldState(txn, lambda: txn.__exit__(None, None, None), COST)


__all__ = ["COST", "hold"]

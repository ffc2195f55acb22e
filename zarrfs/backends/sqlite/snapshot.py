"""The SQLite driver's held state (``-o snapshot``): a read transaction begun at once on the
calling thread's connection and kept open for the life of the mount.

In WAL mode writers go on, but no checkpoint copies the WAL past what this reader may see, so
the ``-wal`` file grows while it is held. In a rollback journal a held reader would stop
every writer: refused.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendError
from ..snapshot import HeldState

COST = "SQLite cannot checkpoint the WAL past this reader: the -wal file grows while it is held"


def hold(driver: Any, name: str | None) -> HeldState:
    """Hold the state committed now in ``driver``'s database (SQLite cannot name one)."""
    if name:
        raise BackendError(f"{driver.path}: SQLite cannot name a state; -o snapshot takes the one of now")
    if not driver.wal:
        raise BackendError(
            f"{driver.path}: not in WAL mode, where a held reader would stop every writer; "
            "mount it writable once (zarrfs turns WAL on) to hold a snapshot of it"
        )
    txn = driver._begin(False)
    txn.begin_now()
    # The snapshot starts at the first read after BEGIN: now, on the connection the txn uses.
    driver.conns.get().execute("SELECT count(*) FROM sqlite_master").fetchall()
    return HeldState(txn, lambda: txn.__exit__(None, None, None), COST)


__all__ = ["COST", "hold"]

"""The SQLite driver (``sqlite://``): :class:`SQLiteDriver` in ``driver``.

Its pieces: ``sql`` (statements and connections), ``checkpoint`` (WAL checkpoints in the
background), ``feed`` (the change log kept by triggers).
"""

from .driver import SQLiteDriver, SQLiteTxn

__all__ = ["SQLiteDriver", "SQLiteTxn"]

"""The PostgreSQL driver (``postgresql://``): :class:`PostgresDriver` in ``driver``.

Its pieces: ``txn`` (one transaction and its queue of statements), ``sql`` (statements),
``connection`` (waits bounded and interruptible), ``feed`` (``NOTIFY`` at each commit,
``LISTEN`` per mount).
"""

from .driver import PostgresDriver
from .txn import PostgresTxn

__all__ = ["PostgresDriver", "PostgresTxn"]

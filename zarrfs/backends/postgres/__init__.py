"""The PostgreSQL driver (``postgresql://``): :class:`PostgresDriver` in ``driver``.

Its pieces: ``sql`` (statements), ``connection`` (waits bounded and interruptible), ``feed``
(``NOTIFY`` at each commit, ``LISTEN`` per mount).
"""

from .driver import PostgresDriver, PostgresTxn

__all__ = ["PostgresDriver", "PostgresTxn"]

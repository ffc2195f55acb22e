"""The PostgreSQL driver (``postgresql://``): :class:`~.driver.PostgresDriver` in ``driver``,
declared in ``about``.

Its pieces: ``txn`` (one transaction and its queue of statements), ``sql`` (statements),
``connection`` (waits bounded and interruptible), ``feed`` (``NOTIFY`` at each commit,
``LISTEN`` per mount).
"""

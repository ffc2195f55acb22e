"""The SQLite driver (``sqlite://``): :class:`~.driver.SQLiteDriver` in ``driver``, declared in
``about``.

Its pieces: ``sql`` (statements and connections), ``checkpoint`` (WAL checkpoints in the
background), ``feed`` (the change log kept by triggers).
"""

"""The Redis driver (``redis://``, ``rediss://``, ``unix://``, ``valkey://``):
:class:`~.driver.RedisDriver` in ``driver``, declared in ``about``.

Its pieces: ``url`` (what a URL names, the names of the keys), ``link`` (connections), ``index``
(the listing index and its scans), ``commit`` (one ``MULTI``/``EXEC``), ``feed`` (client-side
caching invalidations). The Redis Cluster driver (``redis_cluster``) builds on them.
"""

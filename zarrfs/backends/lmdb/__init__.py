"""The LMDB driver (``lmdb://``, or a bare path): :class:`~.driver.LMDBDriver` in ``driver``,
declared in ``about`` (which imports neither the driver nor ``lmdb``).

The transaction (:class:`LMDBTxn`: reads, writes, scans, and the commit of two environments
with one outcome) and the driver live in ``driver``; its pieces: ``environments`` (the data and
side environments, error translation), ``maps`` (growing a full map), ``longkeys`` (keys over
LMDB's limit), ``scan`` (cursor rows and their merge), ``feed`` (the change log), ``holder``
(values read in place), ``pages`` (releasing the map's pages).
"""

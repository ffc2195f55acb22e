"""The LMDB driver (``lmdb://``, or a bare path): :class:`LMDBDriver` in ``driver``.

Its pieces: ``environments`` (the data and side environments, error translation), ``commit``
(two environments, one outcome), ``maps`` (growing a full map), ``longkeys`` (keys over LMDB's
limit), ``scan`` (scans merging both), ``feed`` (the change log), ``holder`` (values read in
place), ``pages`` (releasing the map's pages).
"""

from .driver import LMDBDriver, LMDBTxn

__all__ = ["LMDBDriver", "LMDBTxn"]

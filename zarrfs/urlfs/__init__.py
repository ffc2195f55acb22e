"""fsspec filesystems over zarrfs' drivers, so that a program reaches a database by the mount's
URL without a mount: ``zarr.open_group("lmdb:///data/x.lmdb")``,
``xarray.open_zarr("redis://host:6379/0?prefix=run1")``, ``fsspec.open(url)`` of one key.
The classes are registered in fsspec's entry-point group ``fsspec.specs``; see
:mod:`zarrfs.urlfs.filesystem` for what they hold and :mod:`zarrfs.urlfs.location` for the URLs.
"""

from .filesystem import DatabaseFileSystem
from .schemes import BY_SCHEME

__all__ = ["BY_SCHEME", "DatabaseFileSystem"]

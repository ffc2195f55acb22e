"""zarrfs: mount a key/value database as a folder that behaves like a Zarr DirectoryStore."""

__version__ = "0.1.0"

from zarrfs import compiled as _compiled

_compiled.install(__name__)


def copy(source, dest, **options):
    """Copy a hierarchy between folders, database URLs and zarr-python 3 stores, key for key
    (see :func:`zarrfs.tools.copy.copy`)."""
    from zarrfs.tools.copy import copy as run

    return run(source, dest, **options)

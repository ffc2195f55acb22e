"""zarrfs: mount a key/value database as a folder that behaves like a Zarr DirectoryStore."""

__version__ = "0.1.0"

"""The SQLite driver's declaration (``sqlite://``, or a bare path ending ``.zarrdb``, zarr-sqlite's
extension): :data:`ABOUT`, and what a SQLite database is on disk (:class:`SQLiteFiles`): one file
starting with SQLite's header string, its journal or WAL files beside it."""

from __future__ import annotations

import os

from ..about import About
from ..dbfiles import DatabaseFiles

#: The first 16 bytes of every SQLite database file.
MAGIC = b"SQLite format 3\0"


class SQLiteFiles(DatabaseFiles):
    """A SQLite database on disk; see the module docstring."""

    def holds(self, path: str) -> bool:
        return os.path.isfile(path) and self.head(path, 16) == MAGIC

    def written(self, path: str) -> tuple[str, list[str]]:
        return os.path.dirname(path) or ".", self.files(path)

    def files(self, path: str) -> list[str]:
        return [path, path + "-wal", path + "-shm"]


ABOUT = About(
    driver="zarrfs.backends.sqlite.driver:SQLiteDriver",
    schemes=("sqlite",),
    kind="a SQLite database",
    files=SQLiteFiles(),
    bare=".zarrdb",
    options=("timeout", "sync"),
    secrets=(),
    path_options=(),
)

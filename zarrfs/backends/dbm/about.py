"""The DBM driver's declaration (``dbm://``): :data:`ABOUT`, and what a DBM database is on disk
(:class:`DBMFiles`): whichever files :func:`dbm.open` makes of its name (``dbm.gnu``: the name
itself; ``dbm.ndbm``: ``.db`` or ``.dir`` and ``.pag``; ``dbm.dumb``: ``.dat`` and ``.dir``)."""

from __future__ import annotations

import dbm
import os

from ..about import About
from ..dbfiles import DatabaseFiles

#: What the dbm modules add to a database's name.
SUFFIXES = ("", ".db", ".dat", ".dir", ".pag")


class DBMFiles(DatabaseFiles):
    """A DBM database on disk; see the module docstring."""

    def holds(self, path: str) -> bool:
        return bool(dbm.whichdb(path))

    def exists(self, path: str) -> bool:
        return os.path.lexists(path) or dbm.whichdb(path) is not None

    def what_is_there(self, path: str) -> str:
        """As for any file database, but a folder is never one a database may be made in."""
        if not self.exists(path):
            return "missing"
        if self.holds(path):
            return "database"
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            return "empty"
        return "other"

    def written(self, path: str) -> tuple[str, list[str]]:
        return os.path.dirname(path) or ".", self.files(path)

    def files(self, path: str) -> list[str]:
        return [path + suffix for suffix in SUFFIXES]


ABOUT = About(
    driver="zarrfs.backends.dbm.driver:DBMDriver",
    schemes=("dbm",),
    kind="a DBM database",
    files=DBMFiles(),
    secrets=(),
    path_options=(),
)

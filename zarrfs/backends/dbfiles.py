"""What the path of a file database holds, told before any driver opens it: :class:`DatabaseFiles`.

Drivers create what they open: LMDB writes ``data.mdb`` into any folder, SQLite takes a file of
zero bytes as a new database. So a path is looked at first: whether it holds nothing, a database
of the driver's kind (its signature, the first bytes of its file), or something else (an
ordinary Zarr folder, a text file), which is never written into. A file database's driver
declares an instance of a subclass (``About.files``, in its package's ``about`` module); the
command line decides from it what a command may do with a path (``zarrfs.dbfiles``).
"""

from __future__ import annotations

import os


class DatabaseFiles:
    """How a driver's databases lie in the local file system. A subclass defines
    :meth:`holds` (the signature); the rest has defaults for a database that is one file."""

    def holds(self, path: str) -> bool:
        """Whether ``path`` (a file or a folder) is a database of this kind."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path`` (a database whose files add suffixes to its name
        says so here)."""
        return os.path.lexists(path)

    def what_is_there(self, path: str) -> str:
        """``"missing"``, ``"database"`` (one of this kind), ``"empty"`` (an empty folder or
        file a database may be made in) or ``"other"`` (something else: never written into)."""
        if not self.exists(path):
            return "missing"
        if self.holds(path):
            return "database"
        if os.path.isdir(path):
            return "empty" if not os.listdir(path) else "other"
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            return "empty"
        return "other"

    def where(self, path: str) -> str:
        """The file or folder the path of a URL names (an Icechunk URL's ``repo@tag.v1`` names
        the repository ``repo``, ZEP 8's version names being no part of the path)."""
        return path

    def database_at(self, path: str) -> str:
        """The database ``path`` names: ``path`` itself, or the whole of which it is a part (a
        file inside an LMDB folder is that folder), so that one database is never opened two
        ways at once. Raises :class:`~zarrfs.backends.errors.BackendError` for a file that is
        the driver's own bookkeeping of a database, never a database itself."""
        return path

    def written(self, path: str) -> tuple[str, list[str]] | None:
        """The folder a writer of the database ``path`` writes in and the files it writes, so
        that a user who may read but not write it is told so before a mount's first write
        fails; None: nothing to look at."""
        return None

    def files(self, path: str) -> list[str]:
        """The files the database ``path`` occupies (``zarrfs status`` adds up their sizes)."""
        if os.path.isdir(path):
            return [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
        return [path]

    @staticmethod
    def head(path: str, size: int) -> bytes:
        """The first ``size`` bytes of the file ``path`` (none when it cannot be read)."""
        try:
            with open(path, "rb") as fh:
                return fh.read(size)
        except OSError:
            return b""


__all__ = ["DatabaseFiles"]

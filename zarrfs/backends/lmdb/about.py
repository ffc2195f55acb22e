"""The LMDB driver's declaration (``lmdb://``, or a bare path): :data:`ABOUT`, and what an LMDB
database is on disk (:class:`LMDBFiles`): a folder holding ``data.mdb`` and ``lock.mdb``, as
zarr-python 2's ``LMDBStore`` writes it, or a single-file environment; zarrfs's bookkeeping
beside it (the side environment, the room kept for removals) is never a database itself."""

from __future__ import annotations

import os

from ..about import About
from ..dbfiles import DatabaseFiles
from ..errors import BackendError

#: ``MDB_meta.mm_magic``, little-endian, after the 16-byte page header of a data file.
MAGIC = b"\xde\xc0\xef\xbe"
#: The side environment: in a folder environment, and beside a single-file one.
SIDE_IN_FOLDER = "zarrfs-side.mdb"
SIDE_FILE_SUFFIX = ".zarrfs-side"
#: The room kept for removals on a full disk (``filespace.Reserve``).
RESERVE_IN_FOLDER = "zarrfs-reserve"
RESERVE_SUFFIX = ".zarrfs-reserve"


class LMDBFiles(DatabaseFiles):
    """An LMDB environment on disk; see the module docstring."""

    def holds(self, path: str) -> bool:
        data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
        return self.head(data, 20)[16:20] == MAGIC

    def database_at(self, path: str) -> str:
        """A folder's ``data.mdb`` or ``lock.mdb`` names the folder's environment: opened as a
        file of its own, LMDB would lock it with another lock file (``data.mdb-lock``), which
        excludes nothing the folder's writers do. The side environment and the disk reserve
        are bookkeeping of the database beside them: refused."""
        folder, name = os.path.split(path.rstrip("/"))
        if name in ("data.mdb", "lock.mdb") and os.path.isfile(path):
            return folder
        file = path.removesuffix("-lock")
        owners = [os.path.join(folder, "data.mdb")] if os.path.basename(file) == SIDE_IN_FOLDER else []
        owners += [file.removesuffix(s) for s in (SIDE_FILE_SUFFIX, RESERVE_SUFFIX) if file.endswith(s)]
        if name == RESERVE_IN_FOLDER:
            owners.append(os.path.join(folder, "data.mdb"))
        for owner in owners:
            if os.path.isfile(owner):
                whole = folder if owner.endswith("/data.mdb") else owner
                raise BackendError(
                    f"{path} is zarrfs's bookkeeping of the LMDB database {whole}, not a database: "
                    f"name {whole} instead"
                )
        return path

    def written(self, path: str) -> tuple[str, list[str]]:
        if os.path.isdir(path):
            return path, [os.path.join(path, "data.mdb")]
        return os.path.dirname(path) or ".", [path]


FILES = LMDBFiles()
ABOUT = About(
    driver="zarrfs.backends.lmdb.driver:LMDBDriver",
    schemes=("lmdb",),
    kind="an LMDB database",
    files=FILES,
    bare="",
    options=("map_size", "map_max", "side_map_size", "sync"),
    secrets=(),
    path_options=(),
)

"""What the path of a file database (LMDB, SQLite, DBM) holds, told before any driver opens it.

Drivers create what they open: LMDB writes ``data.mdb`` into any folder, SQLite takes a file of
zero bytes as a new database. So the command line looks first: a path that holds nothing, or
something that is not a database of the URL's kind (an ordinary Zarr folder, a text file), is
never written into without ``-o create``, and ``-o create`` makes a database only where nothing
is (a new path, an empty folder, an empty file). A database on a read-only file system is
opened read-only only when asked (``-o ro``).
"""

from __future__ import annotations

import dbm
import os
import stat
from typing import Any

from zarrfs.backends import open_driver
from zarrfs.backends.base import BackendError, Driver
from zarrfs.options import MountOptions
from zarrfs.urls import MountFailure, database_path, reason, shown_url, url_scheme, whole_database

_LMDB_MAGIC = b"\xde\xc0\xef\xbe"  # MDB_meta.mm_magic, little-endian, after the 16-byte page header
_SQLITE_MAGIC = b"SQLite format 3\0"
_KIND = {
    "lmdb": "an LMDB database",
    "sqlite": "a SQLite database",
    "dbm": "a DBM database",
    "zip": "a zip archive",
    "icechunk": "an Icechunk repository",
}


def _head(path: str, size: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError:
        return b""


def _is_lmdb_file(path: str) -> bool:
    return _head(path, 20)[16:20] == _LMDB_MAGIC


def _exists(scheme: str, path: str) -> bool:
    if scheme == "dbm":  # dbm.ndbm and dbm.dumb add their own suffixes to the name
        return os.path.lexists(path) or dbm.whichdb(path) is not None
    return os.path.lexists(path)


def what_is_there(scheme: str, path: str) -> str:
    """``"missing"``, ``"database"`` (one of ``scheme``'s kind), ``"empty"`` (an empty folder or
    file a database may be made in) or ``"other"`` (something else: never written into)."""
    if not _exists(scheme, path):
        return "missing"
    if scheme == "dbm":
        found = dbm.whichdb(path)
        if found:
            return "database"
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            return "empty"
        return "other"
    if os.path.isdir(path):
        if scheme == "lmdb" and _is_lmdb_file(os.path.join(path, "data.mdb")):
            return "database"
        if scheme == "icechunk" and os.path.isdir(os.path.join(path, "snapshots")):
            return "database"
        return "empty" if not os.listdir(path) else "other"
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        return "empty"
    if scheme == "lmdb":
        return "database" if _is_lmdb_file(path) else "other"
    if scheme == "sqlite":
        return "database" if _head(path, 16) == _SQLITE_MAGIC else "other"
    if scheme == "zip":
        return "database" if _head(path, 4) in (b"PK\x03\x04", b"PK\x05\x06") else "other"
    if scheme == "icechunk":  # a repository is a folder
        return "other"
    return "database"


def kind_at(path: str, but: str = "") -> str | None:
    """The scheme of the database at ``path`` (not ``but``), or None when it holds none."""
    return next((s for s in _KIND if s != but and what_is_there(s, path) == "database"), None)


def kind_name(scheme: str) -> str:
    """``"a SQLite database"`` for ``"sqlite"``."""
    return _KIND.get(scheme, "a database")


def _read_only_media(path: str) -> bool:
    """Whether the file system holding ``path`` (or the nearest folder above it that exists) is
    mounted read-only."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/"))
    try:
        return bool(os.statvfs(path or "/").f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _not_writable(scheme: str, path: str) -> str:
    """What of the database ``path`` this user may not write ("" when it may write it all): a
    0444 SQLite file opens read-only by itself, and then every write fails with EROFS."""
    if scheme == "lmdb":
        folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
        files = [os.path.join(path, "data.mdb")] if os.path.isdir(path) else [path]
    elif scheme == "sqlite":  # its journal or WAL files are made beside it
        folder, files = os.path.dirname(path) or ".", [path, path + "-wal", path + "-shm"]
    elif scheme == "dbm":
        folder, files = os.path.dirname(path) or ".", [path + s for s in ("", ".db", ".dat", ".dir", ".pag")]
    else:
        return ""
    for name in files:
        if os.path.exists(name) and not os.access(name, os.W_OK, effective_ids=True):
            st = os.stat(name)
            mode = stat.S_IMODE(st.st_mode)
            return f"it ({os.path.basename(name)}: owner {_user(st.st_uid)}, mode {mode:04o})"
    if not os.access(folder, os.W_OK, effective_ids=True):
        return f"the folder {folder} it needs to write in"
    return ""


def check_database_path(scheme: str, path: str, *, create: bool, readonly: bool, hint: bool = True) -> None:
    """Raise :class:`MountFailure`, one line saying what to do, unless the database ``path`` may
    be opened as asked (``create``: ``-o create``; ``readonly``: ``-o ro``; ``hint``: name the
    mount options in the message, which a mount takes and ``zarrfs check`` does not)."""
    kind = _KIND.get(scheme, "a database")
    there = what_is_there(scheme, path)
    if there == "other":
        what = "a folder" if os.path.isdir(path) else "a file"
        advice = (
            f"; to put a Zarr folder in a database: zarrfs copy {path} NEW.{scheme}"
            if os.path.isdir(path) and scheme == "lmdb"
            else ""
        )
        other = kind_at(path, but=scheme)
        if other is not None:  # a bare s.sqlite is taken for LMDB: say what it is, and its URL
            advice = f": it is {_KIND[other]}, whose URL is {other}://{os.path.abspath(path)}"
        if create and other is not None:
            raise MountFailure(f"{path} is {what} but not {kind}{advice}")
        if create:
            raise MountFailure(
                f"{path} is {what} with something in it, not {kind}: -o create makes a new database "
                "only at a new path, in an empty folder or an empty file"
            )
        raise MountFailure(f"{path} is {what} but not {kind}{advice}")
    if there in ("missing", "empty") and not create:
        empty = "folder" if os.path.isdir(path) else "file"
        said = "does not exist" if there == "missing" else f"is an empty {empty}"
        if readonly and hint:
            raise MountFailure(f"database {path} {said}: there is nothing to mount read-only")
        raise MountFailure(f"database {path} {said}" + (" (add -o create to make a new one)" if hint else ""))
    if there in ("missing", "empty") and readonly:
        raise MountFailure(f"database {path} cannot be created read-only (-o ro with -o create)")
    if there == "missing":
        parent = os.path.dirname(os.path.abspath(path).rstrip("/")) or "/"
        if not os.path.isdir(parent):
            raise MountFailure(f"cannot create the database {path}: the folder {parent} does not exist")
    if not readonly and _read_only_media(path):
        raise MountFailure(
            f"{path} is on a read-only file system" + (": add -o ro to mount it read-only" if hint else "")
        )
    if not readonly and there == "database" and (locked := _not_writable(scheme, path)):
        raise MountFailure(
            f"{path}: this user may read it but not write {locked}"
            + ("; add -o ro to mount it read-only" if hint else "")
        )


def _takes_create(url: str) -> bool:
    """Whether the driver of ``url`` takes ``create=`` (a server's: whether a table or a
    prefix that holds nothing may be made, or is refused)."""
    import inspect

    from zarrfs.backends.registry import driver_class, normalize_url

    try:
        cls = driver_class(normalize_url(url)[0])
    except BackendError:
        return False  # the open says why
    return "create" in inspect.signature(cls.__init__).parameters


def open_database(url: str, opts: MountOptions, hint: bool = True, **options: Any) -> Driver:
    """Open the driver for ``url``; a file database that is missing, or a path that holds
    something else, is an error unless ``-o create`` (see above; ``hint``: name
    the mount options in the error). ``options``: the driver class's own keyword arguments."""
    if opts.snapshot is not None:  # refused before anything is opened
        from zarrfs.backends.registry import driver_class, normalize_url
        from zarrfs.backends.snapshot import SnapshotDriver

        SnapshotDriver.check(driver_class(normalize_url(url)[0]))
    url = whole_database(url)
    path = database_path(url)
    if path is not None:
        from zarrfs.backends.registry import bare_path_scheme

        scheme = url_scheme(url) or bare_path_scheme(path)
        check_database_path(scheme, path, create=opts.create, readonly=opts.readonly, hint=hint)
    elif _takes_create(url):  # a server's driver: it is told whether it may make the database
        options.setdefault("create", opts.create)
    try:
        return open_driver(url, readonly=opts.readonly, timeout=opts.timeout, **options)
    except BackendError:
        raise
    except Exception as exc:  # a driver's own error type, OSError...: one line, no traceback
        raise BackendError(f"cannot open the database {shown_url(url)}: {reason(exc)}") from exc

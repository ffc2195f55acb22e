"""Opening a database as a command asked: a file database's path is looked at first.

Drivers create what they open: LMDB writes ``data.mdb`` into any folder, SQLite takes a file of
zero bytes as a new database. So the command line looks first, with what the URL's driver
declares of its files (``About.files``, ``zarrfs.backends.dbfiles``): a path that holds nothing,
or something that is not a database of the URL's kind (an ordinary Zarr folder, a text file),
is never written into without ``-o create``, and ``-o create`` makes a database only where
nothing is (a new path, an empty folder, an empty file). A database on a read-only file system
is opened read-only only when asked (``-o ro``).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from zarrfs.backends import open_driver
from zarrfs.backends.base import BackendError, Driver
from zarrfs.backends.registry import about, bare_path_scheme, driver_class, kind_at, normalize_url
from zarrfs.backends.urls import database_path, shown_url, url_scheme, whole_database
from zarrfs.options import MountOptions
from zarrfs.urls import MountFailure, reason


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
    files = about(scheme).files
    written = None if files is None else files.written(path)
    if written is None:
        return ""
    folder, names = written
    for name in names:
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
    declared_as = about(scheme)
    if declared_as.files is None:
        raise MountFailure(f"{scheme}:// names a server's database, not a path")
    kind = declared_as.kind
    there = declared_as.files.what_is_there(path)
    if there == "other":
        what = "a folder" if os.path.isdir(path) else "a file"
        advice = (  # NEW.{scheme}: a bare path, which this driver takes
            f"; to put a Zarr folder in a database: zarrfs copy {path} NEW.{scheme}"
            if os.path.isdir(path) and declared_as.bare == ""
            else ""
        )
        other = kind_at(path, but=scheme)
        if other is not None:  # a bare s.sqlite is taken for LMDB: say what it is, and its URL
            advice = f": it is {about(other).kind}, whose URL is {other}://{os.path.abspath(path)}"
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
    """Whether the driver of ``url`` takes ``create=`` (``Driver.takes_create``: a server's,
    told whether a table or a prefix that holds nothing may be made, or is refused)."""
    try:
        return driver_class(normalize_url(url)[0]).takes_create
    except BackendError:
        return False  # the open says why


def open_database(url: str, opts: MountOptions, hint: bool = True, **options: Any) -> Driver:
    """Open the driver for ``url``; a file database that is missing, or a path that holds
    something else, is an error unless ``-o create`` (see above; ``hint``: name
    the mount options in the error). ``options``: the driver class's own keyword arguments."""
    if opts.snapshot is not None:  # refused before anything is opened
        from zarrfs.backends.snapshot import SnapshotDriver

        SnapshotDriver.check(driver_class(normalize_url(url)[0]))
    url = whole_database(url)
    path = database_path(url)
    if path is not None:
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

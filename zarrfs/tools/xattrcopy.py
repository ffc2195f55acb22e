"""The extended attributes ``zarrfs copy`` carries with the keys it copies, between folders
(``os.listxattr``/``os.setxattr`` of each file and folder) and databases (the ``x:`` side
records a mount keeps, :mod:`zarrfs.fs.sidedata`).

A folder end reads and writes the namespaces the caller may use (``user.``; ``trusted.`` and
``security.`` too as root); a filesystem without extended attributes has none to give, and
refuses them silently as ``cp -a`` does.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

from zarrfs.backends.base import SIDE, VALUES, Driver, prefix_stop
from zarrfs.fs import records
from zarrfs.fs.sidedata import XATTR, pack_xattrs, unpack_xattrs

BATCH = 256
_NOT_KEPT = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.ENODATA)


def folder_xattrs(root: str) -> Iterator[tuple[str, dict[bytes, bytes]]]:
    """``(key, attributes)`` of every file and folder under ``root`` that has some."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in [*dirnames, *filenames]:
            found = _read(os.path.join(dirpath, name))
            if found:
                yield prefix + name, found


def has_folder_xattrs(path: str) -> bool:
    """Whether the file or folder at ``path`` has attributes :func:`folder_xattrs` would give."""
    try:
        return bool(os.listxattr(path, follow_symlinks=False))
    except OSError as exc:
        if exc.errno in _NOT_KEPT or exc.errno == errno.ENOENT:
            return False
        raise


def _read(path: str) -> dict[bytes, bytes]:
    try:
        return {os.fsencode(n): os.getxattr(path, n, follow_symlinks=False) for n in os.listxattr(path)}
    except OSError as exc:
        if exc.errno in _NOT_KEPT:
            return {}
        raise


def database_xattrs(driver: Driver) -> Iterator[tuple[str, dict[bytes, bytes]]]:
    """``(key, attributes)`` of every node of a database that has some."""
    after = XATTR
    while True:
        batch = driver.scan(after, prefix_stop(XATTR), space=SIDE, fetch=VALUES, limit=BATCH)
        for key, raw in batch:
            yield key[len(XATTR) :], unpack_xattrs(raw)
        if len(batch) < BATCH:
            return
        after = batch[-1][0] + "\0"


def put_folder_xattrs(root: str, items: list[tuple[str, dict[bytes, bytes]]]) -> None:
    """Set the attributes of files and folders under ``root`` (those that are there)."""
    for key, xattrs in items:
        path = os.path.join(root, *key.split("/"))
        for name, value in xattrs.items():
            try:
                os.setxattr(path, name, value, follow_symlinks=False)
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno not in _NOT_KEPT:
                    raise


def put_database_xattrs(driver: Driver, items: list[tuple[str, dict[bytes, bytes]]]) -> None:
    """Keep the attributes of ``items`` as a mount keeps them."""
    for start in range(0, len(items), BATCH):
        batch = items[start : start + BATCH]
        driver.transact(lambda t, b=batch: [records.put_xattrs(t, [k], pack_xattrs(x)) for k, x in b])

"""How a file's records are written and removed, for the mount and for ``zarrfs.store``
alike. A file is its value under every name of its link group (``h:<key>`` names the group:
:mod:`zarrfs.fs.hardlinks`), one attribute record per name (``a:<name>``,
:class:`zarrfs.fs.sidedata.Attrs`) kept in step, an extended-attributes record per name
(``x:<name>``) when it has any, and, for a value stored in parts, the parts its manifest names
(:mod:`zarrfs.fs.parts`). Writing through one place keeps the names of a group one file,
whoever writes; each function here runs inside the caller's transaction and returns the
parts it let go of, for the caller to free after the commit (:func:`zarrfs.fs.parts.free`)."""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from typing import Any

from zarrfs.backends.base import DATA, SIDE, VALUES, Txn, prefix_stop
from zarrfs.fs import hardlinks, parts
from zarrfs.fs.manifest import Parted
from zarrfs.fs.sidedata import ATTR, ENTRY, POINTER, XATTR, Attrs, attr_key, pointer_key, xattr_key

#: ``store(t, name, value)``: the bytes to store for ``value`` at ``name`` (the format layer's
#: hook; it may refuse).
Store = Callable[[Txn, str, Any], Any]


def names_of(t: Txn, key: str, pointer: bytes | None = None, *, read_pointer: bool = False) -> list[str]:
    """The names the content of the file at ``key`` is stored under: every name of its link
    group, or ``key`` alone. ``pointer`` is its raw pointer record, read by the caller in its
    own batch, or read here when ``read_pointer``."""
    if read_pointer:
        pointer = t.get(pointer_key(key), SIDE)
    group = hardlinks.load(t, key, pointer)
    return group.names if group is not None else [key]


def write_file(
    t: Txn, names: list[str], value: Any, record: bytes | None, store: Store
) -> list[tuple[str, Any]]:
    """Put ``value`` (as ``store`` makes it) under each of ``names``, with the attribute
    ``record`` (None: the records stay as they are); returns ``(name, stored)`` pairs."""
    out = []
    for name in names:
        stored = store(t, name, value)
        t.put(name, stored)
        if record is not None:
            t.put(attr_key(name), record, SIDE)
        out.append((name, stored))
    return out


def set_value(t: Txn, key: str, value: bytes, store: Store, new: Callable[[int], Attrs]) -> Parted | None:
    """A whole new value for the file at ``key`` (a ``set`` of a store, not through a mount):
    under every name of its link group, with its attributes kept and its mtime and ctime now
    (``new(now)``: the attributes of a file that has none). Returns the parts it let go."""
    raw = t.get(attr_key(key), SIDE)
    freed = parts.let_go(t, key, raw, every_name=True)  # every name is rewritten below
    now = time.time_ns()
    attrs = Attrs.unpack(raw) if raw is not None else None
    if attrs is None:
        attrs = new(now)
    attrs.mtime = attrs.ctime = now
    attrs.parted = None  # stored whole
    write_file(t, names_of(t, key, read_pointer=True), value, attrs.pack(), store)
    return freed


def delete_file(t: Txn, key: str) -> Parted | None:
    """Remove the name ``key`` of a file with its records (a missing key is no error); the
    other names of its link group stay, as after an unlink. Returns the parts it let go."""
    freed = parts.let_go(t, key, t.get(attr_key(key), SIDE))
    t.delete(key)
    for record in (attr_key(key), pointer_key(key), xattr_key(key)):
        t.delete(record, SIDE)
    return freed


def delete_below(t: Txn, folder: str) -> list[Parted | None]:
    """Remove every key under ``folder`` ("" for all) and the side records of what it
    removes (attributes, entries, link-group pointers, extended attributes), and the folder's
    own entry. Returns the parts it let go."""
    below = folder + "/" if folder else ""
    freed = []
    records = ATTR + below
    for k, raw in t.scan(records, prefix_stop(records), space=SIDE, fetch=VALUES):
        if parts.parted_of(raw) is not None:
            freed.append(parts.let_go(t, k[len(ATTR) :], raw))
    for space, start in [(DATA, below), *((SIDE, mark + below) for mark in (ATTR, ENTRY, POINTER, XATTR))]:
        for k in [k for k, _ in t.scan(start, prefix_stop(start), space=space)]:
            t.delete(k, space)
    if folder and t.size(folder) is None:  # the folder itself, unless a file has its name
        for record in (ENTRY + folder, attr_key(folder), xattr_key(folder)):
            t.delete(record, SIDE)
    return freed


def new_file_attrs(umask: int, uid: int, gid: int) -> Callable[[int], Attrs]:
    """The attributes of a file made at time ``now`` by ``uid``/``gid`` under ``umask``."""
    return lambda now: Attrs(stat.S_IFREG | (0o666 & ~umask), uid, gid, now, now, now)

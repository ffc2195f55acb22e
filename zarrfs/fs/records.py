"""Every write and delete of a node's side records, for the mount and for ``zarrfs.store`` and
the tools alike (the layout is :mod:`zarrfs.fs.sidedata`'s; nothing else writes it).

A file is its value under every name of its link group (``h:<key>`` names the group, ``g:<id>``
lists its names: :mod:`zarrfs.fs.hardlinks`), one attribute record per name (``a:<name>``,
:class:`zarrfs.fs.sidedata.Attrs`) kept in step, an extended-attributes record per name
(``x:<name>``) when it has any, and, for a value stored in parts, the parts its manifest names
(:mod:`zarrfs.fs.parts`). A folder made with ``mkdir``, a symlink or a special file is an entry
record (``e:<key>``) with its attribute and extended-attributes records. Writing through one
place keeps the names of a group one file, whoever writes, and removes a name one way: it
leaves its link group (:func:`leave_group`), whose other names get a new ctime.

Each function runs inside the caller's transaction; those that can let parts go return them,
for the caller to free after the commit (:func:`zarrfs.fs.parts.free`). ``found`` is what a
probe found at a name: (kind, size, target, raw attributes, raw pointer); ``defaults(kind)``
gives the attributes of a node without a record, ``now`` the time of the change.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import Any

from zarrfs.backends.base import (
    DATA,
    SIDE,
    VALUES,
    Driver,
    Get,
    HasPrefix,
    Read,
    Space,
    StalledError,
    Txn,
    prefix_stop,
)
from zarrfs.fs import hardlinks, parts
from zarrfs.fs.manifest import Parted
from zarrfs.fs.node import DIR, FILE
from zarrfs.fs.sidedata import (
    ATTR,
    DIR_MARK,
    ENTRY,
    EPOCH,
    POINTER,
    XATTR,
    Attrs,
    attr_key,
    entry_key,
    group_key,
    moved_key,
    pointer_key,
    xattr_key,
)

#: ``store(t, name, value)``: the bytes to store for ``value`` at ``name`` (the format layer's
#: hook; it may refuse).
Store = Callable[[Txn, str, Any], Any]
#: ``defaults(kind)``: the attributes of a node of type ``kind`` without a record.
Defaults = Callable[[int], Attrs]
#: ``changed(t, key, value)``: a data key was set (None: deleted); the format layer follows.
Changed = Callable[[Txn, str, Any], None]
#: A subtree's records: (space, key, value).
Records = list[tuple[str, str, bytes]]


def epoch(driver: Driver) -> int:
    """The time of nodes without attributes, fixed at the first mount (see sidedata)."""
    raw = driver.get(EPOCH, SIDE)
    if raw is not None:
        return int(raw)
    stamp = time.time_ns()
    if not driver.readonly:
        try:
            driver.put(EPOCH, str(stamp).encode(), SIDE)
        except StalledError:  # another program holds the write lock: the next mount records it
            pass
    return stamp


# ---------------------------------------------------------------------- one node's records
def names_of(t: Txn, key: str, pointer: bytes | None = None, *, read_pointer: bool = False) -> list[str]:
    """The names the content of the file at ``key`` is stored under: every name of its link
    group, or ``key`` alone. ``pointer`` is its raw pointer record, read by the caller in its
    own batch, or read here when ``read_pointer``."""
    if read_pointer:
        pointer = t.get(pointer_key(key), SIDE)
    group = hardlinks.load(t, key, pointer)
    return group.names if group is not None else [key]


def put_attrs(t: Txn, names: list[str], raw: bytes) -> None:
    """One attribute record under each of ``names`` (the names of a node share theirs)."""
    for name in names:
        t.put(attr_key(name), raw, SIDE)


def put_xattrs(t: Txn, names: list[str], raw: bytes | None) -> None:
    """One extended-attributes record under each of ``names``; none when ``raw`` is empty."""
    for name in names:
        if raw:
            t.put(xattr_key(name), raw, SIDE)
        else:
            t.delete(xattr_key(name), SIDE)


def restamp(t: Txn, key: str, defaults: Defaults | None = None) -> None:
    """The file at ``key`` was rewritten on the side (a consolidated document): its mtime and
    ctime move (tools that sync by mtime, the kernel's page-cache stamp), its owner and mode
    stay. A file without a record gets one from ``defaults``, or none when it is None."""
    raw = t.get(attr_key(key), SIDE)
    attrs = Attrs.unpack(raw) if raw is not None else None
    if attrs is None:
        if defaults is None:
            return
        attrs = defaults(FILE)
    attrs.mtime = attrs.ctime = time.time_ns()
    t.put(attr_key(key), attrs.pack(), SIDE)


def make_entry(t: Txn, key: str, mark: bytes, attrs: bytes, xattrs: bytes | None) -> None:
    """A new folder, symlink or special file at ``key``: its entry record ``mark``, its
    attributes and (when it has any) its extended attributes."""
    t.put(entry_key(key), mark, SIDE)
    t.put(attr_key(key), attrs, SIDE)
    if xattrs:
        t.put(xattr_key(key), xattrs, SIDE)


def keep_folder(t: Txn, folder: str) -> None:
    """Mark ``folder`` as made, so it stays when nothing is left below it."""
    t.put(entry_key(folder), DIR_MARK, SIDE)


def drop_pointer(t: Txn, key: str) -> None:
    """Remove a link-group pointer left at ``key`` (its file deleted by a writer that knows
    nothing of links): a new file there is not linked."""
    t.delete(pointer_key(key), SIDE)


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


# ---------------------------------------------------------------------- link groups
def _write_group(t: Txn, group: hardlinks.Group) -> None:
    """Store ``group``'s names; a group of one name or none is dissolved."""
    if len(group.names) > 1:
        t.put(group_key(group.gid), hardlinks.pack_names(group.names), SIDE)
        for name in group.names:
            t.put(pointer_key(name), group.gid.encode(), SIDE)
        return
    t.delete(group_key(group.gid), SIDE)
    for name in group.names:
        t.delete(pointer_key(name), SIDE)


def touch_names(t: Txn, names: list[str], raw: bytes | None, kind: int, defaults: Defaults, now: int) -> None:
    """A new ctime for every name of a linked node of type ``kind`` whose attribute record is
    ``raw`` (a name was added, removed or moved)."""
    attrs = (Attrs.unpack(raw) if raw is not None else None) or defaults(kind)
    attrs.ctime = now
    put_attrs(t, names, attrs.with_type(kind).pack())


def join_group(t: Txn, src: str, dst: str, pointer: bytes | None) -> list[str]:
    """Add the new name ``dst`` to the link group of ``src`` (``pointer``: its raw pointer
    record; a new group when it has none). Returns the group's names."""
    group = hardlinks.load(t, src, pointer)
    if group is None:
        group = hardlinks.Group(os.urandom(8).hex(), [src])
    group.names.append(dst)
    _write_group(t, group)
    return group.names


def leave_group(t: Txn, key: str, found: Any, defaults: Defaults, now: int) -> list[str]:
    """The name ``key`` of a node that is not a folder is gone (unlinked, deleted, or replaced
    by a rename): it leaves its link group, whose other names get a new ctime. Returns those
    names."""
    if found[4] is None:
        return []
    group = hardlinks.load(t, key, found[4])
    t.delete(pointer_key(key), SIDE)
    if group is None:  # a stale pointer
        return []
    group.names = [n for n in group.names if n != key]
    _write_group(t, group)
    touch_names(t, group.names, found[3], found[0], defaults, now)
    return group.names


def regroup(t: Txn, moved: list[tuple[Records, str, str, Any]], defaults: Defaults, now: int) -> None:
    """Link groups follow the names a rename moved: ``(records, src, dst, found)`` for each
    subtree placed from ``src`` to ``dst``. The names of a moved linked file get a new ctime
    (a folder's move leaves the files in it as they are)."""
    moves = [
        (k[len(POINTER) :], moved_key(k, src, dst)[len(POINTER) :], v)
        for records, src, dst, _ in moved
        for space, k, v in records
        if space == SIDE and k.startswith(POINTER)
    ]
    if not moves:
        return
    by_group: dict[str, dict[str, str]] = {}
    for old, new, pointer in moves:
        by_group.setdefault(bytes(pointer).decode("ascii", "replace"), {})[old] = new
    groups = {}
    for gid, mapping in by_group.items():
        names = hardlinks.names_in(t, gid)
        for old, new in mapping.items():
            if old not in names:  # a stale pointer moved with its file: drop it
                t.delete(pointer_key(new), SIDE)
        group = hardlinks.Group(gid, hardlinks.present(t, [mapping.get(n, n) for n in names]))
        _write_group(t, group)
        groups[gid] = group
    for *_, found in moved:
        group = groups.get(bytes(found[4]).decode("ascii", "replace")) if found[4] else None
        if group is not None and len(group.names) > 1:
            touch_names(t, group.names, found[3], found[0], defaults, now)


# ---------------------------------------------------------------------- removing and moving names
def remove_name(t: Txn, key: str, found: Any, defaults: Defaults, now: int) -> list[str]:
    """Remove the name ``key`` of a file, symlink or special file (``found``: its probe) with
    its records: its value or entry record, its attributes and extended attributes; it leaves
    its link group (:func:`leave_group`). Returns the group's names left."""
    if found[0] == FILE:
        t.delete(key)
    else:
        t.delete(entry_key(key), SIDE)
    left = leave_group(t, key, found, defaults, now)
    t.delete(attr_key(key), SIDE)
    t.delete(xattr_key(key), SIDE)
    return left


def remove_folder(t: Txn, key: str) -> None:
    """Remove the records of the empty folder ``key``: its mark, attributes and extended
    attributes."""
    for record in (entry_key(key), attr_key(key), xattr_key(key)):
        t.delete(record, SIDE)


#: The kinds of a node's records :func:`subtree` reads: its value, entry, attribute and
#: extended-attribute records (the link-group pointers are taken apart).
_KINDS: tuple[tuple[str, Space], ...] = (("", DATA), (ENTRY, SIDE), (ATTR, SIDE), (XATTR, SIDE))


def subtree_reads(key: str) -> list[Read]:
    """What :func:`subtree` reads of ``key`` before it scans: the node's own records and
    whether each kind has records below it (the link-group pointers below only count for a
    folder); a caller may read them in its probe's batch and hand the answers over."""
    reads: list[Read] = []
    for prefix, space in _KINDS:
        reads += [Get(prefix + key, space), HasPrefix(prefix + key + "/", space)]
    reads.append(HasPrefix(POINTER + key + "/", SIDE))
    return reads


def subtree(t: Txn, key: str, found: Any, answers: list[Any] | None = None) -> Records:
    """Every record of the node at ``key`` and below: (space, key, value); ``found`` is what
    the probe found at ``key`` (a file's link-group pointer comes with it). The reads of
    :func:`subtree_reads` come first, in one batch (``answers``: already read), then scans of
    only the kinds with records below: a file's rename read its records one by one, seven
    round trips to a server."""
    if answers is None:
        answers = t.read_many(subtree_reads(key))
    records: Records = []

    def scan(prefix: str, space: Space) -> None:
        below = t.scan_prefix(prefix + key + "/", space=space, fetch=VALUES)
        records.extend((space, k, v) for k, v in below)

    for i, (prefix, space) in enumerate(_KINDS):
        if answers[2 * i] is not None:
            records.append((space, prefix + key, answers[2 * i]))
        if answers[2 * i + 1]:
            scan(prefix, space)
    if found[0] == DIR:
        if answers[2 * len(_KINDS)]:
            scan(POINTER, SIDE)
    elif found[4] is not None:
        records.append((SIDE, pointer_key(key), found[4]))
    return records


def remove(t: Txn, records: Records, changed: Changed) -> None:
    """Delete ``records`` (:func:`subtree`'s); ``changed`` hears of each data key."""
    for space, k, _ in records:
        t.delete(k, space)
        if space == DATA:
            changed(t, k, None)


def place(
    t: Txn,
    records: Records,
    src: str,
    dst: str,
    arrive: Callable[[Txn, str, Any, str], Any],
    changed: Changed,
) -> None:
    """Put ``records`` of ``src`` and below under ``dst``; ``arrive(t, new, value, old)``
    gives the value a data key takes at its new name (``old``: ``src`` for the file moved
    alone, else "": a file moved with its folder keeps its meaning), ``changed`` hears of it."""
    for space, k, v in records:
        new = moved_key(k, src, dst)
        if space == DATA:
            v = arrive(t, new, v, k if k == src else "")
        t.put(new, v, space)
        if space == DATA:
            changed(t, new, v)


# ---------------------------------------------------------------------- writers that are not a mount
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


def _defaults_of(new: Callable[[int], Attrs], now: int) -> Defaults:
    return lambda kind: new(now).with_type(kind)


def delete_file(t: Txn, key: str, new: Callable[[int], Attrs] | None = None) -> Parted | None:
    """Remove the name ``key`` of a file with its records (a missing key is no error), as an
    unlink does (:func:`remove_name`): the other names of its link group stay, with a new
    ctime (``new(now)``: the attributes of a file that has none). Returns the parts it let go."""
    raw = t.get(attr_key(key), SIDE)
    freed = parts.let_go(t, key, raw)
    now = time.time_ns()
    found = (FILE, None, None, raw, t.get(pointer_key(key), SIDE))
    remove_name(t, key, found, _defaults_of(new or _new_file, now), now)
    return freed


def delete_below(t: Txn, folder: str, new: Callable[[int], Attrs] | None = None) -> list[Parted | None]:
    """Remove every key under ``folder`` ("" for all) and the side records of what it
    removes (attributes, entries, link-group pointers, extended attributes), and the folder's
    own entry. A name removed leaves its link group, as an unlink does (:func:`leave_group`):
    names of the group outside ``folder`` stay, with a new ctime. Returns the parts it let go."""
    below = folder + "/" if folder else ""
    freed = []
    records = ATTR + below
    for k, raw in t.scan(records, prefix_stop(records), space=SIDE, fetch=VALUES):
        if parts.parted_of(raw) is not None:
            freed.append(parts.let_go(t, k[len(ATTR) :], raw))
    now = time.time_ns()
    defaults = _defaults_of(new or _new_file, now)
    pointers = POINTER + below
    for k, pointer in list(t.scan(pointers, prefix_stop(pointers), space=SIDE, fetch=VALUES)):
        name = k[len(POINTER) :]
        raw = t.get(attr_key(name), SIDE)
        attrs = Attrs.unpack(raw) if raw is not None else None
        kind = stat.S_IFMT(attrs.mode) if attrs is not None else FILE
        leave_group(t, name, (kind, None, None, raw, pointer), defaults, now)
    for space, start in [(DATA, below), *((SIDE, mark + below) for mark in (ATTR, ENTRY, POINTER, XATTR))]:
        for k in [k for k, _ in t.scan(start, prefix_stop(start), space=space)]:
            t.delete(k, space)
    if folder and t.size(folder) is None:  # the folder itself, unless a file has its name
        remove_folder(t, folder)
    return freed


def put_value(driver: Any, key: str, value: Any, part: int = parts.PART_SIZE) -> None:
    """Store ``value`` at ``key`` in parts, with an attribute record saying so (``zarrfs
    copy`` of a value larger than the destination's largest value)."""
    view = memoryview(value).cast("B")

    def fill(offset: int, into: memoryview) -> int:
        n = min(len(into), len(view) - offset)
        into[:n] = view[offset : offset + n]
        return n

    put_parts(driver, key, len(view), fill, part)


def put_parts(
    driver: Any, key: str, size: int, readinto: Callable[[int, memoryview], int], part: int
) -> None:
    """Store the ``size`` bytes that ``readinto`` gives (as for :func:`zarrfs.fs.parts.store`)
    at ``key`` in parts, part by part, then the commit of the manifest with an attribute
    record saying so; the parts of the version replaced are freed after it (``zarrfs copy``)."""
    parted = parts.store(driver, size, readinto, part)

    def run(t: Txn) -> Parted | None:
        parts.check_present(t, key, parted)
        raw = t.get(attr_key(key), SIDE)
        attrs = Attrs.unpack(raw) if raw is not None else None
        old = parts.let_go(t, key, raw)
        t.put(key, parted.manifest(), DATA)
        if attrs is None:
            attrs = _new_file(time.time_ns())
        t.put(attr_key(key), attrs.pack_parted(parted), SIDE)
        return old

    try:
        old = driver.transact(run)
    except BaseException:
        parts.discard(driver, parted)
        raise
    if old is not None and old != parted:
        parts.free(driver, [old])


def new_file_attrs(umask: int, uid: int, gid: int) -> Callable[[int], Attrs]:
    """The attributes of a file made at time ``now`` by ``uid``/``gid`` under ``umask``."""
    return lambda now: Attrs(stat.S_IFREG | (0o666 & ~umask), uid, gid, now, now, now)


#: A file made by this process under the usual umask.
_new_file = new_file_attrs(0o022, os.getuid(), os.getgid())

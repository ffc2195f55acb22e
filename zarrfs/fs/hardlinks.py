"""Hard links: several names of one file, kept in the SIDE space.

Each name of a linked file is an ordinary data key holding the whole value (zarr-python 2's store
classes read any of them); each name of a linked symlink or special file is its own entry record.
Two side records make the names one node: ``h:<key>``, the id of the name's link group, and
``g:<id>``, the group's names, NUL-separated (no key holds a NUL). A commit stores the value under
every name and keeps their ``a:<name>`` records in step, in one transaction; every namespace change
keeps the records exact in its own. Data keys win, as over every side record: a file exists iff its
key exists (a symlink or special file iff its entry record does); a name whose key is gone
(deleted by zarr-python 2, which knows nothing of links) is not a member, a pointer whose group
does not name its key is ignored, and a group left with one name is dissolved.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zarrfs.backends.base import DATA, SIDE, Get, Read, Size, Txn
from zarrfs.fs.node import Node, stamp_of
from zarrfs.fs.sidedata import (
    LINK_MARK,
    POINTER,
    SPECIAL_MARK,
    Attrs,
    attr_key,
    entry_key,
    group_key,
    moved_key,
    pointer_key,
)

_SEP = "\0"


@dataclass
class Group:
    """A link group as one transaction read it: its id and the names whose keys exist."""

    gid: str
    names: list[str]


def _unpack(raw: bytes) -> list[str]:
    return [n for n in bytes(raw).decode("utf-8", "surrogateescape").split(_SEP) if n]


def _pack(names: list[str]) -> bytes:
    return _SEP.join(names).encode("utf-8", "surrogateescape")


def _present(t: Txn, names: list[str]) -> list[str]:
    """Those of ``names`` that exist: as a data key (a file) or as the entry record of a
    symlink or special file; one batch of reads."""
    requests: list[Read] = []
    for name in names:
        requests += [Size(name, DATA), Get(entry_key(name), SIDE)]
    answers = t.read_many(requests)
    return [
        name
        for i, name in enumerate(names)
        if answers[2 * i] is not None
        or (answers[2 * i + 1] is not None and answers[2 * i + 1][:1] in (LINK_MARK, SPECIAL_MARK))
    ]


def load(t: Txn, key: str, pointer: bytes | None) -> Group | None:
    """The group of the file at ``key`` whose pointer record (``h:<key>``, read by the caller
    in its own batch) is ``pointer``; None when it has none, or a stale one. Two reads, and
    only for a linked file: the group's names, then which of their keys exist."""
    if pointer is None:
        return None
    gid = bytes(pointer).decode("ascii", "replace")
    raw = t.get(group_key(gid), SIDE)
    names = _unpack(raw) if raw is not None else []
    if key not in names:
        return None
    present = set(_present(t, names))
    return Group(gid, [n for n in names if n in present or n == key])


def write(t: Txn, group: Group) -> None:
    """Store ``group``'s names; a group of one name or none is dissolved."""
    if len(group.names) > 1:
        t.put(group_key(group.gid), _pack(group.names), SIDE)
        for name in group.names:
            t.put(pointer_key(name), group.gid.encode(), SIDE)
        return
    t.delete(group_key(group.gid), SIDE)
    for name in group.names:
        t.delete(pointer_key(name), SIDE)


def join(t: Txn, group: Group | None, src: str, dst: str) -> Group:
    """Add the new name ``dst`` to the group of ``src`` (a new group when it has none)."""
    if group is None:
        group = Group(os.urandom(8).hex(), [src])
    group.names.append(dst)
    write(t, group)
    return group


def leave(t: Txn, group: Group, key: str) -> list[str]:
    """Take ``key`` out of its group (unlinked, or replaced by a rename); the names left."""
    t.delete(pointer_key(key), SIDE)
    group.names = [n for n in group.names if n != key]
    write(t, group)
    return group.names


def renamed(t: Txn, moves: list[tuple[str, str, bytes]]) -> list[Group]:
    """Follow names that moved in this transaction: ``(old, new, pointer)`` for each pointer
    record a rename carried from ``old`` to ``new`` (a file, or the files of a folder; both
    sides of an exchange at once). Returns the groups changed."""
    by_group: dict[str, dict[str, str]] = {}
    for old, new, pointer in moves:
        by_group.setdefault(bytes(pointer).decode("ascii", "replace"), {})[old] = new
    changed = []
    for gid, mapping in by_group.items():
        raw = t.get(group_key(gid), SIDE)
        names = _unpack(raw) if raw is not None else []
        for old, new in mapping.items():
            if old not in names:  # a stale pointer moved with its file: drop it
                t.delete(pointer_key(new), SIDE)
        group = Group(gid, _present(t, [mapping.get(n, n) for n in names]))
        write(t, group)
        changed.append(group)
    return changed


def still_the_file(
    names: list[str],
    found: dict[str, Node | None],
    group: str,
    kind: int,
    rewritten: set[str] | None,
    seen: set[tuple[int, int]],
) -> list[str]:
    """Which of ``names``, the names of one file of type ``kind`` and link group ``group`` as
    a mount knew them, are still that file after changes made elsewhere, by what each holds
    now (``found``). A name still of the group is. When the group is gone (dissolved: one name
    of it left, or none), the file is the one name left of its type; of several (a rename onto
    one name of two dissolves their group), the one whose value or entry record was not
    rewritten (``rewritten``, None: not known), else the one whose version (size, mtime) is
    ``seen``, what an open file of it holds; else none is known to be (an empty list)."""
    same = {n: node for n in names if (node := found[n]) is not None and node.kind == kind}
    members = [n for n, node in same.items() if node.group == group]
    if members or len(same) <= 1:
        return members or list(same)
    told = [n for n in same if rewritten is not None and n not in rewritten]
    if len(told) != 1:
        told = [n for n, node in same.items() if stamp_of(node) in seen]
    return told if len(told) == 1 else []


def put_attrs(t: Txn, names: list[str], raw: bytes) -> None:
    """Write one attribute record to every name of a group (attributes are kept in step)."""
    for name in names:
        t.put(attr_key(name), raw, SIDE)


class LinkGroups:
    """The link-group steps of the tree's namespace changes, each inside the change's
    transaction. ``found`` is what a probe found at a name: (kind, size, target, raw
    attributes, raw pointer). ``default_attrs(kind)`` gives the attributes of a node without a
    record; ``now()`` the time of a change."""

    def __init__(self, default_attrs: Callable[[int], Attrs], now: Callable[[], int]) -> None:
        self.default_attrs = default_attrs
        self.now = now

    def unlinked(self, t: Txn, key: str, found: Any) -> list[str]:
        """The name ``key`` of a node that is not a folder is gone (unlinked, or replaced by a
        rename): it leaves its link group, whose other names get a new ctime. Returns those names."""
        if found[4] is None:
            return []
        group = load(t, key, found[4])
        if group is None:
            t.delete(pointer_key(key), SIDE)  # a stale pointer
            return []
        left = leave(t, group, key)
        self.touch(left, found[3], t, found[0])
        return left

    def touch(self, names: list[str], raw: bytes | None, t: Txn, kind: int = stat.S_IFREG) -> None:
        """A new ctime for every name of a linked node of type ``kind`` (a name was added,
        removed or moved)."""
        attrs = (Attrs.unpack(raw) if raw is not None else None) or self.default_attrs(kind)
        attrs.ctime = self.now()
        put_attrs(t, names, attrs.with_type(kind).pack())

    def regroup(self, t: Txn, moved: list[tuple[list, str, str, Any]]) -> None:
        """Link groups follow the names a rename moved: ``(records, src, dst, found)`` for each
        subtree placed from ``src`` to ``dst``. The names of a moved linked file get a new
        ctime (a folder's move leaves the files in it as they are)."""
        moves = [
            (k[len(POINTER) :], moved_key(k, src, dst)[len(POINTER) :], v)
            for records, src, dst, _ in moved
            for space, k, v in records
            if space == SIDE and k.startswith(POINTER)
        ]
        if not moves:
            return
        groups = {g.gid: g for g in renamed(t, moves)}
        for *_, found in moved:
            group = groups.get(bytes(found[4]).decode("ascii", "replace")) if found[4] else None
            if group is not None and len(group.names) > 1:
                self.touch(group.names, found[3], t, found[0])

    @staticmethod
    def same_file(t: Txn, src: str, dst: str, s: Any, d: Any) -> bool:
        """Whether ``src`` and ``dst`` are names of one node (hard links)."""
        if d is None or s[0] != d[0] or s[0] == stat.S_IFDIR or s[4] is None or s[4] != d[4]:
            return False
        group = load(t, src, s[4])
        return group is not None and dst in group.names

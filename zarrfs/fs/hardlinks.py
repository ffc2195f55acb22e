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

Here is how a group is read and what it says; its records are written by :mod:`zarrfs.fs.records`.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import Any

from zarrfs.backends.base import DATA, SIDE, Get, Read, Size, Txn
from zarrfs.fs.node import Node, stamp_of
from zarrfs.fs.sidedata import LINK_MARK, SPECIAL_MARK, entry_key, group_key

_SEP = "\0"


@dataclass
class Group:
    """A link group as one transaction read it: its id and the names whose keys exist."""

    gid: str
    names: list[str]


def _unpack(raw: bytes) -> list[str]:
    return [n for n in bytes(raw).decode("utf-8", "surrogateescape").split(_SEP) if n]


def pack_names(names: list[str]) -> bytes:
    """The record of a group's names."""
    return _SEP.join(names).encode("utf-8", "surrogateescape")


def names_in(t: Txn, gid: str) -> list[str]:
    """The names the record of group ``gid`` lists (some may be gone)."""
    raw = t.get(group_key(gid), SIDE)
    return _unpack(raw) if raw is not None else []


def present(t: Txn, names: list[str]) -> list[str]:
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
    names = names_in(t, gid)
    if key not in names:
        return None
    there = set(present(t, names))
    return Group(gid, [n for n in names if n in there or n == key])


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


def same_file(t: Txn, src: str, dst: str, s: Any, d: Any) -> bool:
    """Whether ``src`` and ``dst`` (what probes found at them: ``s``, ``d``) are names of one
    node (hard links)."""
    if d is None or s[0] != d[0] or s[0] == stat.S_IFDIR or s[4] is None or s[4] != d[4]:
        return False
    group = load(t, src, s[4])
    return group is not None and dst in group.names

"""A node: what is at a key (a file, a folder, a symlink or a special file), as lookups,
listings and opens give it; and the stamp that tells two versions of a file apart."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

from zarrfs.fs.sidedata import Attrs

FILE, DIR, LINK = stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK

#: What a probe finds at a key: (kind, stored size, link target, raw attributes, raw
#: link-group pointer of a file).
Probe = tuple[int, int, str, "bytes | None", "bytes | None"]


@dataclass(slots=True)
class Node:
    """What is at a key: its kind (FILE, DIR, LINK or a special file's type bits), size in
    bytes, attributes, a symlink's target, the count of names (0 for an open file whose name
    was removed) and, for a file with hard links, the id of their link group and its names; a
    special file's device number; ``no_xattrs``: read with its extended-attribute record, and
    it has none (False: it has some, or they were not read)."""

    kind: int
    size: int
    attrs: Attrs
    target: str = ""
    nlink: int = 1
    group: str = ""
    rdev: int = 0
    names: tuple[str, ...] = ()
    no_xattrs: bool = field(default=False, compare=False)
    #: Bytes that hold data, when known and fewer than ``size`` (an open file extended by
    #: ``ftruncate``: its hole is no data, and ``st_blocks`` must not count it).
    allocated: int | None = field(default=None, compare=False)
    #: Shown as the older version open descriptors read, which their last close ends: the
    #: kernel is to ask again rather than keep these attributes (a close's release reaches the
    #: daemon after close() returned, so a stat right after it must not find them cached).
    passing: bool = field(default=False, compare=False)


def stamp_of(node: Node) -> tuple[int, int]:
    """What tells two versions of a file apart: its size and its mtime (every commit through a
    mount records a new mtime, in nanoseconds)."""
    return node.size, node.attrs.mtime

"""The inode table: which store key each node ID the kernel holds stands for.

The kernel names files by node ID, the store by key. A node ID is handed out when a name is
looked up (or created): each reply that gives the kernel a node ID counts one lookup, and
FORGET takes counts back. A node the kernel forgot (its cache evicted it: memory pressure,
``drop_caches``) is kept, idle, while it names a key, up to :data:`IDLE_NODES` of them (the
oldest go first): looked up again, the file gets its node ID and so its inode number back,
renames followed meanwhile, as a local disk's inode numbers stay while the file lives. One
key has one node ID at a time. Node IDs are never reused (a 64-bit counter), so a stale ID
can never name another file.
The names of a file with hard links (one link group, :mod:`zarrfs.fs.hardlinks`) share one
node ID: the kernel sees one inode, whichever name it looks up.

A rename moves the keys of a node and of every node below it; an unlink detaches the node
(the kernel may still hold it open). Pure bookkeeping: no FUSE, no database. Each node is also
the :class:`~zarrfs.fs.pagecache.Pages` of the page cache policy: what it remembers of a file
lives on the node, so it goes when the kernel forgets the node.
"""

from __future__ import annotations

import stat
from collections import OrderedDict

from zarrfs.fs.api import Pages
from zarrfs.fuse.abi import ROOT_ID

#: Forgotten nodes kept for their inode numbers (about 200 bytes each).
IDLE_NODES = 65536


class Inode(Pages):
    """One node the kernel holds: its key (None once unlinked), kind (the file-type bits) and
    lookup count; as :class:`Pages`, what decides whether its cached pages may be kept. A file
    with hard links has its link group's id and, besides ``key``, its other names the kernel
    looked up (``aliases``)."""

    __slots__ = ("aliases", "group", "key", "kind", "lookups")

    def __init__(self, key: str | None, kind: int) -> None:
        # Pages' fields set here rather than by its __init__: one call less for each new node.
        self.stamp = None
        self.stamp_time = 0.0
        self.cache_ok = False
        self.bare = False
        self.key = key
        self.kind = kind
        self.lookups = 0
        self.group = ""
        self.aliases: set[str] | None = None


class InodeTable:
    """Node IDs and keys, both ways."""

    def __init__(self, root_kind: int) -> None:
        root = Inode("", root_kind)
        root.lookups = 1  # the kernel never forgets the root
        self.nodes: dict[int, Inode] = {ROOT_ID: root}
        self.ids: dict[str, int] = {"": ROOT_ID}
        self.groups: dict[str, int] = {}  # link group id -> node ID
        self.idle: OrderedDict[int, None] = OrderedDict()  # forgotten, kept: oldest first
        self._next = ROOT_ID + 1

    def __len__(self) -> int:
        return len(self.nodes)

    def get(self, nodeid: int) -> Inode | None:
        """The node with this ID, or None for one the table does not know."""
        return self.nodes.get(nodeid)

    def held(self, key: str) -> int | None:
        """The node ID of ``key`` if the kernel holds that node (not one it forgot)."""
        nodeid = self.ids.get(key)
        return None if nodeid is None or nodeid in self.idle else nodeid

    def key(self, nodeid: int) -> str | None:
        """The key of a node; None when the ID is unknown or its file was unlinked."""
        node = self.nodes.get(nodeid)
        return None if node is None else node.key

    def remember(self, key: str, kind: int, group: str = "") -> tuple[int, Inode]:
        """The node ID for ``key`` (a new one the first time, or when the kind changed), counted
        as one more lookup by the kernel. A file of link group ``group`` gets the node ID of
        the group's other names, if the kernel holds one."""
        nodeid = self.ids.get(key)
        node = None if nodeid is None else self.nodes[nodeid]
        if node is None and group:
            nodeid = self.groups.get(group)
            node = None if nodeid is None else self.nodes.get(nodeid)
            if node is not None and node.kind == kind and node.key is not None:
                node.aliases = node.aliases or set()
                node.aliases.add(key)
                self.ids[key] = nodeid
            else:
                node = None
        if node is None or node.kind != kind:
            if node is not None:
                node.key = None  # the kernel's old inode of another type: detached
            nodeid = self._next
            self._next += 1
            node = Inode(key, kind)
            self.nodes[nodeid] = node
            self.ids[key] = nodeid
        if group and node.group != group:
            self.linked(nodeid, group)
        if not node.lookups:
            self.idle.pop(nodeid, None)
        node.lookups += 1
        return nodeid, node

    def linked(self, nodeid: int, group: str) -> None:
        """The file of node ``nodeid`` is of link group ``group``: a lookup of another of its
        names gives the same node ID (as the reply to LINK must)."""
        node = self.nodes.get(nodeid)
        if node is not None and node.key is not None and group:
            node.group = group
            self.groups[group] = nodeid

    def _unname(self, nodeid: int, key: str) -> None:
        """``key`` (out of :attr:`ids` already) no longer names node ``nodeid``: a file
        keeps its other names; else the node names nothing."""
        node = self.nodes[nodeid]
        if not node.aliases:
            node.key = None
            if not node.lookups and self.idle.pop(nodeid, False) is None:
                self._drop(nodeid, node)  # forgotten by the kernel, and now nameless
        elif node.key == key:
            node.key = node.aliases.pop()
        else:
            node.aliases.discard(key)

    def forget(self, nodeid: int, count: int) -> None:
        """The kernel dropped ``count`` lookups of a node; at zero the node is gone."""
        node = self.nodes.get(nodeid)
        if node is None or nodeid == ROOT_ID:
            return
        node.lookups -= count
        if node.lookups > 0:
            return
        node.lookups = 0
        if node.key is None:
            self._drop(nodeid, node)
            return
        # The kernel's inode is gone, and with it its cached pages: nothing of them to keep.
        node.stamp, node.stamp_time, node.cache_ok = None, 0.0, False
        self.idle[nodeid] = None
        while len(self.idle) > IDLE_NODES:
            old, _ = self.idle.popitem(last=False)
            self._drop(old, self.nodes[old])

    def _drop(self, nodeid: int, node: Inode) -> None:
        del self.nodes[nodeid]
        if node.key is not None and self.ids.get(node.key) == nodeid:
            del self.ids[node.key]
        if node.group:
            for name in node.aliases or ():
                if self.ids.get(name) == nodeid:
                    del self.ids[name]
            if self.groups.get(node.group) == nodeid:
                del self.groups[node.group]

    def detach(self, key: str) -> None:
        """The file or folder at ``key`` was removed: its node (if any) names nothing now."""
        nodeid = self.ids.pop(key, None)
        if nodeid is not None:
            self._unname(nodeid, key)

    def moved(self, src: str, dst: str) -> None:
        """``src`` (and everything under it) is now ``dst``; a node at ``dst`` was replaced."""
        self.detach(dst)
        nodeid = self.ids.get(src)
        if nodeid is not None and self.nodes[nodeid].kind != stat.S_IFDIR:
            # Nothing lies below a file: no need to look through every node the kernel holds
            # (a zarr chunk is stored by a rename, and after an ``ls -l`` of a large folder the
            # kernel may hold 100,000 nodes: a search of them all for each rename).
            moving = [(src, nodeid)]
        else:
            below = src + "/"
            moving = [(k, i) for k, i in self.ids.items() if k == src or k.startswith(below)]
        for k, _ in moving:
            del self.ids[k]
        for k, nodeid in moving:
            new = dst + k[len(src) :]
            stale = self.ids.pop(new, None)
            if stale is not None:
                self._unname(stale, new)
            node = self.nodes[nodeid]
            if node.key == k or not node.aliases:
                node.key = new
            else:  # another name of a file with hard links
                node.aliases.discard(k)
                node.aliases.add(new)
            self.ids[new] = nodeid

    def exchanged(self, a: str, b: str) -> None:
        """``a`` and ``b`` swapped places (RENAME_EXCHANGE)."""
        tmp = "\0exchange"  # no key holds a NUL
        self.moved(a, tmp)
        self.moved(b, a)
        self.moved(tmp, b)

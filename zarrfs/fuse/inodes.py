"""The inode table: which store key each node ID the kernel holds stands for, kept in compact
tables so that a million listed names cost little (docs/architecture.md, "Design notes by
module")."""

from __future__ import annotations

import stat
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from zarrfs.fs.api import TWO_VERSIONS, Pages
from zarrfs.fuse.abi import ROOT_ID

#: Forgotten nodes kept for their inode numbers (about 250 bytes each).
IDLE_NODES = 65536
#: Nodes the table must have lost, and half of its largest size, before :meth:`InodeTable.shrunk`.
SHRUNK_BY = 16384
_SLOT = 0xFFFFFFFF


class Inode:
    """A view of one node of an :class:`InodeTable`: its key (None once unlinked), kind (the
    file-type bits), lookup count, link group and other names (``aliases``) of a file with
    hard links; as :class:`Pages`, what decides whether its cached pages may be kept (held by
    the table only for files that have some; the version whose attributes the kernel holds,
    ``given``, for every node)."""

    __slots__ = ("_table", "nodeid")

    def __init__(self, table: InodeTable, nodeid: int) -> None:
        self._table, self.nodeid = table, nodeid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Inode) and other._table is self._table and other.nodeid == self.nodeid

    def __hash__(self) -> int:
        return hash(self.nodeid)

    @property
    def key(self) -> str | None:
        return self._table.key(self.nodeid)

    @property
    def kind(self) -> int:
        return self._table._kinds[self.nodeid & _SLOT]

    @property
    def lookups(self) -> int:
        return self._table._lookups[self.nodeid & _SLOT]

    @property
    def group(self) -> str:
        return self._table._group.get(self.nodeid, "")

    @property
    def aliases(self) -> set[str] | None:
        return self._table._aliases.get(self.nodeid)

    def _pages(self) -> Pages:
        pages = self._table._pages.get(self.nodeid)
        if pages is None:
            pages = self._table._pages[self.nodeid] = Pages()
        return pages

    @property
    def stamp(self) -> tuple[int, int] | None:
        pages = self._table._pages.get(self.nodeid)
        return None if pages is None else pages.stamp

    @stamp.setter
    def stamp(self, value: tuple[int, int] | None) -> None:
        if value is not None or self.nodeid in self._table._pages:
            self._pages().stamp = value

    @property
    def stamp_time(self) -> float:
        pages = self._table._pages.get(self.nodeid)
        return 0.0 if pages is None else pages.stamp_time

    @stamp_time.setter
    def stamp_time(self, value: float) -> None:
        if value or self.nodeid in self._table._pages:
            self._pages().stamp_time = value

    @property
    def cache_ok(self) -> bool:
        pages = self._table._pages.get(self.nodeid)
        return pages is not None and pages.cache_ok

    @cache_ok.setter
    def cache_ok(self, value: bool) -> None:
        if value or self.nodeid in self._table._pages:
            self._pages().cache_ok = value

    @property
    def bare(self) -> bool:
        pages = self._table._pages.get(self.nodeid)
        return pages is not None and pages.bare

    @bare.setter
    def bare(self, value: bool) -> None:
        if value or self.nodeid in self._table._pages:
            self._pages().bare = value

    def remembered(self) -> bool:
        pages = self._table._pages.get(self.nodeid)
        return pages is not None and pages.remembered()

    @property
    def heard(self) -> bool:
        """Another writer's change of the file was heard since its last open: a reply sent
        meanwhile may have shown a version whose attributes the kernel ignored (it ignores
        those of a request sent before a drop), so ``given`` may name a size it does not hold."""
        return self.nodeid in self._table._heard

    @heard.setter
    def heard(self, value: bool) -> None:
        if value:
            self._table._heard.add(self.nodeid)
        else:
            self._table._heard.discard(self.nodeid)

    @property
    def given(self) -> int:
        return self._table._given[self.nodeid & _SLOT]

    @given.setter
    def given(self, value: int) -> None:
        self._table._given[self.nodeid & _SLOT] = value


class _Nodes:
    """The table's nodes by ID, as a read-only mapping of :class:`Inode` views."""

    __slots__ = ("_table",)

    def __init__(self, table: InodeTable) -> None:
        self._table = table

    def get(self, nodeid: int, default: Inode | None = None) -> Inode | None:
        return Inode(self._table, nodeid) if self._table._live(nodeid) else default

    def __getitem__(self, nodeid: int) -> Inode:
        if not self._table._live(nodeid):
            raise KeyError(nodeid)
        return Inode(self._table, nodeid)

    def __contains__(self, nodeid: object) -> bool:
        return isinstance(nodeid, int) and self._table._live(nodeid)

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[int]:
        t = self._table
        return (t._gens[s] << 32 | s for s in range(1, len(t._kinds)) if t._kinds[s])


class Checked:
    """The node table as one READDIRPLUS reply asks it whether it holds the names listed
    (``fs.listing.Held``), noting whether every :meth:`holds_none` found none. A folder's first
    listing asks of each name up to three times at 10^6 names the dict no longer in the
    caches: by its window, by the reply, and when the reply numbers them; the last is spared
    when :meth:`still_none`."""

    __slots__ = ("holds", "_table", "_added", "_none")

    def __init__(self, table: InodeTable) -> None:
        self._table = table
        self.holds = table.holds
        self._added = table.added  # before the first ask: a name given a node after it counts
        self._none = True

    def holds_none(self, keys: list[str]) -> bool:
        """:meth:`InodeTable.holds_none`, noted."""
        if self._table.holds_none(keys):
            return True
        self._none = False
        return False

    @property
    def added(self) -> int:
        """:attr:`InodeTable.added` now (``fs.listing.Held.added``)."""
        return self._table.added

    def still_none(self) -> bool:
        """Whether every ask found none and no name was given a node since the first (other
        requests run while one waits on a server): the names asked of are all still new."""
        return self._none and self._table.added == self._added


class InodeTable:
    """Node IDs and keys, both ways, in compact tables (docs/architecture.md, "Design notes by module")."""

    def __init__(self, root_kind: int) -> None:
        assert ROOT_ID == 1  # slot 1, generation 0
        self.ids: dict[str, int] = {"": ROOT_ID}  # key -> node ID, for every node that names one
        self._keys: list[str | None] = [None, ""]  # slot -> key (None: unlinked, or a free slot)
        self._kinds = array("I", [0, root_kind])  # slot -> file-type bits; 0: a free slot
        self._lookups = array("Q", [0, 1])  # the kernel never forgets the root
        self._gens = array("I", [0, 0])  # slot -> generation of its node
        # slot -> the version whose attributes the kernel holds (fs.pagecache.version_mark; 0: none)
        self._given = array("Q", [0, 0])
        self._free = array("I")  # free slots, the last freed used first
        self._count = 1
        self._pages: dict[int, Pages] = {}  # node ID -> page cache state, for files that have one
        self._heard: set[int] = set()  # node IDs of files changed elsewhere since their last open
        self._granted: set[int] = set()  # node IDs of files a lock was granted on (lock_granted)
        self._group: dict[int, str] = {}  # node ID -> its link group
        self._aliases: dict[int, set[str]] = {}  # node ID -> its other names
        self.groups: dict[str, int] = {}  # link group id -> node ID
        # slot -> 1 when its node's extended attributes were read as none (a byte a node: a
        # set of node IDs took 32 bytes a name at 10^6 names listed)
        self._bare = bytearray(2)
        self.idle: OrderedDict[int, None] = OrderedDict()  # forgotten, kept: oldest first
        self.nodes = _Nodes(self)
        self._peak = 1  # the most nodes held since the table last shrank
        #: Names given a node, counted since the table began (a name given one again counts
        #: again): while it stays, no name absent from :attr:`ids` came into it.
        self.added = 0

    def __len__(self) -> int:
        return self._count

    def _live(self, nodeid: int) -> bool:
        slot = nodeid & _SLOT
        return 0 < slot < len(self._kinds) and self._kinds[slot] != 0 and self._gens[slot] == nodeid >> 32

    def get(self, nodeid: int) -> Inode | None:
        """The node with this ID, or None for one the table does not know."""
        return Inode(self, nodeid) if self._live(nodeid) else None

    def held(self, key: str) -> int | None:
        """The node ID of ``key`` if the kernel holds that node (not one it forgot)."""
        nodeid = self.ids.get(key)
        return None if nodeid is None or nodeid in self.idle else nodeid

    def holds(self, key: str, kind: int) -> bool:
        """Whether the kernel holds the node of ``key`` as a node of type ``kind`` (the
        ``stat.S_IFMT`` bits): a listing may then give the name alone (see ``fuse.dirreq``)."""
        nodeid = self.ids.get(key)  # held(), inlined: asked of every listed name, twice
        return nodeid is not None and nodeid not in self.idle and self._kinds[nodeid & _SLOT] == kind

    def holds_none(self, keys: list[str]) -> bool:
        """Whether the table has no node of any of ``keys`` (a folder's first listing): then
        :meth:`holds` is asked of none of them (``fs.listing.Held``)."""
        return self.ids.keys().isdisjoint(keys)

    def bare_of_xattrs(self, nodeid: int) -> bool:
        """Whether the node's extended attributes were last read as none, and nothing told of
        a change to them since (:meth:`xattrs_read`, :meth:`xattrs_changed`): the kernel caches
        no extended attributes and ``ls -l`` asks each file's ``security.selinux`` every time,
        so a mount that follows a change feed answers those from here, as the kernel answers
        ``stat`` from the attributes it keeps under the same feed."""
        return self._live(nodeid) and self._bare[nodeid & _SLOT] == 1

    def xattrs_read(self, nodeid: int, none: bool) -> None:
        """The node's extended attributes were read now: ``none``, or some."""
        if not self._live(nodeid):
            return
        slot = nodeid & _SLOT
        if not none:
            self._bare[slot] = 0
        elif self._lookups[slot]:
            self._bare[slot] = 1

    def xattrs_changed(self, nodeid: int | None = None) -> None:
        """The node's extended attributes may have changed (None: every node's)."""
        if nodeid is None:
            self._bare[:] = bytes(len(self._bare))
        elif self._live(nodeid):
            self._bare[nodeid & _SLOT] = 0

    def key(self, nodeid: int) -> str | None:
        """The key of a node; None when the ID is unknown or its file was unlinked."""
        return self._keys[nodeid & _SLOT] if self._live(nodeid) else None

    def _new(self, key: str, kind: int) -> int:
        if self._free:
            slot = self._free.pop()
            self._gens[slot] += 1
            self._keys[slot], self._kinds[slot], self._lookups[slot] = key, kind, 0
            self._given[slot] = self._bare[slot] = 0
        else:
            slot = len(self._kinds)
            self._keys.append(key)
            self._kinds.append(kind)
            self._lookups.append(0)
            self._gens.append(0)
            self._given.append(0)
            self._bare.append(0)
        self._count += 1
        nodeid = self._gens[slot] << 32 | slot
        self.ids[key] = nodeid
        self.added += 1
        return nodeid

    def remember(
        self, key: str, kind: int, group: str = "", names: Iterable[str] = (), no_xattrs: bool = False
    ) -> tuple[int, Inode]:
        """The node ID for ``key`` (a new one the first time, or when the kind changed), counted
        as one more lookup by the kernel; ``no_xattrs``: its extended attributes were read
        now, and it has none (:meth:`xattrs_read`). A file of link group ``group`` (whose names are
        ``names``) gets the node ID of the group's other names, if the table has one: the
        group's node, or the node of another of its names (looked up before its link group was
        known here: a link made elsewhere, which the change feed has not told yet)."""
        nodeid = self.ids.get(key)
        shared = self._node_of_group(key, kind, group, names) if group else None
        if (
            nodeid is not None
            and shared is not None
            and shared != nodeid
            and not self._lookups[nodeid & _SLOT]
            and nodeid not in self._group
        ):
            # Numbered by a listing before its link group was known: the group's node wins.
            self.idle.pop(nodeid, None)
            self._drop(nodeid)
            nodeid = None
        if nodeid is None and shared is not None:
            self._aliases.setdefault(shared, set()).add(key)
            self.ids[key] = nodeid = shared
            self.added += 1
        if nodeid is not None and self._kinds[nodeid & _SLOT] != kind:
            self._unname(nodeid, key, detach_all=True)  # the kernel's old inode of another type
            nodeid = None
        if nodeid is None:
            nodeid = self._new(key, kind)
        if group and self._group.get(nodeid) != group:
            self.linked(nodeid, group)
        slot = nodeid & _SLOT
        if not self._lookups[slot]:
            self.idle.pop(nodeid, None)
        self._lookups[slot] += 1
        if no_xattrs:
            self._bare[slot] = 1
        return nodeid, Inode(self, nodeid)

    def remember_plains(
        self,
        keys: Sequence[str],
        kinds: Sequence[int],
        marks: Sequence[int],
        bare: Sequence[bool] | None,
        new: bool = False,
    ) -> Sequence[int]:
        """:meth:`remember_plain` of many names (a READDIRPLUS reply's) in one call: their node
        IDs; ``bare`` None: none is. Names all new to a table with no free slot (a folder's
        first listing) are appended to its columns at once; ``new``: the caller knows them
        all new (:meth:`Checked.still_none`), and the table does not look for them again."""
        ids = self.ids
        if not self._free and (new or ids.keys().isdisjoint(keys)):
            slot = len(self._kinds)
            n = len(keys)
            # Generation 0: the node ID is the slot. One int object a node, shared by the
            # table's dict and set (a range iterated twice would make two).
            numbered = list(range(slot, slot + n))
            self._keys.extend(keys)
            self._kinds.extend(kinds)
            self._lookups.extend([1] * n)
            self._gens.frombytes(bytes(self._gens.itemsize * n))
            self._given.extend(marks)
            self._bare.extend(bytes(n) if bare is None else bare)
            ids.update(zip(keys, numbered, strict=True))
            self._count += n
            self.added += n
            return numbered
        one = self.remember_plain
        if bare is None:
            bare = [False] * len(keys)
        return [one(*name) for name in zip(keys, kinds, marks, bare, strict=True)]

    def remember_plain(self, key: str, kind: int, mark: int, bare: bool) -> int:
        """:meth:`remember` of a name with no link group, in one call (a lookup's common case,
        each of a listing's names): its node ID, counted as one more lookup; ``bare``: read
        now with no extended attributes; ``mark``: the version it was shown as
        (:attr:`Inode.given`, as ``fs.pagecache.given_after`` makes it; 0 leaves it), set here
        for a node without page state (one with some is left to the page cache policy:
        :meth:`paged`)."""
        nodeid = self.ids.get(key)
        if nodeid is None:
            nodeid = self._new(key, kind)
            slot = nodeid & _SLOT
            self._lookups[slot] = 1
        else:
            slot = nodeid & _SLOT
            if self._kinds[slot] != kind or nodeid in self._group:
                nodeid = self.remember(key, kind)[0]
                slot = nodeid & _SLOT
            else:
                if not self._lookups[slot]:
                    self.idle.pop(nodeid, None)
                self._lookups[slot] += 1
        if bare:
            self._bare[slot] = 1
        if mark and nodeid not in self._pages:
            given = self._given[slot]
            self._given[slot] = mark if not given or given == mark else TWO_VERSIONS  # given_after
        return nodeid

    def lock_granted(self, nodeid: int) -> None:
        """A lock on the file was granted: its attributes were dropped and the file is read
        from the newest stored version on, so a change the change feed tells of next may be
        one the kernel was shown since (:meth:`granted_since`)."""
        self._granted.add(nodeid)

    def granted_since(self, nodeid: int) -> bool:
        """Whether a lock on the file was granted since the change feed last told of it (the
        mark is taken: asked once a change)."""
        if nodeid in self._granted:
            self._granted.discard(nodeid)
            return True
        return False

    def paged_among(self, ids: Sequence[int]) -> list[int]:
        """The places in ``ids`` of nodes with page state (most listings: none)."""
        pages = self._pages
        return [i for i, nodeid in enumerate(ids) if nodeid in pages] if pages else []

    def paged(self, nodeid: int) -> bool:
        """Whether the node has page state (:class:`Pages` beyond ``given``)."""
        return nodeid in self._pages

    def _node_of_group(self, key: str, kind: int, group: str, names: Iterable[str]) -> int | None:
        """The node of the link group ``group`` for its name ``key``: the group's, else that of
        another of its ``names`` not of another group; None when there is none (of ``kind``,
        and naming a key)."""
        nodeid = self.groups.get(group)
        if nodeid is None:
            for name in names:
                other = self.ids.get(name) if name != key else None
                if other is not None and self._group.get(other, group) == group:
                    nodeid = other
                    break
        if nodeid is None or not self._live(nodeid) or self._kinds[nodeid & _SLOT] != kind:
            return None
        return None if self._keys[nodeid & _SLOT] is None else nodeid

    def number(self, key: str, kind: int) -> int:
        """The inode number a listing shows for ``key`` (``d_ino``): its node ID, or a new one
        kept idle like a forgotten node, so that the lookup that follows gives the same
        number (unless :data:`IDLE_NODES` newer ones pushed it out)."""
        nodeid = self.ids.get(key)
        if nodeid is not None and self._kinds[nodeid & _SLOT] == kind:
            return nodeid
        if nodeid is not None:
            del self.ids[key]
            self._unname(nodeid, key)
        nodeid = self._new(key, kind)
        self.idle[nodeid] = None
        while len(self.idle) > IDLE_NODES:
            old, _ = self.idle.popitem(last=False)
            self._drop(old)
        return nodeid

    def numbered(self, key: str, nodeid: int, entries: Iterable[tuple[str, int, int]]) -> Iterator[tuple]:
        """The ``(name, kind, offset)`` entries of a listing of folder ``key`` (node ``nodeid``)
        with their inode numbers, those ``stat`` gives (``d_ino``)."""
        prefix = key + "/" if key else ""
        number = self.number
        for name, kind, offset in entries:
            if name == ".":
                yield name, kind, offset, nodeid
            elif name == "..":
                yield name, kind, offset, (self.ids.get(key.rpartition("/")[0]) if key else None) or ROOT_ID
            else:
                yield name, kind, offset, number(prefix + name, kind)

    def linked(self, nodeid: int, group: str) -> None:
        """The file of node ``nodeid`` is of link group ``group``: a lookup of another of its
        names gives the same node ID (as the reply to LINK must)."""
        if group and self.key(nodeid) is not None:
            self._group[nodeid] = group
            self.groups[group] = nodeid

    def regrouped(self, nodeid: int, group: str) -> None:
        """The file of node ``nodeid`` is now of link group ``group``, or of none (""): its
        old group was dissolved elsewhere, or it was linked again."""
        old = self._group.pop(nodeid, None)
        if old is not None and self.groups.get(old) == nodeid:
            del self.groups[old]
        self.linked(nodeid, group)

    def names(self, nodeid: int) -> list[str]:
        """Every name of a node: its key and its other names (none once unlinked)."""
        key = self.key(nodeid)
        return [] if key is None else [key, *sorted(self._aliases.get(nodeid, ()))]

    def _unname(self, nodeid: int, key: str, detach_all: bool = False) -> None:
        """``key`` (out of :attr:`ids` already, unless ``detach_all``) no longer names node
        ``nodeid``: a file keeps its other names; else (or with ``detach_all``) the node names
        nothing."""
        slot = nodeid & _SLOT
        aliases = self._aliases.get(nodeid)
        if detach_all or not aliases:
            for name in (self._keys[slot], *(aliases or ())):
                if name is not None and self.ids.get(name) == nodeid:
                    del self.ids[name]
            self._keys[slot] = None
            self._aliases.pop(nodeid, None)
            self._bare[slot] = 0
            if not self._lookups[slot] and self.idle.pop(nodeid, False) is None:
                self._drop(nodeid)  # forgotten by the kernel, and now nameless
        elif self._keys[slot] == key:
            self._keys[slot] = aliases.pop()
        else:
            aliases.discard(key)

    def forget(self, nodeid: int, count: int) -> None:
        """The kernel dropped ``count`` lookups of a node; at zero the node is gone."""
        if nodeid == ROOT_ID or not self._live(nodeid):
            return
        slot = nodeid & _SLOT
        left = self._lookups[slot] - count
        if left > 0:
            self._lookups[slot] = left
            return
        self._lookups[slot] = 0
        if self._keys[slot] is None:
            self._drop(nodeid)
            return
        # The kernel's inode is gone, and with it its cached pages: nothing of them to keep. The
        # change feed is not followed for forgotten nodes: what was read of them is dropped.
        self._pages.pop(nodeid, None)
        self._given[slot] = 0
        self._heard.discard(nodeid)
        self._granted.discard(nodeid)
        self._bare[slot] = 0
        self.idle[nodeid] = None
        while len(self.idle) > IDLE_NODES:
            old, _ = self.idle.popitem(last=False)
            self._drop(old)

    def _drop(self, nodeid: int) -> None:
        slot = nodeid & _SLOT
        key = self._keys[slot]
        if key is not None and self.ids.get(key) == nodeid:
            del self.ids[key]
        for name in self._aliases.pop(nodeid, ()):
            if self.ids.get(name) == nodeid:
                del self.ids[name]
        group = self._group.pop(nodeid, None)
        if group is not None and self.groups.get(group) == nodeid:
            del self.groups[group]
        self._pages.pop(nodeid, None)
        self._heard.discard(nodeid)
        self._granted.discard(nodeid)
        self._keys[slot], self._kinds[slot], self._lookups[slot] = None, 0, 0
        self._given[slot] = self._bare[slot] = 0
        self._free.append(slot)
        self._count -= 1

    def detach(self, key: str) -> None:
        """The file or folder at ``key`` was removed: its node (if any) names nothing now."""
        nodeid = self.ids.pop(key, None)
        if nodeid is not None:
            self._unname(nodeid, key)

    def moved(self, src: str, dst: str) -> None:
        """``src`` (and everything under it) is now ``dst``; a node at ``dst`` was replaced."""
        self.detach(dst)
        nodeid = self.ids.get(src)
        if nodeid is not None and self._kinds[nodeid & _SLOT] != stat.S_IFDIR:
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
            slot = nodeid & _SLOT
            aliases = self._aliases.get(nodeid)
            if self._keys[slot] == k or not aliases:
                self._keys[slot] = new
            else:  # another name of a file with hard links
                aliases.discard(k)
                aliases.add(new)
            self.ids[new] = nodeid
            self.added += 1

    def exchanged(self, a: str, b: str) -> None:
        """``a`` and ``b`` swapped places (RENAME_EXCHANGE)."""
        tmp = "\0exchange"  # no key holds a NUL
        self.moved(a, tmp)
        self.moved(b, a)
        self.moved(tmp, b)

    def shrunk(self) -> bool:
        """Whether the table lost half its nodes, and at least :data:`SHRUNK_BY`, since it
        was largest (or since the last True). Its dicts are then made again at their size (a
        dict keeps its largest table through deletions: 300,000 names forgotten left ~20 MB
        of empty slots), and the memory the nodes took may go back to the system."""
        n = self._count
        if n > self._peak:
            self._peak = n
        elif self._peak - n >= max(SHRUNK_BY, self._peak // 2):
            self._peak = n
            for table in (self.ids, self.idle):  # in place: others hold them
                kept = table.copy()
                table.clear()
                table.update(kept)
            return True
        return False

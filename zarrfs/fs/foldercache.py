"""Snapshots of busy folders, so that a burst of lookups in one folder costs one listing: whole up
to a page, or up to :data:`WHOLE` names when the lookups find the names they look for and come
fast enough to pay for it, by pages beyond, dropped by any write of this mount, bounded by
``-o dir_cache_entries=`` (docs/architecture.md, "Caches")."""

from __future__ import annotations

import time
from collections.abc import Callable

from zarrfs.fs.node import Node

HOT = 32  # lookups in one folder, within ttl, that make it worth a snapshot (or another page)
LIMIT = 1024  # entries of the largest folder read whole, and of a page of a larger one
#: Entries of the largest folder read whole when the lookups that made it busy found their
#: names (a ``stat`` of each file, in any order) and came fast enough: a page answers only the
#: names that follow the one looked up in the folder's order, and a numeric loop (``0``, ``1``,
#: ... ``19999``) or names at random would miss most of them. Names looked up and not found (a
#: zarr client probing missing chunks) never make a whole read.
WHOLE = 32768
#: Names read into a snapshot that one lookup it answers pays for: a lookup no snapshot answers
#: costs about as much as six names read (docs/performance.md, "`stat` in an order other than
#: the folder's"). A whole read is at most this many names a lookup of a lifetime at the rate
#: the lookups came; a folder found larger costs the scan of its names, tried again only at
#: twice that size (or the bound), so that the scans of one folder add up to twice the last.
PAY = 6
PAGES = 4  # pages of one folder kept at once (the oldest goes first)
FOLDERS = 8  # folders with snapshots kept at once (the oldest goes first)
WORTH = 8  # a snapshot must answer a lookup per this many entries to be made again
#: How long a folder not worth it is looked up name by name, in lifetimes: long enough to spare
#: a sparse reader page after page, short enough that a ``stat`` loop slowed down by a loaded
#: machine (a numeric loop, whose 4-digit names' pages pay least) gets pages again for the
#: names after, which pay (docs/performance.md, "`stat` in an order other than the folder's").
SKIP_LIFETIMES = 2
#: A page pushed out by a newer one of its folder having answered fewer than a lookup per this
#: many names it read (names looked up at random over more than the pages hold: each miss would
#: read a page that goes before it pays) has the folder looked up name by name for
#: :data:`PUSHED_SKIP` lifetimes: long enough to stop a thrash, short enough to catch the next
#: run of names looked up in order.
PUSHED_WORTH = 16
PUSHED_SKIP = 0.3
ENTRIES = 65536  # entries of every snapshot together

#: What :meth:`FolderCache.find` returns when it cannot answer: the caller looks the name up.
MISS = object()

#: ``read(folder, after, limit)``: up to ``limit`` children of ``folder`` by name, those after
#: the name ``after`` (None: from the first), and the last name read when the folder has more
#: after it (None: it was read to its end). Called ``read(folder, None, limit, True)`` for a
#: whole read, which may return no nodes at all when the folder has more than ``limit``
#: children. The folder is an argument, not bound in beforehand: a lookup makes no object.
Read = Callable[..., tuple[dict[str, Node], str | None]]


class FolderCache:
    """Snapshots of folders (name -> :class:`Node`, whole or by pages), each valid for ``ttl``
    seconds."""

    def __init__(
        self,
        ttl: float,
        hot: int = HOT,
        limit: int = LIMIT,
        folders: int = FOLDERS,
        clock: Callable[[], float] = time.monotonic,
        entries: int = ENTRIES,
        pages: int = PAGES,
        whole: int = WHOLE,
    ) -> None:
        self.ttl = ttl
        self.hot = hot
        self.limit = min(limit, entries)
        self.whole = max(self.limit, min(whole, entries // 2))
        self.folders = folders
        self.pages = pages
        self.entries = entries  # the bound of what the snapshots hold together
        self.held = 0  # entries the snapshots hold now
        self.clock = clock
        self._snapshots: dict[str, _Folder] = {}
        # folder -> [window start, lookups missed, of which found their name (:meth:`found_name`)]
        self._misses: dict[str, list[float | int]] = {}
        self._quiet_until = 0.0
        self.builds = 0
        self.hits = 0  # lookups a snapshot answered

    @property
    def folders_held(self) -> int:
        """Folders with a snapshot (whole or pages) now (read by the status thread while the
        serving thread may change them)."""
        for _ in range(10):
            try:
                return sum(1 for f in tuple(self._snapshots.values()) if f.pages)
            except RuntimeError:  # changed while copied
                continue
        return 0

    def answer(self, folder: str, name: str) -> Node | None | object:
        """The node of ``name`` in ``folder`` from a fresh page that covers it (None: no such
        name), or :data:`MISS`: :meth:`find` without reading or counting anything, the first
        thing each lookup asks, kept short: a lookup's reply waits for it (docs/performance.md,
        "Cold `stat`: a shorter road to the reply")."""
        found = self._snapshots.get(folder)
        if found is not None:
            now = self.clock()
            for page in found.pages:
                if now - page.made < self.ttl and page.covers(name):
                    page.hits += 1
                    self.hits += 1
                    return page.nodes.get(name)
        return MISS

    def find(self, folder: str, name: str, read: Read) -> Node | None | object:
        """The node of ``name`` in ``folder`` from a fresh snapshot that covers it (None: no
        such name), reading a page now when the folder is busy; :data:`MISS` when no snapshot
        answers (the folder is not busy enough, not worth it, or the page just read starts
        after ``name``): then the caller looks the name up itself."""
        node = self.answer(folder, name)
        return node if node is not MISS else self.missed(folder, name, read)

    def missed(self, folder: str, name: str, read: Read) -> Node | None | object:
        """:meth:`find` once :meth:`answer` missed: old pages retired, the lookup counted, and
        a page (or the whole folder) read when the folder is busy."""
        now = self.clock()
        if now < self._quiet_until:
            return MISS
        found = self._snapshots.get(folder)
        if found is not None:
            for page in list(found.pages):
                if now - page.made >= self.ttl:
                    self._retire(found, page, now, WORTH, SKIP_LIFETIMES)
            if now < found.skip_until:
                return MISS
        count = self._misses.get(folder)
        if count is None or now - count[0] > self.ttl:
            if len(self._misses) > 4 * self.folders * self.hot:
                self._misses.clear()
            self._misses[folder] = count = [now, 0, 0]
        count[1] += 1
        if count[1] < self.hot:
            return MISS
        del self._misses[folder]
        if 2 * count[2] >= count[1]:  # most of the names looked up were there
            # As many names as a lifetime's lookups at this rate pay for: then the whole
            # folder, when it has no more (a larger one cost only the scan of its names).
            rate = (count[1] - 1) / max(now - count[0], 1e-9)
            budget = int(min(self.whole, PAY * rate * self.ttl))
            tried = 0 if found is None else found.larger_than  # doubled before it is tried again
            if budget > max(self.limit, tried) and budget >= min(self.whole, 2 * tried):
                nodes, last = read(folder, None, budget, True)
                if last is None:
                    self.builds += 1
                    self._add(folder, _Page(now, None, None, nodes))
                    return nodes.get(name)
                found = self._known(folder)
                found.large = True
                found.larger_than = budget
        # The first read starts at the folder's first name (all of it, when it fits); once a
        # folder is known larger than a page, a page starts at the name looked up.
        after = name if found is not None and found.large else None
        nodes, last = read(folder, after, self.limit)
        self.builds += 1
        page = _Page(now, after, last, nodes)
        self._add(folder, page)
        return page.nodes.get(name) if page.covers(name) else MISS

    def found_name(self, folder: str) -> None:
        """A lookup in ``folder`` no snapshot answered found its name: counted towards a whole
        read of the folder (:data:`WHOLE`)."""
        count = self._misses.get(folder)
        if count is not None:
            count[2] += 1

    def _known(self, folder: str) -> _Folder:
        """The record of what is known of ``folder``, made when there is none."""
        found = self._snapshots.get(folder)
        if found is None:
            if len(self._snapshots) > 4 * self.folders * self.hot:  # what is known of many folders
                for other in [f for f, snap in self._snapshots.items() if not snap.pages]:
                    del self._snapshots[other]
            found = self._snapshots[folder] = _Folder()
        return found

    def _add(self, folder: str, page: _Page) -> None:
        found = self._known(folder)
        if page.last is not None:
            found.large = True
        if page.after is None and page.last is None:  # the whole folder: no other page counts
            for old in found.pages:
                self.held -= len(old.nodes)
            found.pages = []
        while len(found.pages) >= self.pages:
            self._retire(found, found.pages[0], page.made, PUSHED_WORTH, PUSHED_SKIP)
        size = len(page.nodes)
        while self.held + size > self.entries:
            other = next((f for f, snap in self._snapshots.items() if f != folder and snap.pages), None)
            if other is not None:
                self._drop(other)
            elif found.pages:
                self.held -= len(found.pages.pop(0).nodes)
            else:
                break
        while sum(1 for snap in self._snapshots.values() if snap.pages) >= self.folders + bool(found.pages):
            other = next((f for f, snap in self._snapshots.items() if f != folder and snap.pages), None)
            if other is None:
                break
            self._drop(other)
        found.pages.append(page)
        self.held += size
        # The newest last: eviction takes the folder read longest ago.
        self._snapshots[folder] = self._snapshots.pop(folder)

    def _retire(self, found: _Folder, page: _Page, now: float, worth: int, lifetimes: float) -> None:
        """Drop a page (past its lifetime, or pushed out by a newer one); one that answered
        fewer than a lookup per ``worth`` names, too few for what reading it cost (a zarr
        client probing a few chunk keys of a large folder, names looked up at random), has
        the folder looked up name by name for ``lifetimes`` lifetimes."""
        found.pages.remove(page)
        self.held -= len(page.nodes)
        if page.hits * worth < len(page.nodes):
            found.skip_until = max(found.skip_until, now + self.ttl * lifetimes)

    def _drop(self, folder: str) -> None:
        found = self._snapshots.get(folder)
        if found is None:
            return
        for page in found.pages:
            self.held -= len(page.nodes)
        found.pages = []
        if not found.large and found.skip_until == 0.0:
            del self._snapshots[folder]

    def clear(self) -> None:
        """Forget every snapshot (the mount changed something), and make none for ``ttl``: a
        folder being written to would be read again and again (creating 20,000 files, each
        after a lookup of its name, would read the growing folder every few files). What is
        known of a folder (larger than a page, not worth a snapshot) stays known."""
        for folder in list(self._snapshots):
            self._drop(folder)
        self._misses.clear()
        self._quiet_until = self.clock() + self.ttl

    def seen(self, folder: str, name: str, node: Node) -> None:
        """``name`` was just read from the database as ``node`` (an open): a snapshot that
        holds it shows that, not an older version the change feed has not told of yet."""
        found = self._snapshots.get(folder)
        if found is not None:
            for page in found.pages:
                if name in page.nodes:
                    page.nodes[name] = node

    def forget(self, folders: set[str] | None = None) -> None:
        """Drop the snapshots of ``folders`` (None: all): another writer changed names in them
        (:mod:`zarrfs.fs.changes`). Unlike :meth:`clear`, snapshots are made again at once."""
        for folder in list(self._snapshots) if folders is None else folders:
            self._drop(folder)


class _Page:
    """Names of a folder read at once: those after ``after`` (None: from the first) up to
    ``last`` (None: to the folder's end), when, and the lookups answered."""

    __slots__ = ("made", "after", "last", "nodes", "hits")

    def __init__(self, made: float, after: str | None, last: str | None, nodes: dict[str, Node]) -> None:
        self.made = made
        self.after = after
        self.last = last
        self.nodes = nodes
        self.hits = 0

    def covers(self, name: str) -> bool:
        """Whether the page tells if ``name`` is in the folder."""
        return (self.after is None or name > self.after) and (self.last is None or name <= self.last)


class _Folder:
    """What is held and known of one folder: its pages (one, whole, for a folder that fits),
    whether it is larger than a page, the size of the largest whole read it did not fit (0:
    none tried), and until when it is looked up name by name."""

    __slots__ = ("pages", "large", "larger_than", "skip_until")

    def __init__(self) -> None:
        self.pages: list[_Page] = []
        self.large = False
        self.larger_than = 0
        self.skip_until = 0.0

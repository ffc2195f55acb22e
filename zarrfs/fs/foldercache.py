"""Snapshots of busy folders, so that a burst of lookups in one folder costs one listing.

A lookup the kernel has not cached is a round trip to a remote database. When one folder gets
:data:`HOT` lookups within ``ttl``, it is read once (names with sizes and attributes, one batch of
reads) and answers further lookups until the snapshot is ``ttl`` old, the trade rclone's directory
cache and gcsfuse's stat cache make. Each write transaction of this mount drops every snapshot
(the tree calls :meth:`FolderCache.clear`) and none is made for ``ttl`` after, so the mount's own
changes show at once and a folder being filled is not read over and over; another writer's
changes show within ``ttl`` plus the kernel's ``cache_timeout``. ``-o dir_cache=0`` turns it off.
A folder of more than ``limit`` entries, or whose last snapshot answered fewer lookups than an
eighth of its entries, is looked up name by name for ten times ``ttl``. All snapshots together
hold at most ``entries`` entries (``-o dir_cache_entries=``, default :data:`ENTRIES`, a few hundred
bytes each), the oldest dropped first; ``zarrfs status`` shows the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zarrfs.fs.node import Node

HOT = 32  # lookups in one folder, within ttl, that make it worth a snapshot
LIMIT = 32768  # entries of the largest folder snapshotted
FOLDERS = 8  # snapshots kept at once (the oldest goes first)
WORTH = 8  # a snapshot must answer a lookup per this many entries to be made again
SKIP_LIFETIMES = 10  # how long a folder too large or not worth it is looked up name by name
ENTRIES = 65536  # entries of every snapshot together


class FolderCache:
    """Snapshots of folders (name -> :class:`Node`), each valid for ``ttl`` seconds."""

    def __init__(
        self,
        ttl: float,
        hot: int = HOT,
        limit: int = LIMIT,
        folders: int = FOLDERS,
        clock: Callable[[], float] = time.monotonic,
        entries: int = ENTRIES,
    ) -> None:
        self.ttl = ttl
        self.hot = hot
        self.limit = min(limit, entries)
        self.folders = folders
        self.entries = entries  # the bound of what the snapshots hold together
        self.held = 0  # entries the snapshots hold now
        self.clock = clock
        self._snapshots: dict[str, _Snapshot] = {}
        self._misses: dict[str, list[float | int]] = {}  # folder -> [window start, count]
        self._quiet_until = 0.0
        self.builds = 0

    def snapshot(self, folder: str, build: Callable[[int], dict[str, Node] | None]) -> dict[str, Node] | None:
        """The snapshot of ``folder`` if one is fresh, or now made (``build(limit)`` lists the
        folder; None when it has more than ``limit`` entries); None when the folder is not
        busy enough, too large, or not worth it: then the caller looks the name up itself."""
        now = self.clock()
        if now < self._quiet_until:
            return None
        found = self._snapshots.get(folder)
        if found is not None:
            if found.nodes is None:  # too large, or not worth reading whole
                if now - found.made < self.ttl * SKIP_LIFETIMES:
                    return None
            elif now - found.made < self.ttl:
                found.hits += 1
                return found.nodes
            elif found.hits * WORTH < len(found.nodes):
                # It answered too few lookups for what reading the folder cost (a zarr client
                # probing a few chunk keys of a large folder): look names up one by one.
                self.held -= len(found.nodes)
                found.made, found.nodes = now, None
                return None
            self._drop(folder)
        count = self._misses.get(folder)
        if count is None or now - count[0] > self.ttl:
            if len(self._misses) > 4 * self.folders * self.hot:
                self._misses.clear()
            self._misses[folder] = count = [now, 0]
        count[1] += 1
        if count[1] < self.hot:
            return None
        del self._misses[folder]
        nodes = build(self.limit)
        self.builds += 1
        size = 0 if nodes is None else len(nodes)
        while self._snapshots and (len(self._snapshots) >= self.folders or self.held + size > self.entries):
            self._drop(next(iter(self._snapshots)))
        self._snapshots[folder] = _Snapshot(now, nodes)
        self.held += size
        return nodes

    def _drop(self, folder: str) -> None:
        found = self._snapshots.pop(folder, None)
        if found is not None and found.nodes is not None:
            self.held -= len(found.nodes)

    def clear(self) -> None:
        """Forget every snapshot (the mount changed something), and make none for ``ttl``: a
        folder being written to would be read again and again (creating 20,000 files, each
        after a lookup of its name, would read the growing folder every few files). A folder
        known to be too large, or not worth a snapshot, stays known as such."""
        for folder in [f for f, snap in self._snapshots.items() if snap.nodes is not None]:
            self._drop(folder)
        self._misses.clear()
        self._quiet_until = self.clock() + self.ttl

    def forget(self, folders: set[str] | None = None) -> None:
        """Drop the snapshots of ``folders`` (None: all): another writer changed names in them
        (:mod:`zarrfs.fs.changes`). Unlike :meth:`clear`, snapshots are made again at once."""
        if folders is None:
            self._snapshots.clear()
            self.held = 0
            return
        for folder in folders:
            self._drop(folder)


class _Snapshot:
    """One folder read whole: when, what (None: too large or not worth it), lookups answered."""

    __slots__ = ("made", "nodes", "hits")

    def __init__(self, made: float, nodes: dict[str, Node] | None) -> None:
        self.made = made
        self.nodes = nodes
        self.hits = 0

"""Snapshots of busy folders, so that a burst of lookups in one folder costs one listing.

Every ``stat`` of a name the kernel has not cached is a lookup, and on a remote database a
lookup is a round trip (about 30 us to a local Redis here, which caps a ``stat`` loop near
10,000/s). When one folder gets :data:`HOT` lookups within the time to live, the folder is
read once, names with sizes and attributes (one batch of reads), and further lookups in it are
answered from that snapshot until it is ``ttl`` seconds old. rclone's directory cache and
gcsfuse's stat cache make the same trade.

What it means for coherence: a change made through this mount drops every snapshot at once
(the tree calls :meth:`FolderCache.clear` after each write transaction), so the mount's own
changes show at once, as before; and for ``ttl`` after a write no snapshot is made, so a
folder being filled is not read over and over. A change made by another writer (another mount of the same
Redis, a zarr-python process on the same LMDB file) shows after at most ``ttl`` here plus the
kernel's own ``cache_timeout``, instead of ``cache_timeout`` alone. ``-o dir_cache=0`` turns
the snapshots off.

A folder too large to snapshot (more than ``limit`` entries, e.g. a flat array folder of a
million chunks, or one whose reading took more than a quarter of ``ttl``) is remembered as
such for ten times ``ttl`` and looked up name by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zarrfs.tree import Node

HOT = 32  # lookups in one folder, within ttl, that make it worth a snapshot
LIMIT = 32768  # entries of the largest folder snapshotted
FOLDERS = 8  # snapshots kept at once (the oldest goes first)
BUILD_SHARE = 0.25  # the most of its lifetime a snapshot may take to read
TOO_BIG = object()


class FolderCache:
    """Snapshots of folders (name -> :class:`Node`), each valid for ``ttl`` seconds."""

    def __init__(
        self,
        ttl: float,
        hot: int = HOT,
        limit: int = LIMIT,
        folders: int = FOLDERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.hot = hot
        self.limit = limit
        self.folders = folders
        self.clock = clock
        self._snapshots: dict[str, tuple[float, dict[str, Node] | object]] = {}
        self._misses: dict[str, list[float | int]] = {}  # folder -> [window start, count]
        self._quiet_until = 0.0
        self.builds = 0

    def snapshot(self, folder: str, build: Callable[[int], dict[str, Node] | None]) -> dict[str, Node] | None:
        """The snapshot of ``folder`` if one is fresh, or now made (``build(limit)`` lists the
        folder; None when it has more than ``limit`` entries); None when the folder is not
        busy enough, or too large: then the caller looks the name up itself."""
        now = self.clock()
        if now < self._quiet_until:
            return None
        found = self._snapshots.get(folder)
        if found is not None:
            made, nodes = found
            if now - made < (self.ttl * 10 if nodes is TOO_BIG else self.ttl):
                return None if nodes is TOO_BIG else nodes  # type: ignore[return-value]
            del self._snapshots[folder]
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
        # A snapshot that takes more than a quarter of its lifetime to read does not pay for
        # itself: the folder is looked up name by name, as one too large.
        slow = self.clock() - now > self.ttl * BUILD_SHARE
        while len(self._snapshots) >= self.folders:
            del self._snapshots[next(iter(self._snapshots))]
        self._snapshots[folder] = (now, TOO_BIG if nodes is None or slow else nodes)
        return nodes

    def clear(self) -> None:
        """Forget every snapshot (the mount changed something), and make none for ``ttl``: a
        folder being written to would be read again and again (creating 20,000 files, each
        after a lookup of its name, would read the growing folder every few files). A folder
        found too large stays known as such."""
        for folder in [f for f, (_, nodes) in self._snapshots.items() if nodes is not TOO_BIG]:
            del self._snapshots[folder]
        self._misses.clear()
        self._quiet_until = self.clock() + self.ttl

"""Changes made behind the mount's back, from the driver's change feed, as keys of the tree.

Another mount of the same database, zarr-python writing to the same LMDB file, a second
machine on one Redis: :meth:`zarrfs.backends.base.Driver.changes` says what they committed.
:class:`ChangeWatcher` asks it (the daemon's request loop calls :meth:`ChangeWatcher.poll`
between requests, every ``driver.feed_interval`` while idle, or when the feed's descriptor wakes
it), turns its records into the keys of the files and folders they touch (a side record
``a:<key>``, ``e:<key>`` or ``x:<key>`` is ``<key>``'s attributes, entry or extended attributes),
and drops what the tree itself caches of them (folder snapshots, chunks read ahead). The caller
drops what the kernel caches;
:attr:`ChangeWatcher.rewritten` tells which names got a new value or entry record, what tells a
name another file was put at from one whose link group merely lost its other names.
"""

from __future__ import annotations

import logging
import time

from zarrfs.backends.base import DATA, BackendError
from zarrfs.fs.sidedata import ATTR, ENTRY, XATTR

log = logging.getLogger("zarrfs.fs.changes")


def has_feed(driver: object) -> bool:
    """Whether ``driver`` tells of other writers' changes (see ``Driver.changes``)."""
    try:
        driver.changes(None)  # type: ignore[attr-defined]
    except NotImplementedError:
        return False
    return True


class ChangeWatcher:
    """The tree's view of its driver's change feed."""

    def __init__(self, tree) -> None:
        self.tree = tree
        self.driver = tree.driver
        self.interval = self.driver.feed_interval
        self.cursor, _ = self.driver.changes(None)
        tree.follow_feed()  # the feed keeps what the tree knows of folders true from now
        self.failing = False
        self.last = time.monotonic()
        #: The keys of the last poll whose data key or entry record changed (a value stored, a
        #: file or entry put there or removed), not only their side records; None when the
        #: last poll did not know what changed.
        self.rewritten: set[str] | None = set()

    def fileno(self) -> int | None:
        """The feed's descriptor (readable when it has news), or None: polled."""
        return self.driver.feed_fileno()

    def poll(self) -> list[str] | None:
        """The keys changed by others since the last poll (often none), with their folders'
        snapshots dropped; None: something changed, not known what (every snapshot dropped)."""
        self.last = time.monotonic()
        self.rewritten = set()
        try:
            self.cursor, records = self.driver.changes(self.cursor)
        except BackendError as exc:  # the database is away: the requests will say so
            if not self.failing:
                log.warning("change feed: %s", exc)
            self.failing = True
            return []
        if self.failing:
            log.info("change feed back")
            self.failing = False
        cache = self.tree.folder_cache
        ahead = self.tree.readahead
        known = self.tree.known
        if records is None:
            self.rewritten = None
            self.tree.listings.told(None)
            self.tree.hooks.elsewhere(None)
            if known is not None:
                known.clear()
            if cache is not None:
                cache.forget()
            if ahead is not None:
                ahead.forget()
            return None
        if not records:
            return []
        keys = set()
        rewritten = self.rewritten
        for space, key in records:
            if space is DATA:
                keys.add(key)
                rewritten.add(key)
            elif key.startswith(ENTRY):
                keys.add(key[2:])
                rewritten.add(key[2:])
            elif key.startswith((ATTR, XATTR)):
                keys.add(key[2:])
        folders = folders_of(keys) if keys else set()
        self.tree.listings.told(folders)
        if rewritten:
            self.tree.hooks.elsewhere(rewritten)
        if known is not None and keys:
            known.forget(keys, folders)
        if cache is not None and keys:
            cache.forget(folders)
        if ahead is not None and keys:
            ahead.forget(keys)
        return sorted(keys)


def folders_of(keys: set[str]) -> set[str]:
    """Every folder above ``keys`` (a new key can make its folders appear, a removed one make
    them vanish), the root ``""`` included."""
    folders: set[str] = set()
    for key in keys:
        while key:
            key = key.rpartition("/")[0]
            if key in folders:
                break
            folders.add(key)
    return folders

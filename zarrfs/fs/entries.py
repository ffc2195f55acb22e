"""New names and what they change: making folders, symlinks and special files, who owns a new
node, the times of the folder a name is added to or removed from, and the length of a path.

:class:`Entries` makes side entries for the tree (folders made with ``mkdir``, symlinks,
FIFOs, devices, sockets: never Zarr keys, so zarr-python's stores do not see them), and the
helpers the other writes share. POSIX says a
new node is owned by its caller, takes the group of a setgid folder (a new folder its setgid
bit too), and that adding or removing a name changes the folder's mtime and ctime: each call
does it in its own transaction, from the probe it makes anyway (one more record written).
A removal, and what it leaves, keeps an emptied folder (only rmdir removes one); on a full
store it writes neither the folder's times nor its mark.
"""

from __future__ import annotations

import errno
import stat
from typing import Any

from zarrfs.backends.base import DATA, SIDE, Get, HasPrefix, Read, StorageFullError, Txn
from zarrfs.fs import records
from zarrfs.fs.errors import FsError
from zarrfs.fs.lookups import Lookups
from zarrfs.fs.node import DIR, FILE, LINK, Node
from zarrfs.fs.sidedata import (
    DIR_MARK,
    ENTRY,
    LINK_MARK,
    SPECIAL_TYPES,
    Attrs,
    attr_key,
    entry_key,
    special_mark,
)
from zarrfs.fs.transactions import Transactions, clock


class Entries:
    """New side entries and folder times, over ``lookups`` (probes, default attributes) and
    ``writes`` (the tree's write transactions); ``uid``/``gid`` own what is made when the
    caller names nobody; ``key_limit`` is the longest path the database can hold (None: any)."""

    def __init__(
        self, lookups: Lookups, writes: Transactions, *, uid: int, gid: int, key_limit: int | None
    ) -> None:
        self.lookups = lookups
        self.writes = writes
        self.driver = lookups.driver
        self.uid, self.gid = uid, gid
        self.key_limit = key_limit

    def check_length(self, key: str) -> None:
        """ENAMETOOLONG for a path longer than the database's keys can be."""
        if self.key_limit is not None and len(key.encode("utf-8", "surrogateescape")) > self.key_limit:
            raise FsError(errno.ENAMETOOLONG, f"{key[:40]}...: longer than the database's keys can be")

    def check_create(self, key: str) -> Attrs | None:
        """Raise unless the name ``key`` is valid for a new file; return its folder's recorded
        attributes (None when it has none), which say the new file's group. The kernel has just
        looked up the name and its folder; the commit checks both again in its own
        transaction."""
        self.check_length(key)
        where = key.rpartition("/")[0]
        known = self.lookups.known
        # The record as the mount last read or wrote it, when the change feed keeps it true.
        have, record = known.record(where) if known is not None else (False, None)

        def run(t: Txn) -> bytes | None:
            self.lookups.hooks.check_name(t, key, FILE)
            return record if have else t.get(attr_key(where), SIDE)

        raw = self.driver.transact(run, write=False)
        if known is not None and not have:
            known.read_record(where, raw)
        return None if raw is None else Attrs.unpack(raw)

    @staticmethod
    def parent_reads(key: str) -> list[Read]:
        """What :meth:`keep_parent` reads of the folder of ``key`` (none for the root's)."""
        parent = key.rpartition("/")[0]
        if not parent:
            return []
        return [
            Get(entry_key(parent), SIDE),
            HasPrefix(parent + "/", DATA),
            HasPrefix(ENTRY + parent + "/", SIDE),
        ]

    def keep_parent(self, t: Txn, key: str, before: list | None = None, side: bool = False) -> None:
        """After ``key`` left its folder, keep the folder (POSIX: only rmdir removes one).

        ``before``: the answers of :meth:`parent_reads`, read with the removal's probe (in its
        round trip), before ``key``'s records were deleted; ``side``: ``key`` was a side entry
        (a folder's mark, a symlink), else a data key. The folder's mark, or what is below it
        in the other space, then settles it at once; otherwise what is below may be ``key``
        alone, and the folder is read again, after the deletes."""
        parent = key.rpartition("/")[0]
        if not parent:
            return
        if before is not None:
            marked, data_below, side_below = before
            if marked is not None or (data_below if side else side_below):
                return
        marked, data_below, side_below = t.read_many(self.parent_reads(key))
        if marked is None and not data_below and not side_below:
            records.keep_folder(t, parent)

    def removing(self, run: Any) -> Any:
        """Run a removal; on a full store, again without keeping the folder it empties nor
        changing its times: those are writes a full store may refuse, and removing must stay
        possible (the emptied folder then goes, as ``rm -r`` would take it next)."""
        try:
            return self.writes.run(run)
        except StorageFullError:
            return self.writes.run(lambda t: run(t, keep=False))

    def folder_changed(
        self, t: Txn, folder: str, raw: bytes | None, now: int, since: int | None = None
    ) -> None:
        """A name was added to or removed from ``folder`` (attribute record ``raw``): its mtime
        and ctime become ``now``. With ``since`` (a file made then, stored only now), not when
        the folder changed after that: a ``touch`` of the folder in between stands."""
        attrs = Attrs.unpack(raw) if raw is not None else None
        if attrs is None:
            attrs = self.lookups.default_attrs(DIR)
        elif since is not None and attrs.ctime > since:
            return
        attrs.mtime = attrs.ctime = now
        attrs.mode = DIR | stat.S_IMODE(attrs.mode)
        records.put_attrs(t, [folder], attrs.pack())

    def _make(
        self,
        key: str,
        kind: int,
        mode: int,
        mark: bytes,
        uid: int | None,
        gid: int | None,
        xattrs: bytes | None = None,
    ) -> None:
        """Make a side entry (folder, symlink, special file) at ``key``, owned by ``uid``/``gid``
        (the mount's owner when None) or the group of a setgid folder, with the extended
        attributes record ``xattrs`` (ACLs from its folder's default ACL), in one transaction."""
        self.check_length(key)

        def run(t: Txn) -> None:
            if not key:
                raise FsError(errno.EEXIST, key)
            folder, found = self.lookups.probe_with_folder(t, key)
            if found is not None:
                raise FsError(errno.EEXIST, key)
            if kind == DIR:
                self.lookups.hooks.check_name(t, key, DIR)
            now = clock()
            attrs = Attrs(kind | stat.S_IMODE(mode), self.uid, self.gid, now, now, now)
            attrs.uid = self.uid if uid is None else uid
            attrs.gid = self.gid if gid is None else gid
            inherit_group(attrs, Attrs.unpack(folder[3]) if folder[3] is not None else None)
            records.make_entry(t, key, mark, attrs.pack(), xattrs)
            self.folder_changed(t, key.rpartition("/")[0], folder[3], now)
            if kind == LINK and self.writes.leaving:  # what the reply shows
                target = bytes(mark[1:]).decode("utf-8", "surrogateescape")
                self.writes.leave(key, Node(LINK, len(mark) - 1, attrs, target))
            return attrs

        attrs = self.writes.run(run)
        known = self.lookups.known
        if known is not None and kind == DIR:  # a new folder: empty, and what the reply shows
            known.made(key, Node(DIR, 0, attrs), attrs.pack())

    def mkdir(
        self, key: str, mode: int, uid: int | None = None, gid: int | None = None, xattrs: bytes | None = None
    ) -> None:
        """Make an empty folder that persists (EEXIST if taken, ENOENT/ENOTDIR for the parent)."""
        self._make(key, DIR, mode, DIR_MARK, uid, gid, xattrs)

    def symlink(self, target: str, key: str, uid: int | None = None, gid: int | None = None) -> None:
        """Make a symlink at ``key`` pointing to ``target`` (kept as side data: not a Zarr key)."""
        self._make(key, LINK, 0o777, LINK_MARK + target.encode("utf-8", "surrogateescape"), uid, gid)

    def mknod(
        self,
        key: str,
        mode: int,
        rdev: int = 0,
        uid: int | None = None,
        gid: int | None = None,
        xattrs: bytes | None = None,
    ) -> None:
        """Make a FIFO, device or socket at ``key`` (``mode`` holds its type), kept as side data
        like a symlink: never a Zarr key, so zarr-python's stores do not see it."""
        if stat.S_IFMT(mode) not in SPECIAL_TYPES:
            raise FsError(errno.EINVAL, f"{key}: mknod of type {stat.S_IFMT(mode):o}")
        self._make(key, stat.S_IFMT(mode), mode, special_mark(mode, rdev), uid, gid, xattrs)

    def commit_folders(
        self, t: Txn, key: str, folder: Any, found: Any, added: int | None, renamed_from: str | None
    ) -> None:
        """The folder times a commit of ``key`` changes (``folder`` and ``found``: the probes of
        its folder and of the name before): a held file renamed from ``renamed_from`` changes
        both folders; a file made at ``added`` and new here changes its own."""
        where = key.rpartition("/")[0]
        if renamed_from is not None:
            now = clock()
            self.folder_changed(t, where, folder[3], now)
            source = renamed_from.rpartition("/")[0]
            if source != where:
                self.folder_changed(t, source, t.get(attr_key(source), SIDE), now)
        elif found is None and added is not None:  # the folder changed when the file was made
            self.folder_changed(t, where, folder[3], added, since=added)

    def folders_changed(self, t: Txn, source: tuple, target: tuple, now: int) -> None:
        """The folders a rename took a name from and put one in: ``(key, probe)`` each."""
        for where, probe in (source, target) if source[0] != target[0] else (target,):
            self.folder_changed(t, where, probe[3] if probe else None, now)


def inherit_group(attrs: Attrs, folder: Attrs | None) -> None:
    """A new node in a setgid folder (of attributes ``folder``, None when it has none recorded)
    takes the folder's group, and a new folder its setgid bit as well (as ext4 does)."""
    if folder is not None and folder.mode & stat.S_ISGID:
        attrs.gid = folder.gid
        if stat.S_ISDIR(attrs.mode):
            attrs.mode |= stat.S_ISGID


def without_setid(mode: int) -> int:
    """``mode`` as a change by a caller without CAP_FSETID leaves it (a write, a truncate, a
    chown): no S_ISUID, and no S_ISGID when the group may execute (without that bit S_ISGID
    marks mandatory locking, which stays), as the kernel's VFS does on ext4."""
    if mode & stat.S_ISGID and mode & stat.S_IXGRP:
        mode &= ~stat.S_ISGID
    return mode & ~stat.S_ISUID

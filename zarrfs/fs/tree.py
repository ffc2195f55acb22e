"""The filesystem over one driver: :class:`Tree`, and every change to its tree of files and
folders, each one driver transaction.

A path is a key (``/grp/arr/0.0`` is ``grp/arr/0.0``); folders derive from key prefixes and
side markers. A tree holds its parts, each an object built with what it needs: lookups
(:class:`~zarrfs.fs.lookups.Lookups`), listings (:class:`~zarrfs.fs.listing.Listings`), new
side entries and folder times (:class:`~zarrfs.fs.entries.Entries`), link groups
(:mod:`~zarrfs.fs.hardlinks`), extended attributes
(:class:`~zarrfs.fs.xattrs.Xattrs`) and the write transactions
(:class:`~zarrfs.fs.transactions.Transactions`); the format layer plugs in through
:class:`~zarrfs.fs.hooks.Hooks`. Here are the changes that move or replace names: commit,
unlink, rmdir, set_attrs, rename, link. Nothing here knows about FUSE; POSIX conditions are
raised as :class:`zarrfs.fs.errors.FsError`. Every side record is written and deleted by
:mod:`zarrfs.fs.records`.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable
from typing import Any

from zarrfs.backends.base import DATA, SIDE, Driver, Get, HasPrefix, Txn
from zarrfs.backends.errors import InterruptedCallError, RetryableError, UnavailableError
from zarrfs.backends.heldvalues import Held
from zarrfs.fs import acl, hardlinks, parts, records
from zarrfs.fs.commitoptions import CommitOptions
from zarrfs.fs.entries import Entries
from zarrfs.fs.errors import FsError, Refused
from zarrfs.fs.foldercache import MISS
from zarrfs.fs.hooks import Hooks
from zarrfs.fs.knownfolders import KnownFolders
from zarrfs.fs.listing import FOLDER_BATCH, Listings
from zarrfs.fs.lookups import Lookups
from zarrfs.fs.node import DIR, FILE, LINK, Node, stamp_of
from zarrfs.fs.sidedata import (
    ENTRY,
    Attrs,
    attr_key,
    entry_key,
    pack_xattrs,
    pointer_key,
    unpack_xattrs,
    xattr_key,
)
from zarrfs.fs.transactions import Transactions, clock
from zarrfs.fs.xattrs import Xattrs

# Names other modules import from here (their homes are zarrfs.fs.node, .hooks and .listing).
__all__ = [
    "DIR",
    "FILE",
    "FOLDER_BATCH",
    "LINK",
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "Hooks",
    "Node",
    "Tree",
    "check_rename_flags",
]

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def check_rename_flags(src: str, flags: int) -> None:
    """EINVAL for rename flags not done here: RENAME_WHITEOUT (which overlayfs asks of its
    upper layer), any later flag, and NOREPLACE with EXCHANGE."""
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == RENAME_NOREPLACE | RENAME_EXCHANGE:
        raise FsError(errno.EINVAL, f"rename of {src} with flags {flags:#x}")


class Tree:
    """The filesystem over one driver: lookups, listings and every namespace change.

    ``uid``/``gid``/``umask`` give the attributes of nodes that have none recorded.
    :attr:`on_side_effects` ``(keys)`` is called after a commit in which the hooks changed
    other keys than the ones asked for (a consolidated ``.zmetadata``), so the mount can drop
    the kernel's cached attributes and pages of those files.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        uid: int = 0,
        gid: int = 0,
        umask: int = 0o022,
        hooks: Hooks | None = None,
    ) -> None:
        self.driver = driver
        self.uid, self.gid, self.umask = uid, gid, umask
        self._hooks = hooks or Hooks()
        self.epoch = records.epoch(driver)
        #: Snapshots of busy folders for :meth:`find` (a FolderCache), or None.
        self.folder_cache: Any = None
        self.lookups = Lookups(driver, self._hooks, uid=uid, gid=gid, umask=umask, epoch=self.epoch)
        self.listings = Listings(self.lookups)
        self.writes = Transactions(driver, self._hooks, self.lookups.default_attrs, self._forget)
        self.writes.on_commit = self._committed
        # The longest key the database holds, if it has a limit, less the side prefix ("a:")
        # of a node's attributes: a longer path is refused with ENAMETOOLONG before it is made.
        limit = driver.max_key_size
        key_limit = limit - len(ENTRY) if limit else None
        self.entries = Entries(self.lookups, self.writes, uid=uid, gid=gid, key_limit=key_limit)
        self.xattr_table = Xattrs(self.lookups, self.writes)

    def _forget(self) -> None:
        """Drop the lookup caches: a write changed the database."""
        self.listings.changed()
        if self.folder_cache is not None:
            self.folder_cache.clear()
        if self.lookups.readahead is not None:
            self.lookups.readahead.forget()

    @property
    def known(self) -> KnownFolders | None:
        """What the mount knows of folders without asking the database (see
        :mod:`zarrfs.fs.knownfolders`), or None: set by :meth:`follow_feed`."""
        return self.lookups.known

    def follow_feed(self) -> None:
        """A change feed keeps this tree's caches true from now on (:mod:`zarrfs.fs.changes`):
        on a remote database, folders' names and records are kept to answer from."""
        if self.driver.remote and self.lookups.known is None:
            self.lookups.known = KnownFolders()
            self.writes.keeps_nodes = True

    def _committed(self, writes: list | None, left: list[tuple[str, Node]]) -> None:
        self.listings.wrote(writes)
        known = self.lookups.known
        if known is not None:
            if writes is None:
                known.clear()
            else:
                known.wrote(writes)
                for key, node in left:
                    known.stored(key, node)

    @property
    def hooks(self) -> Hooks:
        """Where the format layer plugs in (:class:`Hooks`); set on the parts that call it."""
        return self._hooks

    @hooks.setter
    def hooks(self, hooks: Hooks) -> None:
        self._hooks = self.lookups.hooks = self.writes.hooks = hooks

    @property
    def readahead(self) -> Any:
        """Chunks read ahead of a reader in grid order (a Readahead), or None."""
        return self.lookups.readahead

    @readahead.setter
    def readahead(self, value: Any) -> None:
        self.lookups.readahead = value

    @property
    def on_side_effects(self) -> Any:
        """Called with the keys a commit's hooks changed beyond those asked for, or None."""
        return self.writes.on_side_effects

    @on_side_effects.setter
    def on_side_effects(self, value: Any) -> None:
        self.writes.on_side_effects = value

    @property
    def key_limit(self) -> int | None:
        """The longest path the database can hold (None: any)."""
        return self.entries.key_limit

    # ------------------------------------------------------------------ reads
    def seen(self, key: str, node: Node) -> None:
        """The file at ``key`` was just read from the database as ``node`` (an open): what
        answers lookups (chunks read ahead, a folder's snapshot) shows it from now on, not an
        older version the change feed has not told of yet."""
        ahead = self.lookups.readahead
        if ahead is not None and (held := ahead.node(key)) is not None and stamp_of(held) != stamp_of(node):
            ahead.forget([key])
        known = self.lookups.known
        if known is not None:
            known.opened(key, node)
        cache = self.folder_cache
        if cache is not None and key:
            folder, _, name = key.rpartition("/")
            cache.seen(folder, name, node)

    def unchanged_since(self, key: str, node: Node) -> bool:
        """Whether ``node``, which an open read at ``key`` (:meth:`seen`), is still what is
        there as far as the change feed tells: neither this mount nor another changed anything
        at ``key`` since (False without a feed of :class:`KnownFolders`)."""
        known = self.lookups.known
        return known is not None and known.node(key) is node

    def find(self, key: str, folder: str | None = None, name: str | None = None) -> Node | None:
        """The node at ``key``, or None when there is none (the lookup of every ``stat``: a
        missing name is common and costs no exception). Answered from the chunks read ahead,
        or from a snapshot of the folder when :attr:`folder_cache` has one (see
        :mod:`zarrfs.fs.foldercache`). ``folder`` and ``name``: ``key`` split, when the
        caller has them."""
        ahead = self.lookups.readahead
        if ahead is not None:
            node = ahead.node(key)
            if node is not None:
                return node
        known = self.lookups.known
        if known is not None:
            node = known.node(key)
            if node is not None:
                return node
            if known.missing(key):
                return None
        cache = self.folder_cache
        if cache is not None and key:
            if name is None:
                folder, _, name = key.rpartition("/")
            node = cache.answer(folder, name)
            if node is MISS:
                node = cache.missed(folder, name, self.listings.folder_page)
            if node is not MISS:
                return None if node is None else self.lookups.remember(key, node)
        node = self._read(key) if known is None else self._read_known(key, known)
        if node is not None and cache is not None and key:
            cache.found_name(folder)  # a name looked up and there: towards a whole read
        return node

    # find's reads of the database, apart: a closure in find itself makes a cell for each
    # variable it shares at every call of find, the lookup of every stat
    # (tests/project/test_hot_road.py).
    def _read(self, key: str) -> Node | None:
        """The node at ``key`` read from the database."""
        return self.driver.transact(lambda t: self.lookups.find_in(t, key), write=False)

    def _read_known(self, key: str, known: KnownFolders) -> Node | None:
        """The node at ``key`` read from a remote database with its extended attributes, which
        ``known`` keeps, and the names of its folder when that is small."""
        folder = key.rpartition("/")[0]
        learn = known.start_reading(folder)
        listings = self.listings

        def run(t: Txn) -> tuple[Node | None, bytes | None, bytes | None, list[str] | None]:
            if learn:  # a small folder's names come in the same round trip
                listings.announce_folder(t, folder)
            node, raw, record = self.lookups.find_with_xattrs(t, key)
            return node, raw, record, listings.small_folder(t, folder) if learn else None

        try:
            node, raw, record, names = self.driver.transact(run, write=False)
        finally:
            if learn:
                known.reading_ended(folder)
        if node is not None:
            known.read_xattrs(key, raw)
            if node.kind == DIR:  # what a file made in it inherits (its group)
                known.read_record(key, record)
        if names is not None:
            known.listed(folder, names)
        elif learn:
            known.too_large(folder)
        return node

    def lookup(self, key: str) -> Node:
        """The node at ``key`` (:meth:`Lookups.lookup`)."""
        return self.lookups.lookup(key)

    def read_value(self, key: str) -> bytes:
        """The whole content of the file at ``key`` as it is shown (:meth:`Lookups.read_value`)."""
        return self.lookups.read_value(key)

    def version(self, key: str, limit: int) -> tuple[Node | None, Held | None]:
        """The file at ``key`` as it is now, for an open (:meth:`Lookups.version`)."""
        return self.lookups.version(key, limit)

    def versions(self, keys: list[str], limit: int) -> list[tuple[Node | None, bytes | None]]:
        """The files at ``keys`` as they are now, in one batch of reads (:meth:`Lookups.versions`)."""
        return self.lookups.versions(keys, limit)

    def read_version(self, key: str, stamp: tuple[int, int], offset: int = 0, size: int = -1) -> bytes:
        """Bytes of the file at ``key`` (:meth:`Lookups.read_version`)."""
        return self.lookups.read_version(key, stamp, offset, size)

    def array_of(self, key: str) -> Any:
        """The Zarr array enclosing ``key`` (:meth:`Lookups.array_of`)."""
        return self.lookups.array_of(key)

    def link_names(self, key: str) -> list[str]:
        """Every name of the file at ``key`` (:meth:`Lookups.link_names`)."""
        return self.lookups.link_names(key)

    def lookup_attrs(self, key: str) -> Attrs:
        """The attributes of the file at ``key`` (:meth:`Lookups.lookup_attrs`)."""
        return self.lookups.lookup_attrs(key)

    def stored_size(self, key: str) -> int:
        """The stored size of the value at ``key`` (:meth:`Lookups.stored_size`)."""
        return self.lookups.stored_size(key)

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """Stored bytes of ``key`` from ``offset`` (:meth:`Lookups.read_range`)."""
        return self.lookups.read_range(key, offset, size)

    def readlink(self, key: str) -> str:
        """The target of the symlink at ``key`` (:meth:`Lookups.readlink`)."""
        return self.lookups.readlink(key)

    def default_attrs(self, kind: int) -> Attrs:
        """Attributes of a node that has no side record (:meth:`Lookups.default_attrs`)."""
        return self.lookups.default_attrs(kind)

    def list_dir(
        self,
        key: str,
        after: str | None = None,
        limit: int = 1024,
        sizes: dict[str, int] | None = None,
        nodes: dict[str, Node] | None = None,
        held: Callable[[str, int], bool] | None = None,
    ) -> list[tuple[str, int, str]]:
        """Up to ``limit`` children of folder ``key`` (:meth:`Listings.list_dir`)."""
        return self.listings.list_dir(key, after, limit, sizes, nodes, held)

    def folder_nodes(self, key: str, limit: int) -> dict[str, Node] | None:
        """Every child of folder ``key`` by name (:meth:`Listings.folder_nodes`)."""
        return self.listings.folder_nodes(key, limit)

    def check_length(self, key: str) -> None:
        """ENAMETOOLONG for a path too long for the database (:meth:`Entries.check_length`)."""
        return self.entries.check_length(key)

    def check_create(self, key: str) -> Attrs | None:
        """Raise unless the name ``key`` is valid for a new file (:meth:`Entries.check_create`)."""
        return self.entries.check_create(key)

    def mkdir(
        self, key: str, mode: int, uid: int | None = None, gid: int | None = None, xattrs: bytes | None = None
    ) -> None:
        """Make an empty folder that persists (:meth:`Entries.mkdir`)."""
        return self.entries.mkdir(key, mode, uid, gid, xattrs)

    def symlink(self, target: str, key: str, uid: int | None = None, gid: int | None = None) -> None:
        """Make a symlink at ``key`` pointing to ``target`` (:meth:`Entries.symlink`)."""
        return self.entries.symlink(target, key, uid, gid)

    def mknod(
        self,
        key: str,
        mode: int,
        rdev: int = 0,
        uid: int | None = None,
        gid: int | None = None,
        xattrs: bytes | None = None,
    ) -> None:
        """Make a FIFO, device or socket at ``key`` (:meth:`Entries.mknod`)."""
        return self.entries.mknod(key, mode, rdev, uid, gid, xattrs)

    def xattrs(self, key: str) -> dict[bytes, bytes]:
        """Every extended attribute of ``key`` (:meth:`Xattrs.xattrs`)."""
        return self.xattr_table.xattrs(key)

    def set_xattr(self, key: str, name: bytes, value: bytes | None, flags: int = 0) -> None:
        """Set (:meth:`Xattrs.set_xattr`)."""
        return self.xattr_table.set_xattr(key, name, value, flags)

    @property
    def hooks_transform(self) -> bool:
        """Whether files show other bytes than the stored ones (a decoded view)."""
        return self.lookups.hooks_transform

    # ------------------------------------------------------------------ writes
    def store(self, items: list[tuple[str, Any, Attrs | None, CommitOptions]]) -> None:
        """Store the content of files written through the mount (``(key, value, attrs, how)``,
        of different keys; several only when none is linked), with their attributes, in one
        transaction: their probes in one batch of reads, so several closes waiting together
        cost the round trips of one (``fuse.workers``). The format layer may refuse a file
        (nothing is stored then); a check refusing one of several refuses them all
        (:class:`Refused`): the caller then stores each alone. ``how``: see
        :class:`CommitOptions`."""
        steps = [_FileWrite(self, key, value, attrs, how) for key, value, attrs, how in items]

        def run(t: Txn) -> None:
            versions = [(step.key, step.parted) for step in steps if step.parted is not None]
            if versions:
                parts.check_present_many(t, versions)
            probing = [step for step in steps if step.probing]
            probes: list[Any] = []
            if probing:
                # Each file's folder and name; files of one folder probe it once.
                wanted = [k for step in probing for k in (step.key.rpartition("/")[0], step.key)]
                keys = list(dict.fromkeys(wanted))
                also = list(dict.fromkeys(k for step in probing for k in step.also))
                probes = self.lookups.probe_many(t, keys, also)
                if len(keys) < len(wanted):
                    by_key = dict(zip(keys, probes, strict=True))
                    probes = [by_key[k] for k in wanted]
            laying = [step for step in steps if step.laying]
            if laying:
                # Whether another writer stored a newer version to lay the changes on, with
                # what the format layer reads, in one batch.
                keys = [step.key for step in laying]
                found_now = self.lookups.probe_many(t, keys, [k for step in laying for k in step.also])
                for step, probe in zip(laying, found_now, strict=True):
                    step.newest = None if probe is None else self.lookups.node_from(t, step.key, *probe)
            found = iter(zip(probes[::2], probes[1::2], strict=True))
            changed: set[str] = set()  # folders whose record an earlier file changed here
            for step in steps:
                folder, probe = next(found) if step.probing else (None, None)
                try:
                    if step.probing:
                        self.lookups.folder_check(folder, step.key)
                        where = step.key.rpartition("/")[0]
                        if where in changed:  # this transaction's own write of it answers
                            folder = (*folder[:3], t.get(attr_key(where), SIDE), *folder[4:])
                        changed.add(where)
                    step.write(t, folder, probe)
                except (RetryableError, UnavailableError, InterruptedCallError):
                    raise  # the server's, not the file's: run again, or every file hears it
                except Exception as exc:
                    if len(steps) == 1:
                        raise
                    raise Refused(step.key, exc) from exc

        self.writes.run(run)
        stored_as = self.lookups.stored_as if self.driver.batched else None
        for step in steps:
            if step.attrs is not None:
                step.attrs.parted = step.parted
            if stored_as is not None:  # its next open here reads the value with the probe
                stored_as(step.key, len(step.value) if step.parted is None else step.parted.size, step.parted)

    def unlink(self, key: str) -> list[str]:
        """Remove the file or symlink at ``key`` (EISDIR for a folder). Returns the other
        names of the file, when it had hard links."""

        where = key.rpartition("/")[0]

        def run(t: Txn, keep: bool = True) -> list[str]:
            # What keeping the folder needs is read with the probe: one round trip.
            extra = self.entries.parent_reads(key) if keep else []
            (found, folder), before = self.lookups.probe_many_with(t, [key, where], extra)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] == DIR:
                raise FsError(errno.EISDIR, key)
            left = records.remove_name(t, key, found, self.lookups.default_attrs, clock())
            if found[0] == FILE:
                self.writes.changed(t, key, None)
                if not left:
                    self.writes.let_go(parts.parted_of(found[3]))
            if keep:  # writes a full store may refuse (see Entries.removing)
                self.entries.keep_parent(t, key, before, side=found[0] != FILE)
                self.entries.folder_changed(t, where, folder[3] if folder else None, clock())
            return left

        return self.entries.removing(run)

    def rmdir(self, key: str) -> None:
        """Remove the empty folder at ``key`` (ENOTEMPTY, ENOTDIR, ENOENT as POSIX says)."""

        if not key:
            raise FsError(errno.EBUSY, "the root folder")
        where = key.rpartition("/")[0]

        def run(t: Txn, keep: bool = True) -> None:
            # The checks (anything below it) and what keeping its folder needs are read with
            # the probe: one round trip.
            below = [HasPrefix(key + "/", DATA), HasPrefix(ENTRY + key + "/", SIDE)]
            extra = below + (self.entries.parent_reads(key) if keep else [])
            (found, folder), answers = self.lookups.probe_many_with(t, [key, where], extra)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] != DIR:
                raise FsError(errno.ENOTDIR, key)
            # A prefix read may trust an index entry whose key is gone: a scan confirms.
            if (answers[0] or answers[1]) and self.lookups.has_children(t, key):
                raise FsError(errno.ENOTEMPTY, key, quiet=True)
            records.remove_folder(t, key)
            if keep:  # writes a full store may refuse (see Entries.removing)
                self.entries.keep_parent(t, key, answers[2:], side=True)
                self.entries.folder_changed(t, where, folder[3] if folder else None, clock())

        self.entries.removing(run)

    def set_attrs(
        self,
        key: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime: int | None = None,
        mtime: int | None = None,
    ) -> tuple[int, int] | None:
        """Change mode, owner or times of ``key`` (``-1`` owner means unchanged, as chown);
        with ``mtime``, the mtime before and after (what tells versions of a file apart)."""

        # A chmod changes the access ACL too: from a server, the extended attributes are read
        # with the probe, in its round trip (the transaction answers its later get).
        extra = [Get(xattr_key(key), SIDE)] if mode is not None and self.driver.remote else []

        def run(t: Txn) -> tuple[int, int] | None:
            (found,), _ = self.lookups.probe_many_with(t, [key], extra)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            attrs = self.lookups.attrs_of(t, key, found[0])
            before = attrs.mtime
            if mode is not None:
                attrs.mode = stat.S_IFMT(attrs.mode) | stat.S_IMODE(mode)
            if uid is not None and uid != -1:
                attrs.uid = uid
            if gid is not None and gid != -1:
                attrs.gid = gid
            if atime is not None:
                attrs.atime = atime
            if mtime is not None:
                attrs.mtime = mtime
            attrs.ctime = clock()
            group = hardlinks.load(t, key, found[4]) if found[0] != DIR else None
            names = group.names if group is not None else [key]
            # The names of a linked node share their attributes: each has the same record.
            records.put_attrs(t, names, attrs.pack())
            if mode is not None:  # a chmod changes the access ACL too (zarrfs.fs.acl)
                xattrs = unpack_xattrs(t.get(xattr_key(key), SIDE))
                if acl.ACCESS in xattrs:
                    xattrs[acl.ACCESS] = acl.pack(acl.chmod(acl.parse(xattrs[acl.ACCESS]), mode))
                    records.put_xattrs(t, names, pack_xattrs(xattrs))
            if found[4] is None and self.writes.leaving:
                # The reply's attributes, and lookups, need not ask (not for a linked node:
                # its group is read)
                node = self.lookups.node_from(t, key, found[0], found[1], found[2], attrs.pack())
                self.writes.leave(key, node)
            return None if mtime is None else (before, attrs.mtime)

        return self.writes.run(run)

    # ------------------------------------------------------------------ rename / link
    def rename(self, src: str, dst: str, flags: int = 0) -> bool:
        """Move a file or a whole folder atomically, replacing an existing target atomically;
        honours RENAME_NOREPLACE and RENAME_EXCHANGE (others: EINVAL). Onto another name of the
        same file, a rename does nothing (POSIX): then False is returned."""
        check_rename_flags(src, flags)
        if src == dst:
            return False
        if not src or not dst:
            raise FsError(errno.EBUSY, "the root folder")
        if dst.startswith(src + "/") or (flags & RENAME_EXCHANGE and src.startswith(dst + "/")):
            raise FsError(errno.EINVAL, f"cannot move {src} into itself")

        self.entries.check_length(dst)
        here, there = src.rpartition("/")[0], dst.rpartition("/")[0]

        # Read with the probes, in their batch: what the source's and the target's records
        # are (records.subtree) and what keeps the source's folder (entries.keep_parent).
        # (Where a batch is one read, the target's records and the source's folder too; on a
        # local database those are read only when needed.)
        own = records.subtree_reads(src)
        k = len(own)
        extra = own
        if self.driver.batched:
            extra = own + records.subtree_reads(dst) + self.entries.parent_reads(src)

        def run(t: Txn) -> bool:
            (s, d, parent, source), answers = self.lookups.probe_many_with(t, [src, dst, there, here], extra)
            src_reads, dst_reads, before = answers[:k], answers[k : 2 * k] or None, answers[2 * k :]
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if hardlinks.same_file(t, src, dst, s, d):
                return False
            now = clock()
            defaults = self.lookups.default_attrs
            if flags & RENAME_EXCHANGE:
                if d is None:
                    raise FsError(errno.ENOENT, dst, quiet=True)
                a, b = records.subtree(t, src, s, src_reads), records.subtree(t, dst, d, dst_reads)
                records.remove(t, a, self.writes.changed)
                records.remove(t, b, self.writes.changed)
                records.place(t, a, src, dst, self.hooks.arrive, self.writes.changed)
                records.place(t, b, dst, src, self.hooks.arrive, self.writes.changed)
                records.regroup(t, [(a, src, dst, s), (b, dst, src, d)], defaults, now)
                self.entries.folders_changed(t, (here, source), (there, parent), now)
                return True
            if d is not None:
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST, dst)
                if s[0] == DIR and d[0] != DIR:
                    raise FsError(errno.ENOTDIR, dst)
                if s[0] != DIR and d[0] == DIR:
                    raise FsError(errno.EISDIR, dst)
                if d[0] == DIR and self.lookups.has_children(t, dst):
                    raise FsError(errno.ENOTEMPTY, dst)
                if d[0] != DIR and not records.leave_group(t, dst, d, defaults, now) and d[0] == FILE:
                    self.writes.let_go(parts.parted_of(d[3]))
                records.remove(t, records.subtree(t, dst, d, dst_reads), self.writes.changed)
            else:
                self.lookups.folder_check(parent, dst)
                self.hooks.check_name(t, dst, s[0])
            moving = records.subtree(t, src, s, src_reads)
            records.remove(t, moving, self.writes.changed)
            records.place(t, moving, src, dst, self.hooks.arrive, self.writes.changed)
            moved = (Attrs.unpack(s[3]) if s[3] is not None else None) or defaults(s[0])
            moved.ctime = now  # as Linux's filesystems do: the node changed
            record = moved.with_type(s[0]).pack()
            records.put_attrs(t, [dst], record)
            if s[0] in (FILE, LINK) and s[4] is None and self.writes.leaving:
                # The node moved (one of one name): the kernel's stat after the rename (its
                # ctime changed) need not ask
                self.writes.leave(dst, self.lookups.node_from(t, dst, s[0], s[1], s[2], record))
            records.regroup(t, [(moving, src, dst, s)], defaults, now)
            # A file's, symlink's or special file's folder is settled by what was read before
            # (as an unlink's is); a folder's is read again.
            self.entries.keep_parent(t, src, before if s[0] != DIR and before else None, side=s[0] != FILE)
            self.entries.folders_changed(t, (here, source), (there, parent), now)
            return True

        return self.writes.run(run)

    def link(self, src: str, dst: str) -> None:
        """``link(src, dst)``: a hard link, a new name ``dst`` of the file ``src``, in one
        transaction; EEXIST, atomically, when ``dst`` exists (zarr-python 3 creates metadata
        this way). The value is stored under the new name too (every name is a Zarr key), and
        the link group of :mod:`zarrfs.fs.hardlinks` makes the names one file. A symlink or
        special file gets an entry record under the new name, in the same link group. The new
        name's folder changes and so does the file (its ctime, on every name)."""

        self.entries.check_length(dst)

        # From a server, the file's value and extended attributes are read with the probes, in
        # their round trip (the transaction answers the gets below).
        extra = [Get(src), Get(xattr_key(src), SIDE)] if self.driver.remote else []

        def run(t: Txn) -> None:
            (s, d, parent), _ = self.lookups.probe_many_with(t, [src, dst, dst.rpartition("/")[0]], extra)
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if s[0] == DIR:
                raise FsError(errno.EPERM, f"{src} is a folder")
            if d is not None:
                raise FsError(errno.EEXIST, dst)
            self.lookups.folder_check(parent, dst)
            self.hooks.check_name(t, dst, s[0])
            if s[0] != FILE:  # a symlink or special file: the new name's own entry record
                own = [r for r in records.subtree(t, src, s) if r[1] in (entry_key(src), attr_key(src))]
                records.place(t, own, src, dst, self.hooks.arrive, self.writes.changed)
            else:
                value = self.hooks.arrive(t, dst, t.get(src), src)
                t.put(dst, value)
                self.writes.changed(t, dst, value)
            if (xattrs := t.get(xattr_key(src), SIDE)) is not None:  # the file's, on each name
                records.put_xattrs(t, [dst], xattrs)
            names = records.join_group(t, src, dst, s[4])
            records.touch_names(t, names, s[3], s[0], self.lookups.default_attrs, clock())
            self.entries.folder_changed(t, dst.rpartition("/")[0], parent[3], clock())

        self.writes.run(run)


class _FileWrite:
    """One file of :meth:`Tree.store`: what it reads before (its probe, when it may be new)
    and what it writes once probed, as ``how`` (:class:`CommitOptions`) says."""

    def __init__(self, tree: Tree, key: str, value: Any, attrs: Attrs | None, how: CommitOptions) -> None:
        self.tree, self.key, self.value, self.attrs = tree, key, value, attrs
        self.create, self.exclusive = how.create, how.exclusive
        self.replace, self.linked = how.replace, how.linked
        self.added, self.renamed_from, self.parted = how.added, how.renamed_from, how.parted
        self.base, self.lay, self.xattrs = how.base, how.lay, how.xattrs
        self.probing = self.create or self.exclusive
        # Changes to lay on the newest version: it is probed (not a new file's probe).
        self.laying = self.lay is not None and self.base is not None and not self.probing
        self.newest: Node | None = None  # what that probe found
        # Remote: what the format layer will read comes in the probe's round trip.
        self.also = tree.hooks.reads(key) if (self.probing or self.laying) and tree.driver.remote else ()
        self.hint = attrs.parted if attrs is not None else None  # the version this one replaces
        self.record = None if attrs is None else attrs.pack_parted(self.parted)

    def write(self, t: Txn, folder: Any, found: Any) -> None:
        """The writes of this file, given the probes of its folder and of its name."""
        tree, key = self.tree, self.key
        pointer = None
        if self.probing:
            if found is not None and self.replace and not self.exclusive and found[0] not in (FILE, DIR):
                records.remove_name(t, key, found, tree.lookups.default_attrs, clock())  # a symlink
                found = None
            if found is not None and (self.exclusive or found[0] != FILE):
                raise FsError(errno.EISDIR if found[0] == DIR else errno.EEXIST, key)
            if found is None:
                tree.hooks.check_name(t, key, FILE)
                # A pointer left by a writer that deleted the key must not link the new file.
                records.drop_pointer(t, key)
            else:
                pointer = found[4]
            if self.xattrs:  # a new file's (ACLs from its folder's default ACL, or set before)
                records.put_xattrs(t, [key], self.xattrs)
        elif self.linked:
            pointer = t.get(pointer_key(key), SIDE)
        stored_value = self.value
        if self.lay is not None and self.base is not None:
            node = self.newest if self.laying else tree.lookups.find_in(t, key)
            if node is not None and node.kind == FILE and stamp_of(node) != self.base:
                stored_value = self.lay(parts.whole(t, key, t.get(key)) or b"")
        names = [key]
        if self.probing:
            # A new file in its place: that name is not linked; its parts go with its last name.
            if found is not None and (
                pointer is None or not records.leave_group(t, key, found, tree.lookups.default_attrs, clock())
            ):
                tree.writes.let_go(parts.parted_of(found[3]))
        else:
            names = records.names_of(t, key, pointer)
            if self.hint is not None:
                tree.writes.let_go(parts.parted_of(t.get(attr_key(key), SIDE)))
        written = records.write_file(t, names, stored_value, self.record, tree.hooks.store)
        for name, stored in written:
            tree.writes.changed(t, name, stored)
        tree.writes.keep(self.parted)
        if len(names) == 1 and self.record is not None and tree.writes.leaving:
            attrs = Attrs.unpack(self.record)
            if attrs is not None:  # the next stat need not ask
                size = self.parted.size if self.parted is not None else len(written[0][1])
                tree.writes.leave(key, Node(FILE, size, attrs))
        if folder is not None:
            tree.entries.commit_folders(t, key, folder, found, self.added, self.renamed_from)

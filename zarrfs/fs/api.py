"""The filesystem calls, by store key: each method says what one call means for the tree and
the open-file table.

:mod:`zarrfs.fuse.session` turns kernel requests into these calls (node IDs into keys) and their
results into replies; an exception raised here becomes the caller's errno there, through
:func:`to_errno`. Nothing here knows about FUSE.

This module is the one door of the filesystem for the protocol layer: what
:mod:`zarrfs.fuse` needs of :mod:`zarrfs.fs` (nodes and their kinds, rename flags, what a
commit stored, the errno mapping, the page cache policy, the change feed) is re-exported here,
so that the modules behind it can be rearranged without touching the protocol.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from zarrfs.backends.errors import InterruptedCallError, RestartedError
from zarrfs.fs import acl, hardlinks
from zarrfs.fs import xattrs as xattr_rules
from zarrfs.fs.changes import ChangeWatcher, folders_of
from zarrfs.fs.entries import without_setid
from zarrfs.fs.errors import FsError, is_quiet, log_level, to_errno
from zarrfs.fs.handles import HandleTable, Stored
from zarrfs.fs.listing import DirListing, Held
from zarrfs.fs.locks import UNLCK, WRLCK, Lock, LockTable, Waiters
from zarrfs.fs.names import NAME_MAX, key_text, name_bytes
from zarrfs.fs.node import stamp_of
from zarrfs.fs.opennames import OpenNames
from zarrfs.fs.pagecache import DIRECT_ABOVE, TWO_VERSIONS, PageCache, Pages, version_mark
from zarrfs.fs.sidedata import pack_xattrs, unpack_xattrs
from zarrfs.fs.tree import (
    DIR,
    FILE,
    LINK,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    Node,
    Tree,
    check_rename_flags,
)

log = logging.getLogger("zarrfs.fs.api")

NOW = "now"  # a time to set to the present (UTIME_NOW)


def stored_blocks(node: Node) -> int:
    """``st_blocks`` of ``node``: 512-byte units of what is stored (a file stored in parts
    counts its parts that are not holes; an open file, the ranges of its buffer that hold data)."""
    if node.allocated is not None:
        return (node.allocated + 511) // 512
    parted = node.attrs.parted
    size = parted.stored_bytes() if parted is not None and parted.size == node.size else node.size
    return (size + 511) // 512


class Operations:
    """Filesystem calls over a :class:`Tree` and its :class:`HandleTable`: each call that
    touches more than one of them (the tree, the open files, what namespace changes do to
    open files (:class:`OpenNames`), the locks) does it here. Calls on an open handle that
    concern its file alone (read, write, seek, fallocate, fsync, truncate, opened) are the
    :class:`HandleTable`'s (:attr:`handles`), which the session calls directly."""

    def __init__(self, tree: Tree, handles: HandleTable, locks: LockTable | None = None) -> None:
        self.tree = tree
        #: The open files.
        self.handles = handles
        #: What namespace changes do to open files.
        self.names = OpenNames(handles.files, tree, handles.commit)
        self.dirs: dict[int, DirListing] = {}
        self._next_dir = 1
        #: File locks held in the database (None: the kernel keeps them, for this mount only).
        self.locks = locks
        self._waiters: Waiters | None = None
        self._lockers: dict[int, set[tuple[str, int]]] = {}  # fh -> (key, owner) that locked
        self._waiting: dict[int, tuple[str, int]] = {}  # request -> (key, fh) of a waiting lock

    def on_keys_changed(self, callback: Callable[[list[str]], None] | None) -> None:
        """Have ``callback(keys)`` called when a call changed keys other than the ones it
        named (a consolidated document the format layer rewrote after a metadata write), before
        that call returns; the caller drops what it caches of them. One callback: a later one
        replaces it, None removes it."""
        self.tree.on_side_effects = callback

    def destroy(self) -> None:
        """The end of the mount: store open files, drop this mount's locks, close the database."""
        self.handles.commit_all()
        if self._waiters is not None:
            self._waiters.stop()
        if self.locks is not None:
            self.locks.release_all()
        self.tree.driver.close()

    # ------------------------------------------------------------------ locks
    def start_locks(self, answer: Callable[[int, int], None]) -> None:
        """Begin serving waiting lock requests: ``answer(request, errno)`` is called (from
        another thread) when one is granted (0) or ends otherwise."""
        if self.locks is not None and self._waiters is None:

            def granted(request: int, code: int) -> None:
                waited = self._waiting.pop(request, None)
                if code == 0 and waited is not None:
                    self.handles.lock_granted(*waited)
                answer(request, code)

            self._waiters = Waiters(self.locks, granted)

    def getlk(self, key: str, owner: int, start: int, end: int, type: int, flock: bool) -> Lock | None:
        """The lock that would block this one, or None."""
        assert self.locks is not None
        return self.locks.test(key, owner, start, end, type, flock)

    def setlk(
        self, key: str, fh: int, owner: int, start: int, end: int, type: int, pid: int, flock: bool,
        wait: int | None = None,
    ) -> bool | None:
        """Take or release a lock: True when done, False when another owner's lock conflicts;
        with ``wait`` (a request ID) a conflicting request is kept and answered later through
        the callback of :meth:`start_locks`, and None is returned.

        Locks bring the file up to date, as NFS's do: before a lock is released or
        downgraded (a read lock asked for), the file's pending writes are committed, as
        ``fsync`` commits them; once one is granted, the file is read and written from the
        newest stored version on (:meth:`HandleTable.lock_granted`)."""
        assert self.locks is not None
        args = (key, owner, start, end, type, pid, flock)
        if type != WRLCK:
            self.handles.commit_key(key, fh)
        if type != UNLCK:
            self._lockers.setdefault(fh, set()).add((key, owner))
        if self.locks.set(*args):
            if type != UNLCK:
                self.handles.lock_granted(key, fh)
            return True
        if wait is None or self._waiters is None:
            return False
        self._waiting[wait] = (key, fh)
        self._waiters.wait(wait, args)
        return None

    def interrupt(self, request: int) -> None:
        """The caller of ``request`` was interrupted: a lock it waits for is not waited for."""
        if self._waiters is not None:
            self._waiters.cancel(request)

    def _unlock(self, fh: int, owner: int | None) -> None:
        # A close: the POSIX locks of ``owner`` (FLUSH), or every lock taken through ``fh``
        # (its last RELEASE, which is all a read-only file, closed without FLUSH, sends). The
        # file is committed before its locks go, as at any unlock.
        pairs = self._lockers.get(fh)
        if not pairs or self.locks is None:
            return
        for key, who in list(pairs):
            if owner is None or who == owner:
                try:
                    self.handles.commit_key(key, fh)
                except Exception as exc:  # the close reports it (flush); the lock goes anyway
                    log.error("commit of %s at its unlock failed: %s", key, exc)
                self.locks.release(key, who, None if owner is None else False)
        if owner is None:
            del self._lockers[fh]

    # ------------------------------------------------------------------ attributes
    def knows_names(self) -> bool:
        """Whether a lookup may answer that a name is missing from what the mount knows of its
        folder, without asking the database (``fs.knownfolders``: a database server): then a
        name another mount made shows only once the change feed told of it."""
        return self.tree.known is not None

    def find(self, key: str, folder: str | None = None, name: str | None = None) -> Node | None:
        """The node at ``key``, pending writes included, or None (the hot path of every
        lookup; ``folder`` and ``name``: ``key`` split, when the caller has them)."""
        handles = self.handles
        # pending() answers None while no file is open: its call spared on every other lookup.
        node = (handles.states or handles.paged) and handles.pending(key) or self.tree.find(key, folder, name)
        return self._shown(key, node) if node is not None and node.kind == DIR else node

    def _shown(self, key: str, node: Node | None) -> Node | None:
        """``node`` at ``key`` as shown: a folder changed when a file was made in it that is not
        stored yet (its record says so only at that file's commit)."""
        if node is None or node.kind != DIR:
            return node
        born = self.handles.newest_unstored(key)
        if born is None or born <= node.attrs.ctime:
            return node
        return replace(node, attrs=replace(node.attrs, mtime=born, ctime=born))

    def names_left(
        self, names: list[str], group: str, kind: int, rewritten: set[str] | None
    ) -> tuple[list[str], str]:
        """Which of ``names``, one file's (of type ``kind``, link group ``group``) as this mount
        knew them, are still that file after changes made elsewhere
        (:func:`hardlinks.still_the_file`; ``rewritten``: from the change feed), and its link
        group now ("" for none). A file open here under a name it lost lives on under those
        left."""
        found = {name: self.tree.find(name) for name in names}
        opened = self.names
        seen = {v for v in map(opened.seen_at, names) if v is not None}
        kept = hardlinks.still_the_file(names, found, group, kind, rewritten, seen)
        for name in names if kept else ():
            if name not in kept:
                opened.left_elsewhere(name)
        node = found[kept[0]] if kept else None
        return kept, "" if node is None else node.group

    def statfs(self) -> dict[str, int]:
        """``statvfs`` figures: block and inode counts of the real free space behind the
        database."""
        info = self.tree.driver.statfs() or {"total": 1 << 40, "free": 1 << 40}
        bsize = 4096
        return {
            "f_bsize": bsize,
            "f_frsize": bsize,
            "f_blocks": info["total"] // bsize,
            "f_bfree": info["free"] // bsize,
            "f_bavail": info["free"] // bsize,
            "f_files": 1 << 32,
            "f_ffree": 1 << 31,
            "f_favail": 1 << 31,
            "f_namemax": NAME_MAX,
        }

    @staticmethod
    def _times(changes: dict) -> dict:
        """``changes`` with :data:`NOW` times made the time now (in place)."""
        now = time.time_ns()
        for name in ("atime", "mtime"):
            if changes.get(name) == NOW:
                changes[name] = now
        return changes

    def set_attrs(self, key: str, **changes: int | str | None) -> None:
        """Change mode, owner or times (``None`` leaves one as it is, :data:`NOW` is now); a
        ``chmod`` changes the access ACL too, in the same transaction (:mod:`zarrfs.fs.acl`)."""
        if not self.names.set_attrs(key, **self._times(changes)):
            mtimes = self.tree.set_attrs(key, **changes)
            if mtimes is not None:
                self.handles.restamped(key, *mtimes)

    # ------------------------------------------------------------------ POSIX ACLs
    #: Whether the kernel enforces POSIX ACLs (FUSE_POSIX_ACL was agreed): the session sets it.
    acl = False

    def made_mode(self, key: str, mode: int, umask: int, folder: bool) -> tuple[int, bytes | None]:
        """The mode of a node made at ``key`` with ``mode`` and ``umask``, and the extended
        attributes record it is made with: the access ACL (and, for a folder, the default ACL)
        it gets from its folder's default ACL (None: none). Without ACLs, or a default ACL on
        the folder, the umask applies."""
        if not self.acl:
            return mode & ~umask, None
        parent = key.rpartition("/")[0]
        try:
            default = self.tree.xattrs(parent).get(acl.DEFAULT)
        except FsError:
            default = None
        if default is None:
            return mode & ~umask, None
        entries, mode = acl.inherit(acl.parse(default), mode)
        given = {} if acl.equivalent(entries) else {acl.ACCESS: acl.pack(entries)}
        if folder:
            given[acl.DEFAULT] = default
        return mode, pack_xattrs(given) if given else None

    def set_open_attrs(self, fh: int, **changes: int | str | None) -> None:
        """:meth:`set_attrs` of the file open as ``fh``: ``fchmod``, ``fchown``, ``futimens``
        of a file whose name may be gone (then only its descriptors see the change)."""
        key = self.names.set_open_attrs(fh, self._times(changes))
        if key is not None:
            self.set_attrs(key, **changes)

    # ------------------------------------------------------------------ folders
    def opendir(self, key: str) -> int:
        """Open a folder for listing. The kernel opens only what it knows as a folder; that
        it still is one is checked by the listing's first read (a round trip less on a remote
        database): one gone or replaced since is ENOENT or ENOTDIR there."""
        fh = self._next_dir
        self._next_dir += 1
        self.dirs[fh] = DirListing(self.tree.listings, key, extra=lambda: self._unstored_names(key))
        return fh

    def _unstored_names(self, folder: str) -> list[str]:
        """The names of files in ``folder`` made here and not stored yet, asked by a listing
        before each of its windows (see ``DirListing``); read again when a request on another
        thread (an open or a reader's close) changed the table of open files meanwhile."""
        while True:
            try:
                return self.handles.unstored_names(folder)
            except RuntimeError:  # "dictionary changed size during iteration"
                continue

    def readdir(self, fh: int, offset: int) -> Iterator[tuple[str, int, int]]:
        """``(name, kind, offset)`` of the entries after ``offset``, produced as they are
        taken (a reply holds what fits)."""
        listing = self.dirs.get(fh)
        if listing is None:
            raise FsError(errno.EBADF, str(fh))
        return listing.entries(offset)

    def readdirplus(
        self, fh: int, offset: int, most: int, held: Held | None = None
    ) -> list[tuple[str, int, int, str, Node | None]]:
        """``(name, kind, offset, key, node)`` of up to ``most`` entries after ``offset``, all
        of one window of the listing (empty at its end; a next call goes on from the last
        offset): :meth:`readdir`'s entries with what a lookup of each name would find (None
        for ``.``, ``..``, a name gone since it was listed, and a name whose node ``held`` says
        the caller has already: those nodes are not read). Nodes are read a
        window of entries at a time; a file open here with pending writes shows its pending
        size and attributes, as :meth:`find` gives them (the kernel takes a listing's
        attributes over what a truncate or write set)."""
        listing = self.dirs.get(fh)
        if listing is None:
            raise FsError(errno.EBADF, str(fh))
        listing.plus = True
        listing.held = held
        out = listing.plus_rows(offset, most, self._shown)
        if not out or out[0][2] <= 2:  # "." and "..", alone in their list
            return out
        handles = self.handles
        # Only an open file shows other than its stored node (most listings: none).
        pending = handles.pending if handles.states or handles.paged else None
        # A first listing's window was found none held as it was read (ahead), most often.
        asked = held is not None and not listing.none_held(held)
        holds = held.holds if asked and not held.holds_none([row[3] for row in out]) else None
        if holds is None and pending is None:
            return out
        checked = []
        append = checked.append
        for row in out:
            name, kind, at, key, node = row
            if holds is not None and holds(key, kind):
                node = None
            elif pending is not None:
                node = self._shown(key, pending(key) or node)
            append(row if node is row[4] else (name, kind, at, key, node))
        return checked

    def read_ahead(self, fh: int, offset: int, count: int) -> bool:
        """Read the next window of the listing open as ``fh`` when fewer than ``count`` of
        its entries are held past ``offset``, the last one given (``DirListing.read_ahead``):
        work for the time between two requests of a program walking a folder. Whether more
        may be worth reading."""
        listing = self.dirs.get(fh)
        return listing is not None and listing.read_ahead(offset, count)

    def releasedir(self, fh: int) -> None:
        """Close a folder."""
        self.dirs.pop(fh, None)

    def mkdir(
        self, key: str, mode: int, uid: int | None = None, gid: int | None = None, umask: int = 0
    ) -> None:
        """Make a folder (kept while empty), owned by the caller; ``umask``: the caller's, when
        the kernel left it to the filesystem (ACLs: :meth:`made_mode`)."""
        mode, xattrs = self.made_mode(key, mode, umask, True)
        self.tree.mkdir(key, mode, uid, gid, xattrs)

    def mknod(self, key: str, mode: int, rdev: int, uid: int, gid: int, umask: int = 0) -> None:
        """Make a file of the type in ``mode``: a regular file (empty, stored at once), or a
        FIFO, device or socket (side data, like a symlink)."""
        if stat.S_ISREG(mode):
            self.release(self.create(key, mode, os.O_WRONLY | os.O_CREAT | os.O_EXCL, uid, gid, umask))
        else:
            mode, xattrs = self.made_mode(key, mode, umask, False)
            self.tree.mknod(key, mode, rdev, uid, gid, xattrs)

    def rmdir(self, key: str) -> None:
        """Remove an empty folder (a file created here and not stored yet is in it)."""
        if self.handles.unstored_names(key):
            raise FsError(errno.ENOTEMPTY, key, quiet=True)
        self.tree.rmdir(key)

    # ------------------------------------------------------------------ names
    def unlink(self, key: str) -> None:
        """Remove a file or symlink (open descriptors keep what they hold)."""
        if not self.names.unlinked(key):
            self.tree.unlink(key)

    def rename(self, src: str, dst: str, flags: int = 0) -> Stored | None:
        """Move a file or folder, atomically, honouring RENAME_NOREPLACE / RENAME_EXCHANGE.
        A held temporary file is stored by its rename: then what was stored is returned.
        Other flags (RENAME_WHITEOUT) are EINVAL: the rename is not done."""
        check_rename_flags(src, flags)
        if self.handles.unstored(src) is not None and not flags & RENAME_EXCHANGE:
            return self.handles.store_as(src, dst, exclusive=bool(flags & RENAME_NOREPLACE))
        exchange = bool(flags & RENAME_EXCHANGE)
        self.names.before_rename(src, dst, exchange, unstored_below=bool(self.handles.unstored_names(dst)))
        if not self.tree.rename(src, dst, flags):
            return None  # two names of one file: nothing moved
        self.names.renamed(src, dst, exchange=exchange)
        if self.locks is not None and not flags & RENAME_EXCHANGE and src in self.locks.keys:
            self.locks.renamed(src, dst)  # locks belong to the open file, whatever its name
            for pairs in self._lockers.values():
                for key, owner in [p for p in pairs if p[0] == src]:
                    pairs.discard((key, owner))
                    pairs.add((dst, owner))
        return None

    def link(self, src: str, dst: str) -> None:
        """A hard link: ``dst`` becomes another name of the file ``src`` (its pending content
        is stored first); EEXIST when ``dst`` exists."""
        self.names.settle(src)
        self.tree.link(src, dst)
        self.names.linked(src, dst)

    def symlink(self, target: str, key: str, uid: int, gid: int) -> None:
        """Make a symlink at ``key`` pointing to ``target``."""
        self.tree.symlink(target, key, uid, gid)

    def readlink(self, key: str) -> str:
        """The target of a symlink."""
        return self.tree.readlink(key)

    # ------------------------------------------------------------------ extended attributes
    def getxattr(self, key: str, name: bytes, record: dict[bytes, bytes] | None = None) -> bytes:
        """The value of one extended attribute; ENODATA when the node has none of that name
        (a POSIX ACL: EOPNOTSUPP when the kernel does not enforce them). ``record``: every
        attribute of the node, as the caller read it (:meth:`xattrs`) or knows it."""
        refused = self.absent_xattr(name)
        if refused != errno.ENODATA:  # the name itself, whatever the node holds
            raise FsError(refused, f"{key}: {name!r}", quiet=True)
        value = (self.xattrs(key) if record is None else record).get(name)
        if value is None:
            raise FsError(errno.ENODATA, f"{key}: {name!r}", quiet=True)
        return value

    def absent_xattr(self, name: bytes) -> int:
        """The errno :meth:`getxattr` raises for ``name`` on a node without it: ENODATA, or
        for a POSIX ACL EOPNOTSUPP when the kernel does not enforce them, or EINVAL for a
        namespace alone (a caller that knows the node's record answers it without a raise)."""
        if name in xattr_rules.STORED_PREFIXES:  # a namespace alone names nothing
            return errno.EINVAL
        return errno.EOPNOTSUPP if name in acl.NAMES and not self.acl else errno.ENODATA

    def listxattr(self, key: str, record: dict[bytes, bytes] | None = None) -> list[bytes]:
        """The names of a node's extended attributes (``record``: as for :meth:`getxattr`)."""
        names = self.xattrs(key) if record is None else record
        return sorted(n for n in names if self.acl or n not in acl.NAMES)

    def xattrs(self, key: str) -> dict[bytes, bytes]:
        """Every extended attribute of ``key`` (a file not stored yet: those it will be stored
        with)."""
        state = self.handles.unstored(key)
        return self.tree.xattrs(key) if state is None else unpack_xattrs(state.xattrs)

    def setxattr(self, key: str, name: bytes, value: bytes | None, flags: int = 0) -> None:
        """Set (or, with ``value`` None, remove) an extended attribute (see
        :mod:`zarrfs.fs.xattrs`; POSIX ACLs: :mod:`zarrfs.fs.acl`); an open file's pending
        content is stored first, but a file made here and not stored yet takes it with what
        it will be stored with (``cp -a``'s ACL before its close: no round trip)."""
        if name in acl.NAMES and not self.acl:
            raise FsError(errno.EOPNOTSUPP, f"{key}: POSIX ACLs need default_permissions", quiet=True)
        state = self.handles.unstored(key)
        if state is not None and state.attrs is not None:
            value, mode_bits = xattr_rules.prepare(name, value, flags)
            raw = xattr_rules.applied(state.xattrs, state.attrs, key, name, value, flags, mode_bits)
            state.xattrs = raw or None
            state.dirty = True
            return
        self.names.settle(key, below=False)
        # An access ACL sets the mode in the same transaction (zarrfs.fs.xattrs); the record
        # an open file commits with is kept in step.
        self.tree.set_xattr(key, name, value, flags)
        if name == acl.ACCESS and value is not None:
            self.names.access_acl_set(key, value)

    # ------------------------------------------------------------------ files
    def create(self, key: str, mode: int, flags: int, uid: int, gid: int, umask: int = 0) -> int:
        """Create and open a file; stored at its first commit (at once when it gets an ACL
        from its folder's default ACL, which is kept with the stored file)."""
        mode, xattrs = self.made_mode(key, mode, umask, False)
        fh = self.handles.create(key, mode | stat.S_IFREG, flags, uid, gid, xattrs)
        if xattrs is not None:  # stored at once with its ACL, which the kernel reads next
            self.names.settle(key)
        return fh

    def close_writes_nothing(self, fh: int) -> bool:
        """Whether a close of ``fh`` (its flush or release) writes nothing to the database:
        it was opened read-only and holds no locks."""
        return self.handles.is_reader(fh) and fh not in self._lockers

    # flush, fsync and release return what they stored (Stored), if anything.
    def flush(self, fh: int, lock_owner: int | None = None) -> Stored | None:
        """A ``close``: commit the file's pending content; the POSIX locks of ``lock_owner``
        taken through this file are released."""
        try:
            return self.handles.flush(fh)
        finally:
            if lock_owner is not None and fh in self._lockers:
                self._unlock(fh, lock_owner)

    def flush_shares(self, fh: int) -> bool:
        """Whether a close of ``fh`` may be served with others' (:meth:`HandleTable.flush_many`): it was
        opened for writing, holds no locks (an unlock is its own step) and its file has one
        name (a file with hard links is one state under several nodes)."""
        return self.handles.may_share_commit(fh) and fh not in self._lockers

    def release(self, fh: int) -> Stored | None:
        """The last close of an open file (and of the locks taken through it)."""
        try:
            return self.handles.release(fh)
        finally:
            if fh in self._lockers:
                self._unlock(fh, None)


__all__ = [
    "ChangeWatcher",
    "DIR",
    "DIRECT_ABOVE",
    "FILE",
    "LINK",
    "NAME_MAX",
    "NOW",
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "TWO_VERSIONS",
    "FsError",
    "HandleTable",
    "InterruptedCallError",
    "RestartedError",
    "Lock",
    "LockTable",
    "Node",
    "Operations",
    "PageCache",
    "Pages",
    "version_mark",
    "Stored",
    "folders_of",
    "is_quiet",
    "log_level",
    "key_text",
    "name_bytes",
    "stamp_of",
    "stored_blocks",
    "to_errno",
    "without_setid",
]

"""The namespace: every change to the tree of files and folders over a driver, and
:class:`Tree`, the filesystem over one driver.

A path is a key (``/grp/arr/0.0`` is ``grp/arr/0.0``); folders derive from key prefixes and
side markers (:mod:`zarrfs.fs.lookups`). A :class:`Tree` is three parts: lookups
(:class:`zarrfs.fs.lookups.Lookups`), listings (:class:`zarrfs.fs.listing.Listings`) and the
writes here (commit, mkdir, symlink, unlink, rmdir, set_attrs, rename, link), with
:class:`Hooks`, where the format layer plugs in.

Everything here is one driver transaction per call; nothing here knows about FUSE, so it imports
and tests without a mount. POSIX conditions are raised as :class:`zarrfs.fs.errors.FsError`.
"""

from __future__ import annotations

import errno
import stat
import time
from typing import Any

from zarrfs.backends.base import DATA, SIDE, VALUES, Driver, Get, HasPrefix, StorageFullError, Txn
from zarrfs.fs.errors import FsError
from zarrfs.fs.listing import FOLDER_BATCH, Listings
from zarrfs.fs.lookups import DIR, FILE, LINK, Lookups, Node
from zarrfs.fs.sidedata import DIR_MARK, ENTRY, EPOCH, LINK_MARK, Attrs, attr_key, entry_key

# Names other modules import from here (their home is zarrfs.fs.lookups / zarrfs.fs.listing).
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
]

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class Hooks:
    """Where the format layer plugs into the tree. This base class accepts everything as is."""

    def check_name(self, txn: Txn, key: str, kind: int) -> None:
        """Refuse (raise) a new file or folder name; called by create, mkdir, rename, link."""

    def store(self, txn: Txn, key: str, value: Any) -> Any:
        """Validate (and possibly transform) bytes written through a file before they are stored;
        return what to store. Raise to refuse: nothing is stored."""
        return value

    def arrive(self, txn: Txn, key: str, value: bytes, source: str) -> bytes:
        """Validate a stored value arriving at ``key`` from ``source`` by rename or link, and
        return what to store there (``source`` is empty when the file moves with its folder).
        Raise to refuse."""
        return value

    def reads(self, key: str) -> list[str]:
        """Data keys :meth:`check_name` and :meth:`store` will read for a new file at ``key``.
        On a remote database the tree fetches them together with its own first reads, so the
        commit of a new file costs one round trip of reads."""
        return []

    def changed(self, txn: Txn, key: str, value: Any) -> None:
        """Called, in the same transaction, after data key ``key`` was set to ``value`` (bytes
        or a buffer) or deleted (``None``)."""

    def shown_size(self, txn: Txn, key: str, size: int) -> int:
        """The size a file shows (a decoded view shows the decoded size)."""
        return size

    def shown_value(self, txn: Txn, key: str, value: bytes) -> bytes:
        """The bytes a file shows when read."""
        return value


class _Recording:
    """A transaction as the hooks see it: every data key they write is noted, so that the
    kernel's caches of those files can be dropped after the commit."""

    def __init__(self, txn: Txn, into: set[str]) -> None:
        self._txn = txn
        self._into = into

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        if space == DATA:
            self._into.add(key)
        self._txn.put(key, value, space)

    def delete(self, key: str, space: str = DATA) -> None:
        if space == DATA:
            self._into.add(key)
        self._txn.delete(key, space)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class Tree(Listings, Lookups):
    """The filesystem over one driver: lookups, listings and every namespace change.

    ``uid``/``gid``/``umask`` give the attributes of nodes that have none recorded.
    ``on_side_effects(keys)`` is called after a commit in which the hooks changed other keys
    than the ones asked for (a consolidated ``.zmetadata``), so the mount can drop the
    kernel's cached attributes and pages of those files.
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
        self.uid = uid
        self.gid = gid
        self.umask = umask
        self.hooks = hooks or Hooks()
        self.on_side_effects: Any = None
        #: Snapshots of busy folders for :meth:`find` (a FolderCache), or None.
        self.folder_cache: Any = None
        self._side_effects: set[str] = set()
        self._hidden_logged: set[str] = set()
        self.epoch = self._load_epoch()

    def _load_epoch(self) -> int:
        """The time of nodes without attributes, fixed at the first mount (see sidedata)."""
        raw = self.driver.get(EPOCH, SIDE)
        if raw is not None:
            return int(raw)
        now = time.time_ns()
        if not self.driver.readonly:
            self.driver.put(EPOCH, str(now).encode(), SIDE)
        return now

    # ------------------------------------------------------------------ writes
    def _write(self, run: Any) -> Any:
        """Run a write transaction; then report keys the hooks changed on the side."""
        self._side_effects = touched = set()
        try:
            result = self.driver.transact(run)
        finally:
            if self.folder_cache is not None:
                self.folder_cache.clear()
        if touched and self.on_side_effects is not None:
            self.on_side_effects(sorted(touched))
        return result

    def _changed(self, t: Txn, key: str, value: Any) -> None:
        self.hooks.changed(_Recording(t, self._side_effects), key, value)

    def _now(self) -> int:
        return time.time_ns()

    def _keep_parent(self, t: Txn, key: str) -> None:
        """After ``key`` left its folder, keep the folder (POSIX: only rmdir removes one)."""
        parent = key.rpartition("/")[0]
        if not parent:
            return
        marked, data_below, side_below = t.read_many(
            [
                Get(entry_key(parent), SIDE),
                HasPrefix(parent + "/", DATA),
                HasPrefix(ENTRY + parent + "/", SIDE),
            ]
        )
        if marked is None and not data_below and not side_below:
            t.put(entry_key(parent), DIR_MARK, SIDE)

    def commit(
        self,
        key: str,
        value: Any,
        attrs: Attrs | None,
        create: bool = False,
        exclusive: bool = False,
        replace: bool = False,
    ) -> None:
        """Store the content of a file written through the mount, with its attributes, in one
        transaction; the format layer may refuse it (nothing is stored then).

        ``create``: the file may be new here (its folder must exist, a folder or symlink in the
        way is an error); ``exclusive``: it must be new (EEXIST otherwise), as for ``link`` or
        ``RENAME_NOREPLACE``; ``replace``: a symlink in the way is replaced, as a rename does."""

        # Remote: what the format layer will read comes in the probe's round trip.
        also = self.hooks.reads(key) if (create or exclusive) and self.driver.remote else ()

        def run(t: Txn) -> None:
            if create or exclusive:
                found = self._probe_in_folder(t, key, also)
                if found is not None and replace and not exclusive and found[0] not in (FILE, DIR):
                    t.delete(entry_key(key), SIDE)  # the symlink the rename replaces
                    found = None
                if found is not None and (exclusive or found[0] != FILE):
                    raise FsError(errno.EISDIR if found[0] == DIR else errno.EEXIST, key)
                if found is None:
                    self.hooks.check_name(t, key, FILE)
            stored = self.hooks.store(t, key, value)
            t.put(key, stored)
            if attrs is not None:
                t.put(attr_key(key), attrs.pack(), SIDE)
            self._changed(t, key, stored)

        self._write(run)

    def check_create(self, key: str) -> None:
        """Raise unless the name ``key`` is valid for a new file. The kernel has just looked up
        the name and its folder; the commit checks both again in its own transaction."""
        self.driver.transact(lambda t: self.hooks.check_name(t, key, FILE), write=False)

    def mkdir(self, key: str, mode: int) -> None:
        """Make an empty folder that persists (EEXIST if taken, ENOENT/ENOTDIR for the parent)."""

        def run(t: Txn) -> None:
            if not key or self._probe_in_folder(t, key) is not None:
                raise FsError(errno.EEXIST, key)
            self.hooks.check_name(t, key, DIR)
            now = self._now()
            t.put(entry_key(key), DIR_MARK, SIDE)
            t.put(attr_key(key), self._new_attrs(DIR, mode, now).pack(), SIDE)

        self._write(run)

    def _new_attrs(self, kind: int, mode: int, now: int, uid: int | None = None, gid: int | None = None):
        return Attrs(
            kind | stat.S_IMODE(mode),
            self.uid if uid is None else uid,
            self.gid if gid is None else gid,
            now,
            now,
            now,
        )

    def symlink(self, target: str, key: str, uid: int | None = None, gid: int | None = None) -> None:
        """Make a symlink at ``key`` pointing to ``target`` (kept as side data: not a Zarr key)."""

        def run(t: Txn) -> None:
            if self._probe_in_folder(t, key) is not None:
                raise FsError(errno.EEXIST, key)
            now = self._now()
            t.put(entry_key(key), LINK_MARK + target.encode("utf-8", "surrogateescape"), SIDE)
            t.put(attr_key(key), self._new_attrs(LINK, 0o777, now, uid, gid).pack(), SIDE)

        self._write(run)

    def _removing(self, run: Any) -> None:
        """Run a removal; on a full store, again without keeping the folder it empties: the
        folder's mark is a write a full store may refuse, and removing must stay possible
        (the emptied folder then goes, as ``rm -r`` would take it next)."""
        try:
            self._write(run)
        except StorageFullError:
            self._write(lambda t: run(t, keep=False))

    def unlink(self, key: str) -> None:
        """Remove the file or symlink at ``key`` (EISDIR for a folder)."""

        def run(t: Txn, keep: bool = True) -> None:
            found = self._probe(t, key)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] == DIR:
                raise FsError(errno.EISDIR, key)
            if found[0] == FILE:
                t.delete(key)
                self._changed(t, key, None)
            else:
                t.delete(entry_key(key), SIDE)
            t.delete(attr_key(key), SIDE)
            if keep:
                self._keep_parent(t, key)

        self._removing(run)

    def rmdir(self, key: str) -> None:
        """Remove the empty folder at ``key`` (ENOTEMPTY, ENOTDIR, ENOENT as POSIX says)."""

        def run(t: Txn, keep: bool = True) -> None:
            found = self._probe(t, key)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] != DIR:
                raise FsError(errno.ENOTDIR, key)
            if not key:
                raise FsError(errno.EBUSY, "the root folder")
            if self._has_children(t, key):
                raise FsError(errno.ENOTEMPTY, key, quiet=True)
            t.delete(entry_key(key), SIDE)
            t.delete(attr_key(key), SIDE)
            if keep:
                self._keep_parent(t, key)

        self._removing(run)

    def set_attrs(
        self,
        key: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime: int | None = None,
        mtime: int | None = None,
    ) -> None:
        """Change mode, owner or times of ``key`` (``-1`` owner means unchanged, as chown)."""

        def run(t: Txn) -> None:
            found = self._probe(t, key)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            attrs = self._attrs(t, key, found[0])
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
            attrs.ctime = self._now()
            t.put(attr_key(key), attrs.pack(), SIDE)

        self._write(run)

    # ------------------------------------------------------------------ rename / link
    def _subtree(self, t: Txn, key: str) -> list[tuple[str, str, bytes]]:
        """Every record of the node at ``key`` and below: (space, key, value)."""
        records: list[tuple[str, str, bytes]] = []
        value = t.get(key)
        if value is not None:
            records.append((DATA, key, value))
        records.extend((DATA, k, v) for k, v in t.scan_prefix(key + "/", fetch=VALUES))
        for side_prefix in (ENTRY, "a:"):
            raw = t.get(side_prefix + key, SIDE)
            if raw is not None:
                records.append((SIDE, side_prefix + key, raw))
            records.extend(
                (SIDE, k, v) for k, v in t.scan_prefix(side_prefix + key + "/", space=SIDE, fetch=VALUES)
            )
        return records

    @staticmethod
    def _moved(record_key: str, src: str, dst: str) -> str:
        for side_prefix in (ENTRY, "a:"):
            if record_key.startswith(side_prefix):
                return side_prefix + dst + record_key[len(side_prefix) + len(src) :]
        return dst + record_key[len(src) :]

    def _remove(self, t: Txn, records: list[tuple[str, str, bytes]]) -> None:
        for space, k, _ in records:
            t.delete(k, space)
            if space == DATA:
                self._changed(t, k, None)

    def _place(self, t: Txn, records: list[tuple[str, str, bytes]], src: str, dst: str) -> None:
        for space, k, v in records:
            new = self._moved(k, src, dst)
            if space == DATA:
                # A file moved with its folder keeps its meaning; only a file moved alone can
                # change what it is (a temporary file becoming a chunk).
                v = self.hooks.arrive(t, new, v, k if k == src else "")
            t.put(new, v, space)
            if space == DATA:
                self._changed(t, new, v)

    def rename(self, src: str, dst: str, flags: int = 0) -> None:
        """Move a file or a whole folder atomically, replacing an existing target atomically;
        honours RENAME_NOREPLACE and RENAME_EXCHANGE."""
        if src == dst:
            return
        if not src or not dst:
            raise FsError(errno.EBUSY, "the root folder")
        if dst.startswith(src + "/") or (flags & RENAME_EXCHANGE and src.startswith(dst + "/")):
            raise FsError(errno.EINVAL, f"cannot move {src} into itself")

        def run(t: Txn) -> None:
            s, d, parent = self._probe_many(t, [src, dst, dst.rpartition("/")[0]])
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if flags & RENAME_EXCHANGE:
                if d is None:
                    raise FsError(errno.ENOENT, dst, quiet=True)
                a, b = self._subtree(t, src), self._subtree(t, dst)
                self._remove(t, a)
                self._remove(t, b)
                self._place(t, a, src, dst)
                self._place(t, b, dst, src)
                return
            if d is not None:
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST, dst)
                if s[0] == DIR and d[0] != DIR:
                    raise FsError(errno.ENOTDIR, dst)
                if s[0] != DIR and d[0] == DIR:
                    raise FsError(errno.EISDIR, dst)
                if d[0] == DIR and self._has_children(t, dst):
                    raise FsError(errno.ENOTEMPTY, dst)
                self._remove(t, self._subtree(t, dst))
            else:
                self._folder_check(parent, dst)
                self.hooks.check_name(t, dst, s[0])
            records = self._subtree(t, src)
            self._remove(t, records)
            self._place(t, records, src, dst)
            self._keep_parent(t, src)

        self._write(run)

    def link(self, src: str, dst: str) -> None:
        """``link(src, dst)``: a new file ``dst`` with the content of ``src``; EEXIST, atomically,
        when ``dst`` exists (zarr-python 3 creates metadata this way). A key/value store has no
        hard links, so this is a copy that is taken in one transaction."""

        def run(t: Txn) -> None:
            s, d, parent = self._probe_many(t, [src, dst, dst.rpartition("/")[0]])
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if s[0] == DIR:
                raise FsError(errno.EPERM, f"{src} is a folder")
            if d is not None:
                raise FsError(errno.EEXIST, dst)
            self._folder_check(parent, dst)
            self.hooks.check_name(t, dst, s[0])
            records = [r for r in self._subtree(t, src) if r[1] in (src, entry_key(src), attr_key(src))]
            self._place(t, records, src, dst)

        self._write(run)

    # ------------------------------------------------------------------ filesystem
    def statfs(self) -> dict[str, int]:
        """Block and inode counts for ``statvfs``: the real free space behind the database."""
        info = self.driver.statfs() or {"total": 1 << 40, "free": 1 << 40}
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
            "f_namemax": 255,
        }

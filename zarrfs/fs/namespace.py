"""The namespace: every change to the tree of files and folders over a driver, and
:class:`Tree`, the filesystem over one driver.

A path is a key (``/grp/arr/0.0`` is ``grp/arr/0.0``); folders derive from key prefixes and
side markers (:mod:`zarrfs.fs.lookups`). A :class:`Tree` is three parts: lookups
(:class:`zarrfs.fs.lookups.Lookups`), listings (:class:`zarrfs.fs.listing.Listings`) and the
writes here (commit, unlink, rmdir, set_attrs, rename, link), with :class:`Hooks`, where the
format layer plugs in; extended attributes are :mod:`zarrfs.fs.xattrs`'s. Making side entries
(folders, symlinks, special files), the owner of a new node and the times of a folder a name
is added to or removed from are in :mod:`zarrfs.fs.entries`; hard links in :mod:`~.hardlinks`.

Everything here is one driver transaction per call; nothing here knows about FUSE, so it imports
and tests without a mount. POSIX conditions are raised as :class:`zarrfs.fs.errors.FsError`.
"""

from __future__ import annotations

import errno
import stat
import time
from typing import Any

from zarrfs.backends.base import DATA, SIDE, VALUES, Driver, StalledError, Txn
from zarrfs.fs import hardlinks, parts, records
from zarrfs.fs.entries import Entries
from zarrfs.fs.errors import FsError
from zarrfs.fs.hardlinks import POINTER, LinkGroups, pointer_key
from zarrfs.fs.listing import FOLDER_BATCH, Listings
from zarrfs.fs.lookups import DIR, FILE, LINK, Lookups, Node, stamp_of
from zarrfs.fs.sidedata import ENTRY, EPOCH, XATTR, Attrs, attr_key, entry_key, xattr_key
from zarrfs.fs.xattrs import Xattrs

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
    "check_rename_flags",
]

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def check_rename_flags(src: str, flags: int) -> None:
    """EINVAL for rename flags not done here: RENAME_WHITEOUT (which overlayfs asks of its
    upper layer), any later flag, and NOREPLACE with EXCHANGE."""
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == RENAME_NOREPLACE | RENAME_EXCHANGE:
        raise FsError(errno.EINVAL, f"rename of {src} with flags {flags:#x}")


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

    def __init__(self, txn: Txn, into: set[str], defaults: Any) -> None:
        self._txn = txn
        self._into = into
        self._defaults = defaults  # the attributes of a file without a record

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        self._txn.put(key, value, space)
        if space == DATA:
            self._into.add(key)
            # A document rewritten on the side is a changed file: its mtime moves (tools that
            # sync by mtime, the kernel's page-cache stamp), its owner and mode stay.
            raw = self._txn.get(attr_key(key), SIDE)
            attrs = (Attrs.unpack(raw) if raw is not None else None) or self._defaults(FILE)
            attrs.mtime = attrs.ctime = time.time_ns()
            self._txn.put(attr_key(key), attrs.pack(), SIDE)

    def delete(self, key: str, space: str = DATA) -> None:
        if space == DATA:
            self._into.add(key)
        self._txn.delete(key, space)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class Tree(Entries, Listings, Lookups, LinkGroups, Xattrs):
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
        #: Chunks read ahead of a reader in grid order (a Readahead), or None.
        self.readahead: Any = None
        self._side_effects: set[str] = set()
        self._garbage: list = []  # parts a write leaves unused (see zarrfs.fs.parts)
        self._hidden_logged: set[str] = set()
        self._size_hints: dict[str, int] = {}  # key -> size last seen (Lookups.version)
        self.epoch = self._load_epoch()
        # The longest key the database holds, if it has a limit, less the side prefix ("a:")
        # of a node's attributes: a longer path is refused with ENAMETOOLONG before it is made.
        limit = getattr(driver, "max_key_size", None)
        self.key_limit: int | None = limit - len(ENTRY) if limit else None

    def _load_epoch(self) -> int:
        """The time of nodes without attributes, fixed at the first mount (see sidedata)."""
        raw = self.driver.get(EPOCH, SIDE)
        if raw is not None:
            return int(raw)
        now = time.time_ns()
        if not self.driver.readonly:
            try:
                self.driver.put(EPOCH, str(now).encode(), SIDE)
            except StalledError:  # another program holds the write lock: the next mount records it
                pass
        return now

    # ------------------------------------------------------------------ writes
    def _write(self, run: Any) -> Any:
        """Run a write transaction; then report keys the hooks changed on the side, and delete
        the parts it left unused (each part in its own transaction: zarrfs.fs.parts)."""
        self._side_effects = touched = set()

        def attempt(t: Txn) -> Any:
            self._garbage = []
            return run(t)

        try:
            result = self.driver.transact(attempt)
        finally:
            if self.folder_cache is not None:
                self.folder_cache.clear()
            if self.readahead is not None:
                self.readahead.forget()
        garbage, self._garbage = self._garbage, []
        parts.free(self.driver, {p.id: p for p in garbage if p is not None}.values())
        if touched and self.on_side_effects is not None:
            self.on_side_effects(sorted(touched))
        return result

    def _changed(self, t: Txn, key: str, value: Any) -> None:
        self.hooks.changed(_Recording(t, self._side_effects, self.default_attrs), key, value)

    def _now(self) -> int:
        return time.time_ns()

    def commit(
        self,
        key: str,
        value: Any,
        attrs: Attrs | None,
        create: bool = False,
        exclusive: bool = False,
        replace: bool = False,
        linked: bool = False,
        added: int | None = None,
        renamed_from: str | None = None,
        parted: Any = None,
        base: tuple[int, int] | None = None,
        lay: Any = None,
    ) -> None:
        """Store the content of a file written through the mount, with its attributes, in one
        transaction; the format layer may refuse it (nothing is stored then).

        ``create``: the file may be new here (its folder must exist, a folder or symlink in the
        way is an error; a new file replaces a name of a linked file: that name leaves the
        group); ``exclusive``: it must be new (EEXIST otherwise), as for ``link`` or
        ``RENAME_NOREPLACE``; ``replace``: a symlink in the way is replaced, as a rename does.
        ``linked``: the file had hard links when it was opened; the content is then stored
        under every name its group has now (their folders do not change: no name is added).
        ``added``: when the file was made; if it turns out new, its folder's times change (see
        :meth:`_folder_changed`). ``renamed_from``: the file was an unstored file of that name,
        renamed here: both folders' times change. ``parted``: ``value`` is the manifest of
        these parts (:mod:`zarrfs.fs.parts`); the parts of the version replaced are freed.
        ``lay``: when the stored file is no longer the version ``base`` (its stamp) that
        ``value`` was made from, ``lay(newest)`` makes the value to store from the newest
        content, read in this transaction (changes laid on it: :mod:`zarrfs.fs.extents`)."""

        # Remote: what the format layer will read comes in the probe's round trip.
        also = self.hooks.reads(key) if (create or exclusive) and self.driver.remote else ()
        hint = attrs.parted if attrs is not None else None  # the version this one replaces
        record = None if attrs is None else Attrs(**{**vars(attrs), "parted": parted}).pack()

        def run(t: Txn) -> None:
            pointer = folder = found = None
            if parted is not None:
                parts.check_present(t, key, parted)
            if create or exclusive:
                folder, found = self._probe_with_folder(t, key, also)
                if found is not None and replace and not exclusive and found[0] not in (FILE, DIR):
                    self._unlinked(t, key, found)
                    t.delete(entry_key(key), SIDE)  # the symlink the rename replaces
                    found = None
                if found is not None and (exclusive or found[0] != FILE):
                    raise FsError(errno.EISDIR if found[0] == DIR else errno.EEXIST, key)
                if found is None:
                    self.hooks.check_name(t, key, FILE)
                    # A pointer left by a writer that deleted the key must not link the new file.
                    t.delete(pointer_key(key), SIDE)
                else:
                    pointer = found[4]
            elif linked:
                pointer = t.get(pointer_key(key), SIDE)
            stored_value = value
            if lay is not None and base is not None:
                node = self._find(t, key)
                if node is not None and node.kind == FILE and stamp_of(node) != base:
                    stored_value = lay(parts.whole(t, key, t.get(key)) or b"")
            names = [key]
            if create or exclusive:
                # A new file in its place: that name is not linked; its parts go with its last name.
                if found is not None and (pointer is None or not self._unlinked(t, key, found)):
                    self._garbage.append(parts.parted_of(found[3]))
            else:
                names = records.names_of(t, key, pointer)
                if hint is not None:
                    self._garbage.append(parts.parted_of(t.get(attr_key(key), SIDE)))
            for name, stored in records.write_file(t, names, stored_value, record, self.hooks.store):
                self._changed(t, name, stored)
            self._garbage = parts.released(self._garbage, parted)
            if folder is not None:
                self._commit_folders(t, key, folder, found, added, renamed_from)

        self._write(run)
        if attrs is not None:
            attrs.parted = parted

    def unlink(self, key: str) -> list[str]:
        """Remove the file or symlink at ``key`` (EISDIR for a folder). Returns the other
        names of the file, when it had hard links."""

        where = key.rpartition("/")[0]

        def run(t: Txn, keep: bool = True) -> list[str]:
            found, folder = self._probe_many(t, [key, where])
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] == DIR:
                raise FsError(errno.EISDIR, key)
            if found[0] == FILE:
                t.delete(key)
                self._changed(t, key, None)
            else:
                t.delete(entry_key(key), SIDE)
            left = self._unlinked(t, key, found)
            if found[0] == FILE and not left:
                self._garbage.append(parts.parted_of(found[3]))
            t.delete(attr_key(key), SIDE)
            t.delete(xattr_key(key), SIDE)
            if keep:  # writes a full store may refuse (see _removing)
                self._keep_parent(t, key)
                self._folder_changed(t, where, folder[3] if folder else None, self._now())
            return left

        return self._removing(run)

    def rmdir(self, key: str) -> None:
        """Remove the empty folder at ``key`` (ENOTEMPTY, ENOTDIR, ENOENT as POSIX says)."""

        if not key:
            raise FsError(errno.EBUSY, "the root folder")
        where = key.rpartition("/")[0]

        def run(t: Txn, keep: bool = True) -> None:
            found, folder = self._probe_many(t, [key, where])
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] != DIR:
                raise FsError(errno.ENOTDIR, key)
            if self._has_children(t, key):
                raise FsError(errno.ENOTEMPTY, key, quiet=True)
            for side_key in (entry_key(key), attr_key(key), xattr_key(key)):
                t.delete(side_key, SIDE)
            if keep:  # writes a full store may refuse (see _removing)
                self._keep_parent(t, key)
                self._folder_changed(t, where, folder[3] if folder else None, self._now())

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
            group = hardlinks.load(t, key, found[4]) if found[0] != DIR else None
            # The names of a linked node share their attributes: each has the same record.
            hardlinks.put_attrs(t, group.names if group is not None else [key], attrs.pack())

        self._write(run)

    # ------------------------------------------------------------------ rename / link
    def _subtree(self, t: Txn, key: str, found: Any) -> list[tuple[str, str, bytes]]:
        """Every record of the node at ``key`` and below: (space, key, value); ``found`` is
        what the probe found at ``key`` (a file's link-group pointer comes with it)."""
        records: list[tuple[str, str, bytes]] = []
        value = t.get(key)
        if value is not None:
            records.append((DATA, key, value))
        records.extend((DATA, k, v) for k, v in t.scan_prefix(key + "/", fetch=VALUES))
        for side_prefix in (ENTRY, "a:", XATTR):
            raw = t.get(side_prefix + key, SIDE)
            if raw is not None:
                records.append((SIDE, side_prefix + key, raw))
            records.extend(
                (SIDE, k, v) for k, v in t.scan_prefix(side_prefix + key + "/", space=SIDE, fetch=VALUES)
            )
        if found[0] == DIR:  # the link-group pointers of the files below
            records.extend(
                (SIDE, k, v) for k, v in t.scan_prefix(POINTER + key + "/", space=SIDE, fetch=VALUES)
            )
        elif found[4] is not None:
            records.append((SIDE, pointer_key(key), found[4]))
        return records

    @staticmethod
    def _moved(record_key: str, src: str, dst: str) -> str:
        for side_prefix in (ENTRY, "a:", XATTR, POINTER):
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

        self.check_length(dst)
        here, there = src.rpartition("/")[0], dst.rpartition("/")[0]

        def run(t: Txn) -> bool:
            s, d, parent, source = self._probe_many(t, [src, dst, there, here])
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if self._same_file(t, src, dst, s, d):
                return False
            now = self._now()
            if flags & RENAME_EXCHANGE:
                if d is None:
                    raise FsError(errno.ENOENT, dst, quiet=True)
                a, b = self._subtree(t, src, s), self._subtree(t, dst, d)
                self._remove(t, a)
                self._remove(t, b)
                self._place(t, a, src, dst)
                self._place(t, b, dst, src)
                self._regroup(t, [(a, src, dst, s), (b, dst, src, d)])
                self._folders_changed(t, (here, source), (there, parent), now)
                return True
            if d is not None:
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST, dst)
                if s[0] == DIR and d[0] != DIR:
                    raise FsError(errno.ENOTDIR, dst)
                if s[0] != DIR and d[0] == DIR:
                    raise FsError(errno.EISDIR, dst)
                if d[0] == DIR and self._has_children(t, dst):
                    raise FsError(errno.ENOTEMPTY, dst)
                if d[0] != DIR and not self._unlinked(t, dst, d) and d[0] == FILE:
                    self._garbage.append(parts.parted_of(d[3]))
                self._remove(t, self._subtree(t, dst, d))
            else:
                self._folder_check(parent, dst)
                self.hooks.check_name(t, dst, s[0])
            records = self._subtree(t, src, s)
            self._remove(t, records)
            self._place(t, records, src, dst)
            moved = (Attrs.unpack(s[3]) if s[3] is not None else None) or self.default_attrs(s[0])
            moved.ctime = now  # as Linux's filesystems do: the node changed
            t.put(attr_key(dst), moved.with_type(s[0]).pack(), SIDE)
            self._regroup(t, [(records, src, dst, s)])
            self._keep_parent(t, src)
            self._folders_changed(t, (here, source), (there, parent), now)
            return True

        return self._write(run)

    def link(self, src: str, dst: str) -> None:
        """``link(src, dst)``: a hard link, a new name ``dst`` of the file ``src``, in one
        transaction; EEXIST, atomically, when ``dst`` exists (zarr-python 3 creates metadata
        this way). The value is stored under the new name too (every name is a Zarr key), and
        the link group of :mod:`zarrfs.fs.hardlinks` makes the names one file. A symlink or
        special file gets an entry record under the new name, in the same link group. The new
        name's folder changes and so does the file (its ctime, on every name)."""

        self.check_length(dst)

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
            if s[0] != FILE:  # a symlink or special file: the new name's own entry record
                records = [r for r in self._subtree(t, src, s) if r[1] in (entry_key(src), attr_key(src))]
                self._place(t, records, src, dst)
            else:
                value = self.hooks.arrive(t, dst, t.get(src), src)
                t.put(dst, value)
                self._changed(t, dst, value)
            if (xattrs := t.get(xattr_key(src), SIDE)) is not None:  # the file's, on each name
                t.put(xattr_key(dst), xattrs, SIDE)
            group = hardlinks.join(t, hardlinks.load(t, src, s[4]), src, dst)
            self._touch_group(group.names, s[3], t, s[0])
            self._folder_changed(t, dst.rpartition("/")[0], parent[3], self._now())

        self._write(run)

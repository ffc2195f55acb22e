"""The filesystem calls, by store key: each method says what one call means for the tree and
the open-file table.

:mod:`zarrfs.fuse.session` turns kernel requests into these calls (node IDs into keys) and their
results into replies; an exception raised here becomes the caller's errno there, through
:func:`to_errno`. Nothing here knows about FUSE.

This module is the one door of the filesystem for the protocol layer: what
:mod:`zarrfs.fuse` needs of :mod:`zarrfs.fs` (nodes and their kinds, rename flags, what a
commit stored, the errno mapping, the page cache policy) is re-exported here, so that the
modules behind it can be rearranged without touching the protocol.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator

from zarrfs.fs.errors import FsError, is_quiet, to_errno
from zarrfs.fs.handles import HandleTable, Stored
from zarrfs.fs.listing import DirListing
from zarrfs.fs.namespace import DIR, FILE, LINK, RENAME_EXCHANGE, RENAME_NOREPLACE, Node, Tree
from zarrfs.fs.pagecache import PageCache, Pages

NOW = "now"  # a time to set to the present (UTIME_NOW)


class Operations:
    """Filesystem calls over a :class:`Tree` and its :class:`HandleTable`."""

    def __init__(self, tree: Tree, handles: HandleTable) -> None:
        self.tree = tree
        self.handles = handles
        self.dirs: dict[int, DirListing] = {}
        self._next_dir = 1

    def on_keys_changed(self, callback: Callable[[list[str]], None] | None) -> None:
        """Have ``callback(keys)`` called when a call changed keys other than the ones it
        named (a consolidated document the format layer rewrote after a metadata write), before
        that call returns; the caller drops what it caches of them. One callback: a later one
        replaces it, None removes it."""
        self.tree.on_side_effects = callback

    def destroy(self) -> None:
        """The end of the mount: store open files, close the database."""
        self.handles.commit_all()
        self.tree.driver.close()

    # ------------------------------------------------------------------ attributes
    def find(self, key: str) -> Node | None:
        """The node at ``key``, pending writes included, or None (the hot path of every
        lookup)."""
        return self.handles.pending(key) or self.tree.find(key)

    def find_open(self, fh: int) -> Node | None:
        """The node an open file shows, by handle (its name may be gone)."""
        return self.handles.open_node(fh)

    def statfs(self) -> dict[str, int]:
        """``statvfs`` figures of the storage behind the mount."""
        return self.tree.statfs()

    def set_attrs(self, key: str, **changes: int | str | None) -> None:
        """Change mode, owner or times (``None`` leaves one as it is, :data:`NOW` is now)."""
        now = time.time_ns()
        for name in ("atime", "mtime"):
            if changes.get(name) == NOW:
                changes[name] = now
        if not self.handles.set_attrs(key, **changes):
            self.tree.set_attrs(key, **changes)

    def truncate(self, key: str, length: int, fh: int | None = None) -> None:
        """Cut or extend a file, open (``fh``) or not."""
        self.handles.truncate(key, length, fh)

    # ------------------------------------------------------------------ folders
    def opendir(self, key: str) -> int:
        """Open a folder for listing."""
        if self.tree.lookup(key).kind != DIR:
            raise FsError(errno.ENOTDIR, key)
        fh = self._next_dir
        self._next_dir += 1
        self.dirs[fh] = DirListing(self.tree, key, extra=self.handles.unstored_names(key))
        return fh

    def readdir(self, fh: int, offset: int) -> Iterator[tuple[str, int, int]]:
        """``(name, kind, offset)`` of the entries after ``offset``, produced as they are
        taken (a reply holds what fits)."""
        listing = self.dirs.get(fh)
        if listing is None:
            raise FsError(errno.EBADF, str(fh))
        return listing.entries(offset)

    def releasedir(self, fh: int) -> None:
        """Close a folder."""
        self.dirs.pop(fh, None)

    def mkdir(self, key: str, mode: int) -> None:
        """Make a folder (kept while empty)."""
        self.tree.mkdir(key, mode)

    def rmdir(self, key: str) -> None:
        """Remove an empty folder."""
        self.tree.rmdir(key)

    # ------------------------------------------------------------------ names
    def unlink(self, key: str) -> None:
        """Remove a file or symlink (open descriptors keep what they hold)."""
        if not self.handles.unlinked(key):
            self.tree.unlink(key)

    def rename(self, src: str, dst: str, flags: int = 0) -> Stored | None:
        """Move a file or folder, atomically, honouring RENAME_NOREPLACE / RENAME_EXCHANGE.
        A held temporary file is stored by its rename: then what was stored is returned."""
        if self.handles.unstored(src) is not None and not flags & RENAME_EXCHANGE:
            return self.handles.store_as(
                src, dst, exclusive=bool(flags & RENAME_NOREPLACE), keep_source=False
            )
        self.handles.settle(src)
        if flags & RENAME_EXCHANGE:
            self.handles.settle(dst)
        self.tree.rename(src, dst, flags)
        self.handles.renamed(src, dst, exchange=bool(flags & RENAME_EXCHANGE))
        return None

    def link(self, src: str, dst: str) -> None:
        """A second name for a file (a copy in a key/value store); EEXIST when ``dst`` exists."""
        if self.handles.unstored(src) is not None:
            self.handles.store_as(src, dst, exclusive=True, keep_source=True)
            return
        self.handles.settle(src)
        self.tree.link(src, dst)

    def symlink(self, target: str, key: str, uid: int, gid: int) -> None:
        """Make a symlink at ``key`` pointing to ``target``."""
        self.tree.symlink(target, key, uid, gid)

    def readlink(self, key: str) -> str:
        """The target of a symlink."""
        return self.tree.readlink(key)

    # ------------------------------------------------------------------ files
    def create(self, key: str, mode: int, flags: int, uid: int, gid: int) -> int:
        """Create and open a file; stored at its first commit."""
        return self.handles.create(key, mode | stat.S_IFREG, flags, uid, gid)

    def open(self, key: str, flags: int = os.O_RDONLY, kept: tuple[int, int] | None = None) -> int:
        """Open a file; ``kept`` is the (size, mtime) of the version whose pages the kernel
        holds, if any (see :meth:`HandleTable.open`)."""
        return self.handles.open(key, flags, kept)

    def opened(self, fh: int) -> tuple[Node | None, bool]:
        """The file as its open found it in the database (None: pending content of this
        mount), and whether the descriptor must bypass the kernel's page cache."""
        return self.handles.opened(fh)

    def read(self, fh: int, size: int, offset: int) -> bytes | memoryview:
        """Bytes of an open file."""
        return self.handles.read(fh, size, offset)

    def write(self, fh: int, data: bytes | memoryview, offset: int) -> int:
        """Buffer a write (``data`` is copied)."""
        return self.handles.write(fh, data, offset)

    # flush, fsync and release return what they stored (Stored), if anything.
    def flush(self, fh: int) -> Stored | None:
        """A ``close``: commit the file's pending content."""
        return self.handles.flush(fh)

    def fsync(self, fh: int) -> Stored | None:
        """Commit and make durable."""
        return self.handles.fsync(fh)

    def release(self, fh: int) -> Stored | None:
        """The last close of an open file."""
        return self.handles.release(fh)


__all__ = [
    "DIR",
    "FILE",
    "LINK",
    "NOW",
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "FsError",
    "Node",
    "Operations",
    "PageCache",
    "Pages",
    "Stored",
    "is_quiet",
    "to_errno",
]

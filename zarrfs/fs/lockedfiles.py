"""Open files and locks (NFS's lock consistency): a file a granted lock marked
(:meth:`zarrfs.fs.handles.HandleTable.lock_granted`) is brought up to date; and reading a
file's newest stored version into a buffer.

:class:`LockedFiles` does it for :class:`zarrfs.fs.handles.HandleTable`, over its table of
open files.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from zarrfs.fs import parts
from zarrfs.fs.errors import FsError
from zarrfs.fs.node import FILE, Node, stamp_of
from zarrfs.fs.openfiles import FileState, OpenFiles
from zarrfs.fs.opennames import SNAPSHOT_LIMIT
from zarrfs.fs.pagecache import Stored
from zarrfs.fs.spill import SpillBuffer
from zarrfs.fs.tree import Tree


class LockedFiles:
    """Locks and the newest version: ``files`` is the table of open files, ``tree`` the
    filesystem, ``parting`` how parted files are read, ``spill_threshold`` the size past which
    a buffer goes to disk, ``commit(state)`` stores a file's pending content."""

    def __init__(
        self,
        files: OpenFiles,
        tree: Tree,
        parting: parts.Parting,
        spill_threshold: int,
        commit: Callable[[FileState], Stored | None],
    ) -> None:
        self.files = files
        self.states = files.states
        self.handles = files.handles
        self.tree = tree
        self.parting = parting
        self.spill_threshold = spill_threshold
        self.commit = commit

    def newest(self, key: str) -> tuple[SpillBuffer, tuple[int, int] | None, Node | None]:
        """A buffer holding the newest stored version of ``key``, that version's stamp (None
        for a file read in pieces, or gone: a commit then stores the buffer as it is), and the
        node read with it (None when none is there)."""
        node, value = self.tree.version(key, SNAPSHOT_LIMIT)
        try:
            if value is not None:
                return SpillBuffer(value.data, self.spill_threshold), stamp_of(node), node
        finally:
            if value is not None:
                value.release()
        if node is not None and node.kind == FILE and self._large(key):
            return self._load_in_pieces(key), None, node
        return SpillBuffer(self._load(key), self.spill_threshold), None, node

    def _large(self, key: str) -> bool:
        """Whether the stored value at ``key`` is read into a buffer in pieces: it would spill,
        and what is shown is what is stored (no view that decodes it)."""
        return not self.tree.hooks_transform and self.tree.stored_size(key) > self.spill_threshold

    def _load_in_pieces(self, key: str) -> SpillBuffer:
        """A buffer holding the value at ``key``, read by ranges in one read transaction (one
        version of it) into the buffer's file: a large file opened for writing is not held
        in memory."""
        buffer = SpillBuffer(threshold=self.spill_threshold, on_disk=True)  # it will spill
        try:
            self.tree.driver.transact(
                lambda t: self.parting.lazy(t, key, buffer) or buffer.load(parts.reader(t, key)), write=False
            )
        except BaseException:
            buffer.close()
            raise
        return buffer

    def _load(self, key: str) -> bytes:
        try:
            return self.tree.read_value(key)
        except FsError as exc:
            if exc.errno == errno.ENOENT:  # removed behind our back: writing recreates it
                return b""
            raise

    def fresh(self, state: FileState) -> FileState:
        """Bring a file marked by a granted lock up to date: its descriptors read, and write
        onto, the newest stored version, with this mount's pending changes laid on it."""
        if not state.stale:
            return state
        state = self._join(state)
        state.stale = False
        self.tree.listings.told(None)
        if self.tree.folder_cache is not None:  # lookups answer from the database from now
            self.tree.folder_cache.clear()
        if self.tree.known is not None:
            self.tree.known.clear()
        if state.created or state.orphan:
            return state  # only here: nobody else can have changed it
        if state.buffer is None:
            state.snapshot = None
            seen, value = self.tree.version(state.key, SNAPSHOT_LIMIT)
            state.version = stamp_of(seen) if seen is not None and seen.kind == FILE else None
            state.snapshot = value
            return state
        if state.dirty and state.base is None:
            return state  # nothing to lay its changes on: they stand as they are
        if not state.dirty or state.changes.whole:
            if state.dirty:
                return state  # the file is this mount's alone: nothing of others to read
            buffer, base, _ = self.newest(state.key)
        else:
            node, value = self.tree.version(state.key, SNAPSHOT_LIMIT)
            try:
                if node is None or node.kind != FILE or stamp_of(node) == state.base or value is None:
                    return state
                out, appended = state.changes.lay(value.data, state.buffer.size, state.buffer.read)
            finally:
                if value is not None:
                    value.release()
            buffer, base = SpillBuffer(out, self.spill_threshold), stamp_of(node)
            state.changes.moved_appends(appended)
        state.buffer.close()
        state.buffer, state.base = buffer, base
        if not state.dirty:
            state.changes.clear()
            state.attrs = self.tree.lookup_attrs(state.key)
        state.stored = None
        return state

    def _join(self, state: FileState) -> FileState:
        """One state again for a file whose descriptors of two versions are open here (a newer
        version opened while descriptors of an older one read it): a lock brings them all to
        the newest, so they share pending writes and what a lookup shows, as POSIX has it.
        An older version's state whose newer one closed meanwhile becomes the file's again:
        else its changes would be kept apart from what the mount shows of the file (a
        truncate's size never shown)."""
        current = self.states.get(state.key)
        if current is None and not state.orphan and not state.linked:
            self.states[state.key] = state
            if self.files.paged.get(state.key) is state:
                del self.files.paged[state.key]
            return state
        if current is None or current is state or state.orphan or state.linked or current.linked:
            return state
        keep, drop = (current, state) if current.dirty and not state.dirty else (state, current)
        if drop.dirty:
            self.commit(drop)
        for fh in drop.handles:
            self.handles[fh].state = keep
            keep.handles.add(fh)
        drop.handles.clear()
        self.files.forget(drop)
        self.states[keep.key] = keep
        keep.private = False  # the kernel's pages of the file were dropped with the lock
        keep.stale = True
        return keep

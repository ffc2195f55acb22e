"""Open files: buffered writes committed all-or-nothing, and stable reads.

Every handle points at the shared :class:`FileState` of its key (of each name of a linked file),
so two descriptors of one file see each other's writes, as POSIX requires. Writes go to a
:class:`SpillBuffer`; a writer's ``close`` (``flush``, ``release``) and ``fsync`` commit the file
under every name in one transaction, and a read-only descriptor never commits, so no reader sees
half a value. A file made with ``create`` exists only here until its first commit, so create +
write + close is one transaction. A commit lays this mount's changes
(:class:`zarrfs.fs.extents.Extents`) on the newest stored version, read in its transaction, so
another mount's commit is kept outside the ranges written here. Locks bring files up to date,
as NFS's do: a granted lock marks the file
(:meth:`HandleTable.lock_granted`): the next call that touches it first lays its changes on the
newest version (:meth:`LockedFiles.fresh`), and :meth:`HandleTable.commit_key` commits it before
a release. Temporary files (``*.partial``, ``*.__lock``) are held until renamed or linked, then
stored once at the destination; ``fsync`` and unmounting store them: a crash loses only those.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import replace
from typing import Any

from zarrfs.fs import parts
from zarrfs.fs.commitoptions import CommitOptions
from zarrfs.fs.entries import inherit_group, without_setid
from zarrfs.fs.errors import FsError, to_errno
from zarrfs.fs.lockedfiles import LockedFiles
from zarrfs.fs.node import stamp_of
from zarrfs.fs.openfiles import FileState, Handle, OpenFiles
from zarrfs.fs.opennames import SNAPSHOT_LIMIT
from zarrfs.fs.pagecache import Stored, last_page, whole_content
from zarrfs.fs.sidedata import Attrs
from zarrfs.fs.spill import DEFAULT_SPILL, SpillBuffer
from zarrfs.fs.tree import FILE, Node, Tree

log = logging.getLogger("zarrfs.fs.handles")

# Closed temporary files held for a rename; past this many bytes the oldest are stored.
_FALLOC_KEEP_SIZE, _FALLOC_PUNCH_HOLE, _FALLOC_ZERO_RANGE = 0x01, 0x02, 0x10
#: The ``fallocate`` modes done: grow, punch a hole (the kernel asks KEEP_SIZE with it),
#: zero a range (growing the file or not).
_FALLOCATE_MODES = frozenset(
    {0, _FALLOC_PUNCH_HOLE | _FALLOC_KEEP_SIZE, _FALLOC_ZERO_RANGE, _FALLOC_ZERO_RANGE | _FALLOC_KEEP_SIZE}
)
DEFERRED_LIMIT = 256 << 20
#: Bytes the files committed in one shared transaction hold at most (``flush_many``): a
#: server takes a transaction whole (Redis's query buffer is 1 GiB).
GROUP_BYTES = 64 << 20


def _by_bytes(group: list[tuple[int, FileState]]) -> list[list[tuple[int, FileState]]]:
    """``group`` in runs of at most :data:`GROUP_BYTES` (a larger file runs alone)."""
    runs: list[list[tuple[int, FileState]]] = []
    total = 0
    for item in group:
        size = item[1].size
        if not runs or total + size > GROUP_BYTES:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += size
    return runs


def is_deferrable(key: str) -> bool:
    """Whether a new file at ``key`` is a temporary file that is about to be renamed
    (zarr-python's ``*.partial``, tensorstore's ``*.__lock``)."""
    return key.endswith((".partial", ".__lock"))


class HandleTable:
    """All open files of a mount: the table of them (:attr:`files`; what namespace changes do
    to them is :class:`OpenNames`', over this table) and what locks do (:attr:`locking`,
    :class:`LockedFiles`); opens, reads, writes and commits here."""

    def __init__(
        self,
        tree: Tree,
        spill_threshold: int = DEFAULT_SPILL,
        readonly: bool = False,
        parts_above: int = parts.DEFAULT_ABOVE,
    ) -> None:
        self.tree = tree
        self.parting = parts.Parting(tree, parts_above)  # large files are stored in parts
        self.spill_threshold = spill_threshold
        self.readonly = readonly
        self.files = OpenFiles()
        self.states: dict[str, FileState] = self.files.states
        self.handles: dict[int, Handle] = self.files.handles
        self.deferred: dict[str, FileState] = self.files.deferred
        self.locking = LockedFiles(self.files, tree, self.parting, spill_threshold, self.commit)
        # The keys of files shown as an older version than the stored one (_as_read) whose
        # descriptors all closed since (take_outdated).
        self.outdated: list[str] = []
        #: Files created here whose last descriptor closed with nothing stored (their commit
        #: failed): the kernel's entry of each is to be dropped (:meth:`take_never_stored`).
        self.never_stored: list[str] = []
        self.paged: dict[str, FileState] = self.files.paged

    def pending(self, key: str) -> Node | None:
        """The node an open file shows, if it is not the stored one: its pending size and
        attributes, or the version its descriptors read (:meth:`_as_read`). With a newer
        version open past the kernel's page cache (:attr:`paged`), the older version's
        descriptors that read through it show theirs, their writes too: the kernel has one
        size a file, and a stored size would cut what they wrote."""
        state = self.states.get(key)
        if state is not None and state.stale:
            self.locking.fresh(state)
        if state is None or not (state.dirty or state.created):
            if self.paged and key in self.paged:  # a newer version is open past the page cache
                paged = self.paged[key]
                if paged.key == key and paged.handles:
                    state = paged
                else:  # closed, or renamed since
                    del self.paged[key]
        if state is None or not (state.dirty or state.created):
            # Descriptors reading the version they opened through the kernel's page cache.
            if state is not None and state.version is not None and state.handles:
                if state.buffer is None and not state.private:
                    return self._as_read(state)
            return None
        if state.linked and (stored := self.tree.find(key)) is not None:  # its names, as stored
            attrs = state.attrs or stored.attrs
            return Node(FILE, state.size, attrs, "", stored.nlink, stored.group, names=stored.names,
                        allocated=self._allocated(state))
        return self._shown(state)

    def _as_read(self, state: FileState) -> Node | None:
        """The stored file shown as the older version its descriptors read, while another
        mount's newer one is stored: the kernel has one size per file, and its page cache
        serves every descriptor of it, so a newer size over the older version's pages would
        cut or pad what they read. Descriptors opened meanwhile read the newer version past
        that cache (:attr:`FileState.private`); once the last of these closes, the key is
        in :attr:`outdated`, for the kernel to be shown the newer version."""
        stored = self.tree.find(state.key)
        if stored is None or stored.kind != FILE or stamp_of(stored) == state.version:
            return stored
        assert state.version is not None
        state.shown_older = True
        size, mtime = state.version
        return replace(stored, size=size, attrs=replace(stored.attrs, mtime=mtime), passing=True)

    def take_outdated(self) -> list[str]:
        """The keys shown as an older version (:meth:`_as_read`) whose last descriptor of that
        version closed since the last call: what the kernel holds of them is to be dropped."""
        return _taken(self.outdated)

    def take_never_stored(self) -> list[str]:
        """The keys of files created here that were never stored and whose last descriptor
        closed since the last call: the kernel still holds their names."""
        return _taken(self.never_stored)

    @staticmethod
    def _allocated(state: FileState) -> int | None:
        """The bytes of ``state``'s buffer that hold data, when it knows its holes (spilled to
        a file: an extension by ``ftruncate`` is a hole there), else None (count the size)."""
        ranges = None if state.buffer is None else state.buffer.data_ranges()
        return None if ranges is None else sum(end - start for start, end in ranges)

    def open_node(self, fh: int) -> Node | None:
        """The node an open file shows, found by its handle (its name may be gone)."""
        state = self.locking.fresh(self.files.handle(fh).state)
        if not state.orphan:
            return self.pending(state.key) or self.tree.find(state.key)
        return self._shown(state)

    def restamped(self, key: str, before: int, after: int) -> None:
        """This mount moved the stored mtime of ``key`` from ``before`` to ``after`` (a
        ``utime``), which is how versions are told apart: descriptors open on the version it
        changed hold its content still, so it stays theirs, and a later open shares their
        state (it took a private one, whose writes the file's stat did not show)."""
        state = self.states.get(key)
        if state is not None and state.version is not None and state.version[1] == before:
            state.version = (state.version[0], after)

    def _shown(self, state: FileState) -> Node:
        attrs = state.attrs or self.tree.default_attrs(FILE)
        # fstat after unlink: nlink 0. A file made here and not stored yet has the extended
        # attributes it was made with (none but an inherited ACL): the kernel's GETXATTR of
        # security.capability before its first write is then answered without a read.
        bare = state.created and state.xattrs is None
        nlink = 0 if state.orphan else 1
        return Node(FILE, state.size, attrs, nlink=nlink, no_xattrs=bare, allocated=self._allocated(state))

    # ------------------------------------------------------------------ open / create
    def open(self, key: str, flags: int, linked: bool | None = None) -> int:
        """Open an existing file; O_TRUNC empties it (stored at the next commit). ``linked``
        False: it has no other names.

        Unless this mount has pending content for it, the open reads the file's version from
        the database (not from a cache), and with it its content when it is at most
        :data:`SNAPSHOT_LIMIT` bytes: the descriptor reads that version until it is closed,
        whoever replaces the file meanwhile and whatever the kernel holds of it (see
        :meth:`read`)."""
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        if writable and self.readonly:
            raise FsError(errno.EROFS, key)
        # The kernel looked the name up just before, so there is no need to ask again.
        state = self.states.get(key) or self._state_of_names(key, linked)
        if state.stale:
            self.locking.fresh(state)
        # A held temporary file opened again is no longer only held: it is held again, or
        # stored, when its last descriptor closes.
        self.deferred.pop(key, None)
        seen = None
        truncating = writable and flags & os.O_TRUNC
        if not truncating and state.buffer is None and not state.created:
            seen, value = self.tree.version(key, SNAPSHOT_LIMIT)
            if seen is not None and seen.kind == FILE:
                self.tree.seen(key, seen)
                state.opened = seen
                version = stamp_of(seen)
                if state.version not in (None, version):
                    # Descriptors of an older version are open: they keep it, and the kernel's
                    # cache keeps its pages; this version is read outside that cache.
                    if not state.private:
                        self.paged[key] = state
                    state = FileState(key, private=True)
                elif state.version is None and self._paged_live(key):
                    # The newer versions' states all closed, an older one's descriptors still
                    # read through the page cache: this one is read outside it as well (else
                    # a later open would file it as the page cache's, over the older one).
                    state.private = True
                state.version = version
                if state.snapshot is None:
                    state.snapshot, value = value, None
            if value is not None:  # the descriptors read what they took earlier
                value.release()
        fh = self.files.add(state, flags)
        self.handles[fh].seen = seen
        if truncating:
            self._ensure_buffer(state, empty=True)
            self._touch(state)
        return fh

    def _paged_live(self, key: str) -> bool:
        """Whether descriptors of an older version of the file at ``key`` read through the
        kernel's page cache while newer ones were opened past it (:attr:`paged`): every other
        state of the file is then read past it."""
        older = self.paged.get(key) if self.paged else None
        return older is not None and older.key == key and bool(older.handles)

    def _state_of_names(self, key: str, linked: bool | None) -> FileState:
        """The state of ``key``, not open under that name: another name's (hard links), or new."""
        names = self.tree.link_names(key) if linked is not False else []
        state = next((self.states[n] for n in names if n in self.states), None) or FileState(key)
        state.linked = bool(names)
        for name in names:
            self.states.setdefault(name, state)
        return state

    def create(self, key: str, mode: int, flags: int, uid: int, gid: int, xattrs: bytes | None = None) -> int:
        """Create a new file, visible through this mount at once and stored at its first commit,
        with the extended attributes record ``xattrs`` (ACLs from its folder's default ACL)."""
        if self.readonly:
            raise FsError(errno.EROFS, key)
        existing = self.states.get(key)
        if existing is not None and not existing.orphan:
            return self.open(key, flags | os.O_TRUNC)
        folder = self.tree.check_create(key)
        now = time.time_ns()
        attrs = Attrs(FILE | stat.S_IMODE(mode), uid, gid, now, now, now)
        inherit_group(attrs, folder)
        state = FileState(
            key,
            buffer=SpillBuffer(threshold=self.spill_threshold),
            attrs=attrs,
            dirty=True,
            created=True,
            born=now,
            xattrs=xattrs,
        )
        return self.files.add(state, flags)

    # ------------------------------------------------------------------ data
    def _ensure_buffer(self, state: FileState, empty: bool = False) -> SpillBuffer:
        """The buffer of ``state``, made from the version its descriptors read (``empty``: the
        file is emptied, so nothing is read)."""
        if state.buffer is None:
            if empty:
                state.buffer = SpillBuffer(b"", self.spill_threshold)
            elif state.snapshot is not None:
                state.buffer = SpillBuffer(state.snapshot, self.spill_threshold)
                state.base = state.version
            else:
                state.buffer, state.base, read = self.locking.newest(state.key)
                if read is not None and read.kind == FILE:
                    state.opened = read  # read now, with its attributes
                    if state.attrs is None:
                        state.attrs = read.attrs.with_type(FILE)
            state.snapshot = None
            if self.tree.hooks_transform:
                state.base = None  # shown bytes are not stored bytes: nothing to lay them on
        if empty:
            self._truncated(state, 0)
        if state.attrs is None:
            # The open's, while the change feed tells of no change since (no read then);
            # otherwise read now: a chmod made since must not be undone by the commit.
            seen = state.opened
            if seen is not None and self.tree.unchanged_since(state.key, seen):
                state.attrs = seen.attrs.with_type(FILE)
            else:
                state.attrs = self.tree.lookup_attrs(state.key)
        return state.buffer

    def _truncated(self, state: FileState, length: int) -> None:
        buffer = state.buffer
        assert buffer is not None
        state.changes.truncated(length, buffer.size)
        buffer.truncate(length)

    def _touch(self, state: FileState) -> None:
        state.dirty = True
        state.stored = None
        now = time.time_ns()
        assert state.attrs is not None
        state.attrs.mtime = state.attrs.ctime = now

    def handles_of(self, key: str) -> set[int]:
        """The handles open on ``key``: the live set, which empties as they are released (the
        session keeps it to answer ``fstat`` of a file unlinked while open)."""
        state = self.states.get(key)
        return state.handles if state is not None else set()

    def is_reader(self, fh: int) -> bool:
        """Whether ``fh`` is open and was opened read-only (its close commits nothing)."""
        handle = self.handles.get(fh)
        return handle is not None and not handle.writable

    def may_share_commit(self, fh: int) -> bool:
        """Whether ``fh`` is open for writing on a file of one name (a file with hard links is
        one state under several nodes): its close may be served with others' (:meth:`flush_many`)."""
        handle = self.handles.get(fh)
        return handle is not None and handle.writable and not handle.state.linked

    def opened(self, fh: int) -> tuple[Node | None, bool]:
        """What an open found in the database (None when it had pending content here), and
        whether the descriptor must read outside the kernel's page cache (another version's
        descriptors are open)."""
        handle = self.files.handle(fh)
        return handle.seen, handle.state.private

    def read(self, fh: int, size: int, offset: int) -> bytes | memoryview:
        """Read from the pending content, or from the version the file had at its first open:
        a snapshot (taken at the open, or at the first read when the kernel held the pages
        then), or, for a value above :data:`SNAPSHOT_LIMIT`, ranges read each with a check of
        the version, which fails with ESTALE when the file was replaced since: a descriptor
        never reads parts of two versions. Returns a view where it can (no copy), valid until
        the file next changes."""
        state = self.locking.fresh(self.files.handle(fh).state)
        if state.buffer is not None:
            return state.buffer.read(offset, size)
        version = state.version
        if state.snapshot is None and version is not None:
            if not self.tree.hooks_transform and (offset > 0 or version[0] > SNAPSHOT_LIMIT):
                return self.tree.read_version(state.key, version, offset, size)
            state.snapshot = self.tree.read_version(state.key, version)
        if state.snapshot is None:
            # A read that does not start at the beginning reads just its range: the kernel
            # fetching the last, partial page of a file whose other pages it holds, or a
            # shard's index and chunks. One from the start takes the whole value once.
            if not self.tree.hooks_transform and (
                offset > 0 or self.tree.stored_size(state.key) > SNAPSHOT_LIMIT
            ):
                return self.tree.read_range(state.key, offset, size)
            state.snapshot = self.tree.read_value(state.key)
        return memoryview(state.snapshot)[offset : offset + size]

    def write(self, fh: int, data: bytes | memoryview, offset: int) -> int:
        """Buffer a write at ``offset`` (``data`` is copied: it may be the session's receive
        buffer)."""
        handle = self.files.handle(fh)
        if not handle.writable:
            raise FsError(errno.EBADF, handle.state.key)
        state = self.locking.fresh(handle.state)
        buffer = self._ensure_buffer(state)
        append = bool(handle.flags & os.O_APPEND)
        if append:
            offset = buffer.size
        buffer.write(offset, data)
        state.changes.wrote(offset, offset + len(data), append)
        self._touch(state)
        return len(data)

    def kill_suidgid(self, fh: int) -> bool:
        """Clear S_ISUID, and S_ISGID when the group may execute, of the file open as ``fh``,
        changed by a caller without CAP_FSETID (a write, or an open that truncated it). Kept
        in its pending record, so stored with its content at the next commit, one transaction;
        True when a bit was set."""
        state = self.locking.fresh(self.files.handle(fh).state)
        if state.attrs is None:
            state.attrs = self.tree.lookup_attrs(state.key)
        mode = without_setid(state.attrs.mode)
        if mode == state.attrs.mode:
            return False
        state.attrs.mode = mode
        state.attrs.ctime = time.time_ns()
        return True

    def fallocate(self, fh: int, offset: int, length: int, mode: int) -> None:
        """``fallocate``: mode 0 grows the file to ``offset + length`` (zeros);
        ``PUNCH_HOLE | KEEP_SIZE`` zeroes the range within the file, ``ZERO_RANGE`` zeroes it
        (and grows the file to its end unless ``KEEP_SIZE``); each is stored at the next
        commit like a write. A key/value store reserves no space: ``KEEP_SIZE`` alone, and
        any other mode, is EOPNOTSUPP."""
        handle = self.files.handle(fh)
        if mode not in _FALLOCATE_MODES:
            # Routine, not logged: programs ask for a mode to learn whether it is there (fsx,
            # rsync --preallocate), as they ask for POSIX ACLs.
            raise FsError(errno.EOPNOTSUPP, f"{handle.state.key}: fallocate mode {mode:#x}", quiet=True)
        if not handle.writable:
            raise FsError(errno.EBADF, handle.state.key)
        if offset < 0 or length <= 0:
            raise FsError(errno.EINVAL, f"{handle.state.key}: fallocate {offset}+{length}")
        state = self.locking.fresh(handle.state)
        buffer = self._ensure_buffer(state)
        if mode == 0:
            if buffer.size < offset + length:
                self._truncated(state, offset + length)
                self._touch(state)
            return
        end = offset + length if not mode & _FALLOC_KEEP_SIZE else min(offset + length, buffer.size)
        if end <= offset:
            return
        buffer.zero(offset, end)  # whole parts of a file stored in parts become holes
        state.changes.wrote(offset, end)
        self._touch(state)

    def seek(self, fh: int, offset: int, whence: int) -> int:
        """``lseek`` with SEEK_DATA or SEEK_HOLE: the next offset from ``offset`` in data or
        in a hole. Holes are the parts of a file stored in parts that are not stored (and
        holes of a buffer's temporary file); any other file is one extent of data. ENXIO
        from the end of the file on."""
        state = self.locking.fresh(self.files.handle(fh).state)
        if state.buffer is not None:
            size = state.buffer.size
            ranges = state.buffer.data_ranges()
        else:
            node = self.open_node(fh)
            size = node.size if node is not None else 0
            ranges = parts.data_ranges(self.tree.driver, state.key) if size else []
        if offset < 0 or offset >= size:
            raise FsError(errno.ENXIO, f"{state.key}: seek from {offset} of {size}", quiet=True)
        if ranges is None:
            ranges = [(0, size)]
        for start, end in ranges:
            if end <= offset:
                continue
            if whence == os.SEEK_DATA:
                return max(start, offset)
            if start > offset:
                return offset
            offset = end
        if whence == os.SEEK_DATA:
            raise FsError(errno.ENXIO, f"{state.key}: no data from {offset}", quiet=True)
        return min(offset, size)

    def truncate(self, key: str, length: int, fh: int | None = None) -> None:
        """Cut or extend a file; an unopened file is changed in its own transaction."""
        if self.readonly:
            raise FsError(errno.EROFS, key)
        state = self.files.handle(fh).state if fh is not None else self.states.get(key)
        if state is None:
            state = FileState(key)
            try:
                if length == 0:
                    state.linked = bool(self.tree.link_names(key))
                self._ensure_buffer(state, empty=length == 0)
                if length != 0:  # its names were read with it
                    state.linked = state.opened is not None and bool(state.opened.group)
                self._truncated(state, length)
                self._touch(state)
                self.commit(state)
            finally:
                state.buffer.close() if state.buffer else None
            return
        self._ensure_buffer(self.locking.fresh(state), empty=length == 0)
        self._truncated(state, length)
        self._touch(state)
        if fh is None:  # truncate(2) by name is a change of its own, as of a file not open
            self.commit(state)

    # ------------------------------------------------------------------ commit
    def commit(self, state: FileState) -> Stored | None:
        """Store a changed file; what was stored, or None when nothing was."""
        if not state.dirty or state.orphan:
            return None
        assert state.buffer is not None
        buffer = state.buffer
        laid: list[tuple[bytearray, int | None]] = []
        try:
            self.parting.store(state.key, buffer, state.attrs, self._commit_options(state, laid))
        except Exception:
            state.failed = True
            raise
        return self._committed(state, buffer, laid)

    def _commit_options(self, state: FileState, laid: list) -> CommitOptions:
        """How ``state`` is committed (``laid`` receives what a change laid on a newer version
        made)."""
        buffer = state.buffer
        lay = None
        if state.base is not None and not state.created and not state.changes.whole:

            def lay(newest: Any) -> bytearray:
                laid[:] = [state.changes.lay(newest, buffer.size, buffer.read)]
                return laid[0][0]

        return CommitOptions(
            create=state.created,
            linked=state.linked,
            added=state.born,
            base=state.base,
            lay=lay,
            xattrs=state.xattrs if state.created else None,
        )

    def _committed(self, state: FileState, buffer: Any, laid: list) -> Stored | None:
        """What a commit of ``state`` changes in it."""
        if laid:  # others' bytes are in what was stored: this mount reads that from now on
            state.buffer = SpillBuffer(laid[0][0], self.spill_threshold)
            buffer.close()
        state.changes.clear()
        state.dirty = False
        state.created = False
        state.failed = False
        if state.attrs is None:
            state.base = None
            return None
        state.base = None if self.tree.hooks_transform else (state.size, state.attrs.mtime)
        state.stored = Stored(state.size, state.attrs.mtime, others=bool(laid))
        return state.stored

    def _groupable(self, state: FileState) -> bool:
        """Whether ``state``'s commit may share a transaction with others' (a file of one
        name, stored whole or in one part: ``Parting.groupable``)."""
        buffer = state.buffer
        return buffer is not None and not state.linked and self.parting.groupable(state.key, buffer)

    def flush_many(self, fhs: list[int]) -> list[Stored | None | Exception]:
        """:meth:`flush` of several descriptors, of different files, at once: the commits of
        files stored whole in one transaction (:meth:`Tree.store`), the others one by
        one; each one's result or the exception its own flush would have raised. When the
        shared transaction is refused by a check, each file is committed alone, so each hears
        its own answer."""
        out: list[Stored | None | Exception] = [None] * len(fhs)
        group: list[tuple[int, FileState]] = []
        alone: list[int] = []
        taken: set[int] = set()
        for i, fh in enumerate(fhs):
            try:
                handle = self.files.handle(fh)
            except FsError as exc:
                out[i] = exc
                continue
            state = handle.state
            if not handle.writable or not state.dirty or state.orphan or id(state) in taken:
                alone.append(i)  # nothing to store, or stored with another descriptor's
            elif state.created and is_deferrable(state.key):
                continue  # held for its rename (see flush)
            elif state.created and state.size == 0:
                alone.append(i)  # a refusal of its emptiness waits for its release (see flush)
            elif self._groupable(state):
                group.append((i, state))
                taken.add(id(state))
            else:
                alone.append(i)
        for shared in _by_bytes(group):
            if len(shared) == 1:
                alone.append(shared[0][0])
                continue
            try:
                self._commit_group([state for _, state in shared])
            except FsError:
                alone += [i for i, _ in shared]  # each hears its own answer
            except Exception as exc:
                for i, state in shared:
                    state.failed = True
                    out[i] = exc
            else:
                for i, state in shared:
                    out[i] = state.stored
        alone.sort()
        for i in alone:
            if isinstance(out[i], Exception):
                continue
            try:
                out[i] = self.flush(fhs[i])
            except Exception as exc:
                out[i] = exc
        return out

    def _commit_group(self, states: list[FileState]) -> None:
        items = []
        laids: list[list] = []
        for state in states:
            laid: list[tuple[bytearray, int | None]] = []
            laids.append(laid)
            items.append((state.key, state.buffer, state.attrs, self._commit_options(state, laid)))
        self.parting.store_many(items)
        for state, laid in zip(states, laids, strict=True):
            self._committed(state, state.buffer, laid)

    def flush(self, fh: int) -> Stored | None:
        """Commit the file's pending content (called at every close); a new temporary file
        waits for its rename. Returns what was stored, if anything was."""
        handle = self.files.handle(fh)
        state = handle.state
        if not handle.writable:
            return None  # a reader's close publishes nothing, not even another's writes
        if state.created and is_deferrable(state.key):
            return None  # a temporary file waits for its rename
        if state.created and state.size == 0:
            # A new file still empty is stored now, so that its close hears a full store; but
            # a shell's ``> .zarray`` closes a duplicate descriptor before writing, and the
            # format's refusal of an empty document then waits for the file's release.
            try:
                return self.commit(state)
            except Exception as exc:
                if to_errno(exc) != errno.EINVAL:
                    raise
                state.failed = False
                return None
        return self.commit(state)

    def fsync(self, fh: int) -> Stored | None:
        """Commit (a temporary file too), then make it durable (any descriptor may ask)."""
        stored = self.commit(self.files.handle(fh).state)
        self.tree.driver.sync()
        return stored

    def release(self, fh: int) -> Stored | None:
        """Last close of a descriptor: a writer's commits what is left, and so does the last
        close of a file created here and not stored yet whoever opened it (``open(O_CREAT)``
        with ``O_RDONLY`` makes a file too); forget the handle. What was stored comes with the
        content to hand to the kernel once no descriptor is open (:meth:`_handed`)."""
        handle = self.handles.pop(fh, None)
        if handle is None:
            return None
        state = handle.state
        state.handles.discard(fh)
        if not state.handles and state.created and not state.orphan and is_deferrable(state.key):
            self._defer(state)
            return None
        try:
            if not state.failed:
                writes = handle.writable or (state.created and not state.handles)
                stored = (self.commit(state) if writes else None) or state.stored
                if stored is not None and not state.handles and not state.orphan and state.buffer:
                    return stored._replace(tail=self._handed(state))
                return stored
        except Exception as exc:  # release cannot report errors; flush already did
            log.error("commit of %s at release failed: %s", state.key, exc)
        finally:
            if not state.handles:
                self.files.forget(state)
                if state.created and not state.orphan:  # its commit failed: it is nowhere
                    self.never_stored.append(state.key)
                if self.paged.get(state.key) is state:
                    del self.paged[state.key]
                if state.shown_older:
                    self.outdated.append(state.key)
        return None

    def _defer(self, state: FileState) -> None:
        self.deferred[state.key] = state
        if state.buffer is not None:
            state.buffer.compact()
        total = sum(s.size for s in self.deferred.values())
        while total > DEFERRED_LIMIT and self.deferred:
            oldest = next(iter(self.deferred.values()))
            total -= oldest.size
            self._store_deferred(oldest)

    def _store_deferred(self, state: FileState) -> None:
        self.deferred.pop(state.key, None)
        try:
            self.commit(state)
        except Exception as exc:
            log.error("commit of %s failed: %s", state.key, exc)
        self.files.forget(state)

    def lock_granted(self, key: str, fh: int | None = None) -> None:
        """A lock on the file at ``key`` (or open as ``fh``) was granted (from any thread): it
        is brought up to date before it is next read, written or shown
        (:meth:`LockedFiles.fresh`); an older version's descriptors on this mount too: the
        file is no longer shown as their version (:meth:`_as_read`)."""
        paged = self.paged.pop(key, None)
        for state in (self.states.get(key), self.handles[fh].state if fh in self.handles else None, paged):
            if state is not None:
                state.stale = True

    def commit_key(self, key: str, fh: int | None = None) -> Stored | None:
        """Commit the file at ``key`` (or open as ``fh``), as ``fsync`` does: a lock on it is
        about to be released or downgraded."""
        state = self.handles[fh].state if fh in self.handles else self.states.get(key)
        if state is None or not state.dirty:
            return None
        stored = self.commit(state)
        self.tree.driver.sync()
        return stored

    def commit_all(self) -> None:
        """Commit every open, changed file and every held temporary file (unmount, SIGTERM)."""
        for state in list(self.states.values()):
            try:
                self.commit(state)
            except Exception as exc:
                log.error("commit of %s at shutdown failed: %s", state.key, exc)
        self.deferred.clear()

    # ------------------------------------------------------------------ unstored new files
    @staticmethod
    def _handed(state: FileState) -> bytes:
        """What to hand to the kernel of a file just stored that no descriptor holds open: its
        last partial page (the rest is in the kernel's cache, written through it), or all of
        it when it was written past the cache (:meth:`write_direct`)."""
        assert state.buffer is not None
        return (whole_content if state.direct else last_page)(state.buffer)

    def write_direct(self, fh: int) -> None:
        """The file open as ``fh`` is written past the kernel's page cache (``FOPEN_DIRECT_IO``):
        once stored and closed, all of it is handed to the kernel, not its last page alone."""
        self.files.handle(fh).state.direct = True

    def named_and_stored(self, fh: int) -> str | None:
        """The key of the file open as ``fh`` once it has been stored (before, nobody but this
        mount has seen it, and it has no extended attributes); None before, and for a file
        whose name was removed (another file may hold that key now)."""
        state = self.files.handle(fh).state
        return None if state.created or state.orphan else state.key

    def unstored(self, key: str) -> FileState | None:
        """The state of a file created here and not stored yet (a held temporary file)."""
        state = self.states.get(key)
        return state if state is not None and state.created and not state.orphan else None

    def unstored_names(self, folder: str) -> list[str]:
        """Names of the files in ``folder`` that exist only here, for listings."""
        prefix = folder + "/" if folder else ""
        return sorted(
            k[len(prefix) :]
            for k, s in self.states.items()
            if s.created and not s.orphan and k.startswith(prefix) and "/" not in k[len(prefix) :]
        )

    def newest_unstored(self, folder: str) -> int | None:
        """When the newest file made in ``folder`` and not stored yet was created (None: it
        has none): the folder changed then, though its record says so only at the commit."""
        if not self.states:
            return None
        prefix = folder + "/" if folder else ""
        births = [
            s.born
            for k, s in self.states.items()
            if s.created and s.born is not None and not s.orphan
            and k.startswith(prefix) and "/" not in k[len(prefix) :]
        ]
        return max(births, default=None)

    def store_as(self, src: str, dst: str, exclusive: bool) -> Stored:
        """Store the unstored file ``src`` at ``dst`` in one transaction: the rename of a held
        temporary file. Returns what was stored (with the last page only for a file nobody
        has open)."""
        state = self.states[src]
        assert state.buffer is not None and state.attrs is not None
        attrs = replace(state.attrs)
        how = CommitOptions(
            create=True, exclusive=exclusive, replace=True, renamed_from=src, xattrs=state.xattrs
        )
        self.parting.store(dst, state.buffer, attrs, how)
        stored = Stored(state.size, attrs.mtime)
        state.stored = stored
        if not state.handles:
            stored = stored._replace(tail=self._handed(state))
        self.files.drop_name(dst)
        del self.states[src]
        self.deferred.pop(src, None)
        state.key = dst
        state.created = state.dirty = False
        if state.handles:
            self.states[dst] = state
        else:
            self.files.forget(state)
        return stored


def _taken(keys: list[str]) -> list[str]:
    """The keys of ``keys``, which is emptied (in place: its owner keeps the list)."""
    taken = keys[:]
    keys.clear()
    return taken

"""The table of a mount's open files, :class:`OpenFiles`: one :class:`FileState` per open file,
shared by its descriptors (:class:`Handle`) and, for a file with hard links, by its names, and
the closed temporary files held for a rename. What each part of
:class:`zarrfs.fs.handles.HandleTable` reads and changes."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any

from zarrfs.backends.heldvalues import Held
from zarrfs.fs.errors import FsError
from zarrfs.fs.extents import Extents
from zarrfs.fs.node import Node
from zarrfs.fs.pagecache import Stored
from zarrfs.fs.sidedata import Attrs
from zarrfs.fs.spill import SpillBuffer


@dataclass
class FileState:
    """What the mount knows about one open key: pending content and attributes."""

    key: str
    buffer: SpillBuffer | None = None
    # The stored content its descriptors read (see :attr:`snapshot`).
    held: Held | None = None
    attrs: Attrs | None = None
    dirty: bool = False
    created: bool = False
    orphan: bool = False
    failed: bool = False
    linked: bool = False  # the file has hard links: the table holds it under each name
    stored: Stored | None = None  # what the last commit stored, while nothing changed since
    born: int | None = None  # when a file made here was created (its folder changed then)
    xattrs: bytes | None = None  # a file made here: its extended attributes, stored with it
    handles: set[int] = field(default_factory=set)
    # The stored version its descriptors read (size, mtime: stamp_of), fixed at the first open.
    version: tuple[int, int] | None = None
    # Read outside the kernel's page cache, which holds pages of an older version that
    # descriptors still open read.
    private: bool = False
    # The stored version (stamp) the buffer was read at; None: none to lay changes on (a file
    # made here, or one too large to hold), so a commit stores the buffer as it is.
    base: tuple[int, int] | None = None
    # What this mount's writers changed since ``base``: what a commit lays on the newest version.
    changes: Extents = field(default_factory=Extents)
    # A lock was granted: the file is brought up to date before anything reads or writes it.
    stale: bool = False
    # Shown to the kernel as :attr:`version` while a newer one was stored (HandleTable._as_read).
    shown_older: bool = False
    # Written past the kernel's page cache (a new file's write-only descriptor): the kernel
    # holds none of its pages, so all of it is handed over once no descriptor is open.
    direct: bool = False
    # The node the last open read: its attributes serve the first write while the change feed
    # tells of no change to the file since (HandleTable._ensure_buffer).
    opened: Node | None = None

    @property
    def snapshot(self) -> Any:
        """The stored content the descriptors read (a view or bytes), or None."""
        return None if self.held is None else self.held.data

    @snapshot.setter
    def snapshot(self, value: Held | bytes | None) -> None:
        if self.held is not None and self.held is not value:
            self.held.release()
        self.held = value if value is None or isinstance(value, Held) else Held(value)

    @property
    def size(self) -> int:
        """The size the file has now, pending writes included."""
        if self.buffer is not None:
            return self.buffer.size
        return 0 if self.held is None else self.held.size


@dataclass
class Handle:
    """One open file description."""

    state: FileState
    flags: int
    seen: Node | None = None  # the file as the open found it in the database

    @property
    def writable(self) -> bool:
        """Whether it was opened for writing."""
        return (self.flags & os.O_ACCMODE) != os.O_RDONLY


class OpenFiles:
    """The states of the keys open here (``states``: the key of each name of a file with hard
    links maps to one state), the descriptors (``handles``, by file handle) and the closed,
    unstored temporary files (``deferred``, oldest first)."""

    def __init__(self) -> None:
        self.states: dict[str, FileState] = {}
        self.handles: dict[int, Handle] = {}
        self.deferred: dict[str, FileState] = {}
        # Key -> the open file whose descriptors read through the kernel's page cache, where a
        # newer version's descriptors (private) took its place in :attr:`states`.
        self.paged: dict[str, FileState] = {}
        self._next_fh = 1

    def add(self, state: FileState, flags: int) -> int:
        """A new descriptor of ``state``, opened with ``flags``: its file handle."""
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(state, flags)
        state.handles.add(fh)
        self.states[state.key] = state
        return fh

    def handle(self, fh: int) -> Handle:
        """The descriptor ``fh`` (EBADF when there is none)."""
        try:
            return self.handles[fh]
        except KeyError:
            raise FsError(errno.EBADF, str(fh)) from None

    def names_of(self, state: FileState) -> list[str]:
        """The keys under which the table holds ``state``."""
        if not state.linked:
            return [state.key] if self.states.get(state.key) is state else []
        return [k for k, s in self.states.items() if s is state]

    def drop_name(self, key: str) -> None:
        """Name ``key`` is gone: its open file keeps its other names, or is orphaned."""
        state = self.states.pop(key, None)
        others = self.names_of(state) if state is not None and state.linked else []
        if others:
            state.key = others[0] if state.key == key else state.key
        elif state is not None:
            state.orphan = True

    def forget(self, state: FileState) -> None:
        """Let go of ``state``: its buffer, the value it held, its names here."""
        if state.buffer is not None:
            state.buffer.close()
        state.snapshot = None  # a value held in place lets its transaction go
        for name in self.names_of(state):
            del self.states[name]
        if self.deferred.get(state.key) is state:
            del self.deferred[state.key]

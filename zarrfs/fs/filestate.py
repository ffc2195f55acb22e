"""What the open-file table (:mod:`zarrfs.fs.handles`) keeps: one :class:`FileState` per open
file, shared by its descriptors (:class:`Handle`) and, for a file with hard links, by its
names. What a commit stored is a :class:`zarrfs.fs.pagecache.Stored`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from zarrfs.backends.heldvalues import Held
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
        return len(self.snapshot or b"")


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

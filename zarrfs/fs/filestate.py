"""What the open-file table (:mod:`zarrfs.fs.handles`) keeps: one :class:`FileState` per open
key, shared by its descriptors (:class:`Handle`), and what a commit stored (:class:`Stored`)."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import NamedTuple

from zarrfs.fs.namespace import Node
from zarrfs.fs.sidedata import Attrs
from zarrfs.fs.spill import SpillBuffer

PAGE = mmap.PAGESIZE


class Stored(NamedTuple):
    """What a commit stored: ``size`` and ``mtime`` decide whether the kernel's cached pages of
    the file still hold; ``tail`` is the content of its last, partial page, given only when no
    descriptor of the file is open any more (see :func:`_tail`), else empty."""

    size: int
    mtime: int
    tail: bytes = b""


def _tail(buffer: SpillBuffer) -> bytes:
    # The kernel marks a page it wrote through as up to date only when the write covered all of
    # it: the last page of a file whose size is not a multiple of the page size would be read
    # back from the database at the file's next read, unless it is handed to the kernel. The
    # kernel takes it under the page's lock; with no descriptor open, no request that could
    # hold that lock (a READ, a WRITE) is waiting for the daemon, so it can be handed over
    # before the reply, without a thread.
    cut = buffer.size % PAGE
    return bytes(buffer.read(buffer.size - cut, cut)) if cut else b""


@dataclass
class FileState:
    """What the mount knows about one open key: pending content and attributes."""

    key: str
    buffer: SpillBuffer | None = None
    snapshot: bytes | None = None
    attrs: Attrs | None = None
    dirty: bool = False
    created: bool = False
    orphan: bool = False
    failed: bool = False
    stored: Stored | None = None  # what the last commit stored, while nothing changed since
    handles: set[int] = field(default_factory=set)
    # The stored version its descriptors read (size, mtime: stamp_of), fixed at the first open.
    version: tuple[int, int] | None = None
    # Read outside the kernel's page cache, which holds pages of an older version that
    # descriptors still open read.
    private: bool = False

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

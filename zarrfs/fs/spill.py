"""A growable byte buffer that moves to an anonymous temporary file when it gets large.

In memory, a buffer is a ``bytearray`` with room beyond its content (its capacity), taken
from a small pool of freed buffers: a chunk written through the mount then lands in memory
that is already mapped (fresh memory costs a page fault per 4 KiB and its zeroing).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Callable
from typing import Any

DEFAULT_SPILL = 64 << 20

#: Freed buffers kept for the next files: at most this many bytes in all, and none larger than
#: :data:`POOL_EACH` (a file of hundreds of MiB does not pin its memory afterwards).
POOL_BYTES = 32 << 20
POOL_EACH = 8 << 20
_GRAIN = 64 << 10  # capacities are multiples of this
LOAD_PIECE = 8 << 20  # bytes read per step by SpillBuffer.load

_pool: list[bytearray] = []
_pooled = 0


def _take(capacity: int) -> bytearray:
    """A buffer of at least ``capacity`` bytes (its content is undefined): a pooled one when
    one is large enough, else a new one of about ``capacity``."""
    global _pooled
    for i in range(len(_pool) - 1, -1, -1):
        if len(_pool[i]) >= capacity:
            mem = _pool.pop(i)
            _pooled -= len(mem)
            return mem
    return bytearray(max(_GRAIN, -(-capacity // _GRAIN) * _GRAIN))


def _give_back(mem: bytearray) -> None:
    """Keep ``mem`` for a later file, when no view of it is alive and the pool has room."""
    global _pooled
    if not mem or len(mem) > POOL_EACH or _pooled + len(mem) > POOL_BYTES or _viewed(mem):
        return
    _pool.append(mem)
    _pooled += len(mem)


def _viewed(mem: bytearray) -> bool:
    """Whether a view of ``mem`` is alive (in a traceback, say): then someone may read it yet,
    and it must not be handed to another file. A bytearray refuses to change its length while
    it is viewed; shortening it by one byte and putting the byte back moves no memory."""
    try:
        last = mem.pop()
    except BufferError:
        return True
    mem.append(last)
    return False


class SpillBuffer:
    """The content of one file being written: random-access writes, truncation, and a view of
    the whole for committing. Kept in memory up to ``threshold`` bytes, then in an unlinked
    temporary file, so one 4 GiB file does not need 4 GiB of RAM (``on_disk``: there from the
    start, for content known to be large)."""

    def __init__(self, initial: Any = b"", threshold: int = DEFAULT_SPILL, on_disk: bool = False) -> None:
        self.threshold = threshold
        self._size = len(initial)
        self._file: Any = None
        self._map: mmap.mmap | None = None
        self._mem: bytearray | None = None
        if self._size > threshold or on_disk:
            # Straight to the file: a copy in memory first would double a large file's cost.
            self._file = tempfile.TemporaryFile(prefix="zarrfs-", buffering=0)
            self._file.write(initial)
            return
        self._mem = _take(self._size)
        self._mem[: self._size] = initial

    @property
    def size(self) -> int:
        """Current length in bytes."""
        return self._size

    def _spill(self) -> None:
        # Unbuffered: every later access is pread/pwrite on the descriptor.
        self._file = tempfile.TemporaryFile(prefix="zarrfs-", buffering=0)
        mem, self._mem = self._mem, None
        assert mem is not None
        self._file.write(memoryview(mem)[: self._size])
        _give_back(mem)

    def _drop_map(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still held somewhere; the map goes with it
                pass
            self._map = None

    def _room(self, end: int) -> bytearray:
        """The memory, with capacity for ``end`` bytes. Capacity past the content holds old
        bytes: a caller that extends the content zero-fills what it does not write."""
        mem = self._mem
        assert mem is not None
        if end > len(mem):
            # A new buffer rather than a resize in place: a view of the old one (a value being
            # committed, a read being answered) may still be alive, and stays valid.
            bigger = _take(max(end, min(2 * len(mem), self.threshold)))
            bigger[: self._size] = memoryview(mem)[: self._size]
            self._mem = bigger
            _give_back(mem)
            mem = bigger
        return mem

    def write(self, offset: int, data: Any) -> int:
        """Write ``data`` (any bytes-like object, copied) at ``offset``, zero-filling any gap;
        return the count written."""
        n = len(data)
        end = offset + n
        if self._mem is not None and end > self.threshold:
            self._spill()
        if self._mem is not None:
            mem = self._room(end)
            if offset > self._size:
                mem[self._size : offset] = bytes(offset - self._size)
            mem[offset:end] = data
        else:
            self._drop_map()
            os.pwrite(self._file.fileno(), data, offset)
        self._size = max(self._size, end)
        return n

    def load(self, read: Callable[[int, int], Any]) -> None:
        """Replace the content with the pieces ``read(offset, LOAD_PIECE)`` returns, until one
        is empty or None: a large stored value comes into the file without being held whole."""
        self.truncate(0)
        offset = 0
        while piece := read(offset, LOAD_PIECE):
            self.write(offset, piece)
            offset += len(piece)

    def compact(self) -> None:
        """Give back room far beyond the content (a small file kept a while after its close
        should not hold a chunk-sized buffer)."""
        mem = self._mem
        if mem is not None and len(mem) > max(2 * self._size, _GRAIN):
            self._mem = bytearray(memoryview(mem)[: self._size])
            _give_back(mem)

    def read(self, offset: int, size: int) -> Any:
        """Up to ``size`` bytes from ``offset``: a view of the memory (valid until the next
        change) or bytes read from the temporary file."""
        if offset >= self._size:
            return b""
        size = min(size, self._size - offset)
        if self._mem is not None:
            return memoryview(self._mem)[offset : offset + size]
        return os.pread(self._file.fileno(), size, offset)

    def readinto(self, offset: int, into: memoryview) -> int:
        """Copy bytes from ``offset`` into ``into`` (a file's part being stored); the count
        copied. From the temporary file by ``preadv``: nothing goes through a map, whose
        touched pages would count in the daemon's resident memory."""
        if self._mem is not None:
            n = max(0, min(len(into), self._size - offset))
            into[:n] = memoryview(self._mem)[offset : offset + n]
            return n
        return os.preadv(self._file.fileno(), [into], offset)

    def truncate(self, length: int) -> None:
        """Cut or zero-extend to ``length`` bytes."""
        if self._mem is not None and length > self.threshold:
            self._spill()
        if self._mem is not None:
            if length > self._size:
                self._room(length)[self._size : length] = bytes(length - self._size)
        else:
            self._drop_map()
            self._file.truncate(length)
        self._size = length

    def view(self) -> Any:
        """A buffer-protocol view of the whole content, valid until the next change."""
        if self._mem is not None:
            return memoryview(self._mem)[: self._size]
        if self._size == 0:
            return b""
        if self._map is None:
            self._map = mmap.mmap(self._file.fileno(), self._size, access=mmap.ACCESS_READ)
        return self._map

    def close(self) -> None:
        """Free the memory (for a later file) or the temporary file."""
        self._drop_map()
        if self._file is not None:
            self._file.close()
            self._file = None
        mem, self._mem = self._mem, None
        if mem is not None:
            _give_back(mem)

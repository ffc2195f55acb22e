"""A growable byte buffer that moves to an anonymous temporary file when it gets large.

In memory, a buffer is a ``bytearray`` with room beyond its content (its capacity), taken
from a small pool of freed buffers: a chunk written through the mount then lands in memory
that is already mapped (fresh memory costs a page fault per 4 KiB and its zeroing).

The buffer of a file stored in parts tracks them (:class:`PartTrack`): which parts changed
since the stored version it was read from (a commit stores only those), and, for a file
opened for writing, which parts of that version are not read in yet: each comes in from
the database when the buffer is first read, written or cut there. Holes stay holes of the
temporary file (sparse), and zeroing a whole part punches it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
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

_FALLOC_KEEP_SIZE, _FALLOC_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_ZERO_STEP = 1 << 20


def _punch(fd: int, offset: int, length: int) -> bool:
    """Punch a hole in the temporary file (False when its filesystem cannot)."""
    fallocate = getattr(_libc, "fallocate", None)
    if fallocate is None:
        return False
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return fallocate(fd, _FALLOC_PUNCH_HOLE | _FALLOC_KEEP_SIZE, offset, length) == 0


class PartTrack:
    """The parts of a buffer's content against the stored version it was read from
    (``base``, a :class:`zarrfs.fs.manifest.Parted`): which changed since (``changed``),
    and which are not read in yet (``pending``: ``fill(base, n)`` gives part ``n``)."""

    def __init__(
        self, base: Any, pending: set[int] | None = None, fill: Callable[[Any, int], Any] | None = None
    ) -> None:
        self.base = base
        self.part: int = base.part
        self.pending = pending or set()
        self.fill = fill
        self.touched: set[int] = set()
        self.cut: int | None = None  # parts from here on changed (a truncation)

    def changed(self, n: int) -> bool:
        """Whether part ``n`` may differ from the base's."""
        return n in self.touched or (self.cut is not None and n >= self.cut)

    def wrote(self, start: int, end: int) -> None:
        if end > start:
            self.touched.update(range(start // self.part, (end - 1) // self.part + 1))

    def cut_at(self, length: int) -> None:
        n = length // self.part
        self.cut = n if self.cut is None else min(self.cut, n)

    def committed(self, base: Any) -> None:
        """``base`` is now the stored version: nothing changed since."""
        self.base = base
        self.touched = set()
        self.cut = None


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
        #: The parts of a file stored in parts, when it was read from one (see the module).
        self.parts: PartTrack | None = None
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

    @property
    def in_memory(self) -> bool:
        """Whether the content is in memory (not spilled to the temporary file)."""
        return self._mem is not None

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
        if self.parts is not None:
            self._bring(offset, end)
            if offset > self._size:
                self.parts.cut_at(self._size)
            self.parts.wrote(offset, end)
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
        self.parts = None
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
        self._bring(offset, offset + size)
        if self._mem is not None:
            return memoryview(self._mem)[offset : offset + size]
        return os.pread(self._file.fileno(), size, offset)

    def readinto(self, offset: int, into: memoryview) -> int:
        """Copy bytes from ``offset`` into ``into`` (a file's part being stored); the count
        copied. From the temporary file by ``preadv``: nothing goes through a map, whose
        touched pages would count in the daemon's resident memory."""
        self._bring(offset, min(offset + len(into), self._size))
        if self._mem is not None:
            n = max(0, min(len(into), self._size - offset))
            into[:n] = memoryview(self._mem)[offset : offset + n]
            return n
        return os.preadv(self._file.fileno(), [into], offset)

    def truncate(self, length: int) -> None:
        """Cut or zero-extend to ``length`` bytes."""
        track = self.parts
        if track is not None and length != self._size:
            edge = min(length, self._size)
            if edge % track.part:
                self._bring(edge, edge + 1)
            track.pending = {n for n in track.pending if n * track.part < edge}
            track.cut_at(edge)
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
        self._bring(0, self._size)
        if self._map is None:
            self._map = mmap.mmap(self._file.fileno(), self._size, access=mmap.ACCESS_READ)
        return self._map

    # ------------------------------------------------------------------ parts
    def _bring(self, start: int, end: int) -> None:
        """Read in the parts of ``[start, end)`` not read in yet (see :class:`PartTrack`)."""
        track = self.parts
        if track is None or not track.pending or end <= start:
            return
        assert track.fill is not None and self._file is not None
        for n in range(start // track.part, (end - 1) // track.part + 1):
            if n in track.pending:
                self._drop_map()
                os.pwrite(self._file.fileno(), track.fill(track.base, n), n * track.part)
                track.pending.discard(n)

    def settle(self) -> None:
        """Read in every part not read in yet and forget the stored version: the next commit
        stores the whole content (its base is gone)."""
        self._bring(0, self._size)
        self.parts = None

    def zero(self, start: int, end: int) -> None:
        """Zero ``[start, end)`` (growing the content to ``end``): whole parts of a tracked
        file on disk are punched (never read in), the rest written with zeros."""
        track = self.parts
        if end > self._size:
            self.truncate(end)
        if track is not None and self._file is not None:
            first = -(-start // track.part)
            last = end // track.part if end < self._size else -(-end // track.part)
            if first < last:
                lo, hi = first * track.part, min(last * track.part, self._size)
                if _punch(self._file.fileno(), lo, hi - lo):
                    self._drop_map()
                    track.pending.difference_update(range(first, last))
                    track.wrote(lo, hi)
                    self._zero_write(start, lo)
                    self._zero_write(hi, end)
                    return
        self._zero_write(start, end)

    def _zero_write(self, start: int, end: int) -> None:
        zeros = memoryview(bytes(min(max(end - start, 0), _ZERO_STEP)))
        at = start
        while at < end:
            step = min(end - at, len(zeros))
            self.write(at, zeros[:step])
            at += step

    def has_data(self, start: int, end: int) -> bool:
        """False when ``[start, end)`` is known to hold zeros without reading it: a hole of
        the temporary file, not a part still to be read in."""
        track = self.parts
        if self._file is None or end <= start:
            return True
        if track is not None and any(
            n in track.pending for n in range(start // track.part, (end - 1) // track.part + 1)
        ):
            return True
        try:
            return os.lseek(self._file.fileno(), start, os.SEEK_DATA) < end
        except OSError as exc:
            return exc.errno != errno.ENXIO  # ENXIO: no data from ``start`` on

    def data_ranges(self) -> list[tuple[int, int]] | None:
        """The ranges of the content that may hold data (parts to be read in count), or None
        when it is all to be taken as data (in memory)."""
        if self._file is None:
            return None
        fd = self._file.fileno()
        out: list[tuple[int, int]] = []
        at = 0
        while at < self._size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:
                break
            if start >= self._size:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), self._size)
            out.append((start, end))
            at = end
        track = self.parts
        if track is not None:
            for n in track.pending:
                out.append((n * track.part, min((n + 1) * track.part, self._size)))
            out.sort()
        return out

    def close(self) -> None:
        """Free the memory (for a later file) or the temporary file."""
        self._drop_map()
        if self._file is not None:
            self._file.close()
            self._file = None
        mem, self._mem = self._mem, None
        if mem is not None:
            _give_back(mem)

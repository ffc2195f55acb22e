"""A growable byte buffer that moves to an anonymous temporary file when it gets large."""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

DEFAULT_SPILL = 64 << 20


class SpillBuffer:
    """The content of one file being written: random-access writes, truncation, and a view of
    the whole for committing. Kept in memory up to ``threshold`` bytes, then in an unlinked
    temporary file, so one 4 GiB file does not need 4 GiB of RAM."""

    def __init__(self, initial: bytes = b"", threshold: int = DEFAULT_SPILL) -> None:
        self.threshold = threshold
        self._mem: bytearray | None = bytearray(initial)
        self._file: Any = None
        self._size = len(initial)
        self._map: mmap.mmap | None = None
        if self._size > threshold:
            self._spill()

    @property
    def size(self) -> int:
        """Current length in bytes."""
        return self._size

    def _spill(self) -> None:
        # Unbuffered: every later access is pread/pwrite on the descriptor.
        self._file = tempfile.TemporaryFile(prefix="zarrfs-", buffering=0)
        self._file.write(self._mem)
        self._mem = None

    def _drop_map(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still held somewhere; the map goes with it
                pass
            self._map = None

    def write(self, offset: int, data: Any) -> int:
        """Write ``data`` (any bytes-like object, copied) at ``offset``, zero-filling any gap;
        return the count written."""
        end = offset + len(data)
        if self._mem is not None and end > self.threshold:
            self._spill()
        if self._mem is not None:
            if offset > len(self._mem):
                self._mem.extend(bytes(offset - len(self._mem)))
            self._mem[offset:end] = data
        else:
            self._drop_map()
            os.pwrite(self._file.fileno(), data, offset)
        self._size = max(self._size, end)
        return len(data)

    def read(self, offset: int, size: int) -> Any:
        """Up to ``size`` bytes from ``offset``: a view of the memory (valid until the next
        change) or bytes read from the temporary file."""
        if offset >= self._size:
            return b""
        size = min(size, self._size - offset)
        if self._mem is not None:
            return memoryview(self._mem)[offset : offset + size]
        return os.pread(self._file.fileno(), size, offset)

    def truncate(self, length: int) -> None:
        """Cut or zero-extend to ``length`` bytes."""
        if self._mem is not None and length > self.threshold:
            self._spill()
        if self._mem is not None:
            if length < len(self._mem):
                del self._mem[length:]
            else:
                self._mem.extend(bytes(length - len(self._mem)))
        else:
            self._drop_map()
            self._file.truncate(length)
        self._size = length

    def view(self) -> Any:
        """A buffer-protocol view of the whole content, valid until the next change."""
        if self._mem is not None:
            return self._mem
        if self._size == 0:
            return b""
        if self._map is None:
            self._map = mmap.mmap(self._file.fileno(), self._size, access=mmap.ACCESS_READ)
        return self._map

    def close(self) -> None:
        """Free the memory or the temporary file."""
        self._drop_map()
        if self._file is not None:
            self._file.close()
            self._file = None
        self._mem = None

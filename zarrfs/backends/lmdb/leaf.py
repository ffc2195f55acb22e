"""What an LMDB leaf node tells of a value without touching the value's pages: its size, and
where its pages are.

py-lmdb touches a byte of every page of each value it returns (``preload``, so that page faults
come with the GIL let go): ``len(txn.get(key))`` of a 1 GiB chunk reads the gigabyte from disk,
a scan that asks for values to learn their sizes reads every value it passes, and a read of 64
KiB of a 256 MiB shard reads the shard. It offers no call that gives a size or a view alone, so
both are read here from the node that holds the key: in LMDB 0.9 a leaf node is ``mn_lo, mn_hi,
mn_flags, mn_ksize`` (four native shorts) and then the key, the value's size being ``mn_lo |
mn_hi << 16``; a value on overflow pages (``F_BIGDATA``) has their first page number after the
key, and that page a 16-byte header (its number, its flags) before the value. py-lmdb returns a
key as a buffer into its node (``buffers=True``); the buffer's address is read from the
memoryview object (its ``Py_buffer``, whose place is found at import against buffers of known
address). A node or page that does not agree (a key size not the key's, a sub-database, a page
not where its number says or past the environment's map) gives None, and the caller asks
py-lmdb; where the layout is not found (another Python, another LMDB) :data:`AVAILABLE` is False
and everything is asked of py-lmdb, as before.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable
from typing import Any

import lmdb

try:
    import cython

    _COMPILED = cython.compiled  # True where Cython compiled this module
except ImportError:  # without Cython this module runs as Python, as it does uncompiled
    _COMPILED = False
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_P_OVERFLOW = 0x04
_PAGE_HEAD = 16  # an overflow page's header: its number (8 bytes), pad, flags, page count
#: Values smaller than this are asked of py-lmdb (read whole, as they are copied whole).
VIEWED = 64 << 10
_HEAD = struct.Struct("=HHHH")
_LOW_FIRST = sys.byteorder == "little"  # mn_lo before mn_hi on a little-endian machine
_POINTER = ctypes.sizeof(ctypes.c_void_p)
# The process's memory as arrays from address 0, read by index: a read of a pointer or of a
# node header without a ctypes object made for it (about 100 ns, not 300-500).
_WORDS = (ctypes.c_size_t * (sys.maxsize // _POINTER)).from_address(0)
_BYTES = (ctypes.c_char * sys.maxsize).from_address(0)


def _buffer_offset() -> int | None:
    """Where a memoryview object keeps its buffer's address (``Py_buffer.buf``), checked on
    two buffers of known address and a slice of one, within the object's own bytes; None when
    no place holds all three."""
    one, two = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    views = memoryview(one), memoryview(two), memoryview(two)[8:]
    wanted = ctypes.addressof(one), ctypes.addressof(two), ctypes.addressof(two) + 8
    for offset in range(_POINTER, sys.getsizeof(views[0]) - _POINTER + 1, _POINTER):
        if all(_WORDS[(id(v) + offset) // _POINTER] == a for v, a in zip(views, wanted, strict=True)):
            return offset
    return None


_OFFSET = _buffer_offset() if sys.implementation.name == "cpython" else None
#: Whether sizes are read from leaf nodes here (else asked of py-lmdb, which reads the value).
AVAILABLE = _OFFSET is not None and lmdb.version()[:2] == (0, 9)
_OFFSET = _OFFSET or 0


def size_at(key: Any) -> int | None:
    """The size of the value whose key py-lmdb returned as ``key`` (a memoryview into its leaf
    node), or None when the node does not agree or sizes are not read here."""
    if not AVAILABLE or type(key) is not memoryview:
        return None
    _, size, flags, ksize = _node(key)
    if ksize != len(key) or flags & (_F_SUBDATA | _F_DUPDATA):
        return None
    return size


def _node(key: memoryview) -> tuple[int, int, int, int]:
    """The address of ``key`` and its node's value size, flags and key size."""
    at = _WORDS[(id(key) + _OFFSET) // _POINTER]
    first, second, flags, ksize = _HEAD.unpack(_BYTES[at - 8 : at])
    return at, (first | second << 16 if _LOW_FIRST else second | first << 16), flags, ksize


def _sizes_compiled(keys: list[Any], offset: int, low_first: bool) -> list[int | None]:
    """:func:`sizes_at`'s loop where this module is compiled: the buffer's address and the
    node's header read through C pointers, no ctypes object a key."""
    at = cython.declare(cython.size_t)
    head = cython.declare(cython.pointer(cython.ushort))
    size = cython.declare(cython.size_t)
    out: list[int | None] = []
    append = out.append
    for key in keys:
        if type(key) is not memoryview:
            append(None)
            continue
        at = cython.cast(cython.pointer(cython.size_t), cython.cast(cython.size_t, id(key) + offset))[0]
        head = cython.cast(cython.pointer(cython.ushort), at - 8)
        if head[3] != len(key) or head[2] & (_F_SUBDATA | _F_DUPDATA):
            append(None)
            continue
        if low_first:
            size = head[0] | cython.cast(cython.size_t, head[1]) << 16
        else:
            size = head[1] | cython.cast(cython.size_t, head[0]) << 16
        append(size)
    return out


def sizes_at(keys: list[Any]) -> list[int | None]:
    """:func:`size_at` of each of ``keys`` (a scan's), in one loop."""
    if not AVAILABLE:
        return [None] * len(keys)
    if _COMPILED:
        return _sizes_compiled(keys, _OFFSET, _LOW_FIRST)
    return [size_at(key) for key in keys]


def _word(at: int) -> int:
    """The native unsigned 8-byte number at address ``at`` (any alignment)."""
    return int.from_bytes(_BYTES[at : at + 8], sys.byteorder)


def value_view(cur: lmdb.Cursor, raw: bytes, where: Callable[[], tuple[int, int, int] | None]) -> Any:
    """The value of ``raw`` in the read transaction of ``cur`` (``buffers=True``) as a buffer
    of the map, None when there is none: a large value's pages are not touched (a read of a
    range reads that range); ``where()``: ``(start, end, page size)`` of the environment's map,
    asked for a large value only (None: not known, the value is asked of py-lmdb). Valid while
    the transaction is."""
    if not cur.set_key(raw):
        return None
    if not AVAILABLE:
        return cur.value()
    key = cur.key()
    if type(key) is not memoryview:
        return cur.value()
    at, size, flags, ksize = _node(key)
    if size < VIEWED or ksize != len(key) or flags & (_F_SUBDATA | _F_DUPDATA) or not flags & _F_BIGDATA:
        return cur.value()
    found = where()
    if found is None or not found[0] <= at < found[1]:
        return cur.value()
    start, end, psize = found
    pgno = _word(at + ksize)
    page = start + pgno * psize
    if (
        page + _PAGE_HEAD + size > end
        or _word(page) != pgno
        or not int.from_bytes(_BYTES[page + 10 : page + 12], sys.byteorder) & _P_OVERFLOW
    ):
        return cur.value()
    return memoryview((ctypes.c_char * size).from_address(page + _PAGE_HEAD)).cast("B").toreadonly()


def value_size(cur: lmdb.Cursor, raw: bytes) -> int | None:
    """The size of the value of ``raw`` in the transaction of ``cur`` (``buffers=True``), None
    when there is none, read without touching the value's pages where :func:`size_at` can."""
    if not cur.set_key(raw):
        return None
    size = size_at(cur.key())
    return len(cur.value()) if size is None else size


__all__ = ["AVAILABLE", "VIEWED", "size_at", "sizes_at", "value_size", "value_view"]

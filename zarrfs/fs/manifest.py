"""The manifest of a value stored in parts (:mod:`zarrfs.fs.parts`): 49 bytes under its data key::

    MAGIC (17) | id (16) | total size (u64 LE) | part size (u64 LE)
    MAP_MAGIC (17) | id (16) | total size (u64 LE) | part size (u32 LE) | stored (u32 LE)

Plain: a version whose parts are all its own and all stored. Mapped (holes, parts shared with the
version it replaced): ``stored`` counts the stored parts for ``st_blocks`` (bit 31: the last part
is one), and ``p:<id>/map`` gives per part the 16-byte id of the version whose key holds it
(``p:<that id>/<n>``), or zeros for a hole. Both magics begin above 0x7F and hold CR LF, ^Z and
LF (as PNG's signature): no codec zarr-python 2 knows decodes them, so it fails on a parted chunk
rather than return wrong data. The id (8 bytes of nanosecond time, 8 random) is fresh per stored
version, so parts are never overwritten and ``zarrfs check`` dates orphans by it. A value is
parted only when its attribute record (``a:<key>``, :class:`zarrfs.fs.sidedata.Attrs`) ends with
the same manifest, so a writer that is not zarrfs replacing the key shows its own value.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field, replace

MAGIC = b"\x89zarrfs-parts\r\n\x1a\n"
MAP_MAGIC = b"\x89zarrfs-pmaps\r\n\x1a\n"
_BODY = struct.Struct("<16sQQ")
_MAP_BODY = struct.Struct("<16sQII")
MANIFEST_SIZE = len(MAGIC) + _BODY.size
#: Side prefix of parts: ``p:<id hex>/<n, 8 digits>``; a mapped version's map: ``p:<id>/map``.
PART = "p:"
MAP = "map"
HOLE = bytes(16)
_LAST = 1 << 31


def new_id() -> str:
    """A fresh version id (32 hex digits): the time, then randomness."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


def part_key(ident: str, n: int) -> str:
    """Side key of part ``n`` as version ``ident`` stored it."""
    return f"{PART}{ident}/{n:08d}"


@dataclass(frozen=True)
class Parted:
    """One stored version of a parted value: its id, total size and part size; for a mapped
    one (holes, shared parts), how many parts are stored and, once known, its map
    (``entries``: per part, the id of the version that stored it, None for a hole).
    ``base``: the version a new one shares parts with (its commit requires it to be the
    stored one); ``keep``: for a replaced version, the part keys its successor took over."""

    id: str
    size: int
    part: int
    mapped: bool = False
    stored: int = -1
    entries: tuple[str | None, ...] | None = field(default=None, compare=False, repr=False)
    base: Parted | None = field(default=None, compare=False, repr=False)
    keep: frozenset[str] | None = field(default=None, compare=False, repr=False)

    @property
    def count(self) -> int:
        """How many parts hold the value."""
        return -(-self.size // self.part)

    def key(self, n: int) -> str:
        """Side key of part ``n`` as this version stored it."""
        return part_key(self.id, n)

    @property
    def map_key(self) -> str:
        """Side key of a mapped version's part map."""
        return f"{PART}{self.id}/{MAP}"

    def stored_bytes(self) -> int:
        """The bytes its stored parts hold (``st_blocks``)."""
        if not self.mapped:
            return self.size
        count = self.stored & ~_LAST
        if not count:
            return 0
        if self.stored & _LAST:
            return (count - 1) * self.part + self.length(self.count - 1)
        return count * self.part

    def keys(self) -> list[str]:
        """The side keys of its stored parts (its map's ``entries`` must be known)."""
        if not self.mapped:
            return [self.key(n) for n in range(self.count)]
        assert self.entries is not None
        return [part_key(e, n) for n, e in enumerate(self.entries) if e is not None]

    def length(self, n: int) -> int:
        """The size of part ``n``."""
        return min(self.part, self.size - n * self.part)

    def manifest(self) -> bytes:
        """What the data key (and the attribute record) holds."""
        if self.mapped:
            return MAP_MAGIC + _MAP_BODY.pack(bytes.fromhex(self.id), self.size, self.part, self.stored)
        return MAGIC + _BODY.pack(bytes.fromhex(self.id), self.size, self.part)

    def pack_map(self) -> bytes:
        """The part map of a mapped version."""
        assert self.entries is not None
        return b"".join(HOLE if e is None else bytes.fromhex(e) for e in self.entries)

    def with_map(self, raw: bytes | memoryview) -> Parted:
        """This version with the map ``raw`` (what :meth:`pack_map` made) read in."""
        raw = bytes(raw)
        cells = (raw[i : i + 16] for i in range(0, len(raw), 16))
        entries = tuple(None if cell == HOLE else cell.hex() for cell in cells)
        return replace(self, entries=entries)

    @classmethod
    def of(cls, ident: str, size: int, part: int, entries: list[str | None], base: Parted | None) -> Parted:
        """A new version from its map: plain when every part is its own and stored."""
        if all(e == ident for e in entries):
            return cls(ident, size, part, entries=tuple(entries), base=base)
        count = sum(1 for e in entries if e is not None)
        stored = count | (_LAST if entries and entries[-1] is not None else 0)
        return cls(ident, size, part, True, stored, tuple(entries), base)

    @property
    def born(self) -> int:
        """When the version's parts began to be written (ns since the epoch)."""
        return int(self.id[:16], 16)

    @classmethod
    def parse(cls, raw: bytes | memoryview | None) -> Parted | None:
        """The manifest in ``raw``, or None when it is not one."""
        if raw is None or len(raw) != MANIFEST_SIZE:
            return None
        magic = bytes(raw[: len(MAGIC)])
        if magic == MAGIC:
            ident, size, part = _BODY.unpack(bytes(raw[len(MAGIC) :]))
            mapped, stored = False, -1
        elif magic == MAP_MAGIC:
            ident, size, part, stored = _MAP_BODY.unpack(bytes(raw[len(MAGIC) :]))
            mapped = True
        else:
            return None
        if part <= 0:
            return None
        return cls(ident.hex(), size, part, mapped, stored)


def id_of_part(side_key: str) -> str | None:
    """The version id of a part's side key, or None when ``side_key`` is not one."""
    if not side_key.startswith(PART):
        return None
    ident, slash, n = side_key[len(PART) :].partition("/")
    return ident if slash and len(ident) == 32 and ((n.isascii() and n.isdigit()) or n == MAP) else None

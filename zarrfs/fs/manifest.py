"""The manifest of a value stored in parts (see :mod:`zarrfs.fs.parts`), and its encoding.

A parted value's data key holds a small manifest instead of the value::

    MAGIC (17 bytes) | id (16 bytes) | total size (u64 LE) | part size (u64 LE)

The magic begins with a byte above 0x7F and holds a CR LF, a ^Z and an LF (the trick of the
PNG signature): no codec zarr-python 2 knows decodes it (Blosc, zlib, gzip, Zstandard and
LZ4 headers do not match), and a raw chunk of 49 bytes is never the size of a chunk above the
parting threshold, so zarr-python 2 reading a parted chunk fails with an error, never with
wrong data. The file's attribute record (``a:<key>``, :class:`zarrfs.fs.sidedata.Attrs`)
carries the same manifest: a value is parted only when the two are equal, so a writer that is
not zarrfs replacing the key shows its own value.

The id is 8 bytes of the time in nanoseconds then 8 random bytes: a fresh id per stored
version, so parts are never overwritten; ``zarrfs check`` tells an unfinished write's parts
(orphans) by their time.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

MAGIC = b"\x89zarrfs-parts\r\n\x1a\n"
_BODY = struct.Struct("<16sQQ")
MANIFEST_SIZE = len(MAGIC) + _BODY.size
#: Side prefix of parts: ``p:<id hex>/<n, 8 digits>``.
PART = "p:"


def new_id() -> str:
    """A fresh version id (32 hex digits): the time, then randomness."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


@dataclass(frozen=True)
class Parted:
    """One stored version of a parted value: its id, total size and part size."""

    id: str
    size: int
    part: int

    @property
    def count(self) -> int:
        """How many parts hold the value."""
        return -(-self.size // self.part)

    def key(self, n: int) -> str:
        """Side key of part ``n``."""
        return f"{PART}{self.id}/{n:08d}"

    def length(self, n: int) -> int:
        """The size of part ``n``."""
        return min(self.part, self.size - n * self.part)

    def manifest(self) -> bytes:
        """What the data key (and the attribute record) holds."""
        return MAGIC + _BODY.pack(bytes.fromhex(self.id), self.size, self.part)

    @property
    def born(self) -> int:
        """When the version's parts began to be written (ns since the epoch)."""
        return int(self.id[:16], 16)

    @classmethod
    def parse(cls, raw: bytes | memoryview | None) -> Parted | None:
        """The manifest in ``raw``, or None when it is not one."""
        if raw is None or len(raw) != MANIFEST_SIZE or bytes(raw[: len(MAGIC)]) != MAGIC:
            return None
        ident, size, part = _BODY.unpack(bytes(raw[len(MAGIC) :]))
        if part <= 0:
            return None
        return cls(ident.hex(), size, part)


def id_of_part(side_key: str) -> str | None:
    """The version id of a part's side key, or None when ``side_key`` is not one."""
    if not side_key.startswith(PART):
        return None
    ident, slash, n = side_key[len(PART) :].partition("/")
    return ident if slash and len(ident) == 32 and n.isdigit() else None

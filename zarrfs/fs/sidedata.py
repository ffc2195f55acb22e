"""The filesystem's bookkeeping in the driver's SIDE space, and how it is encoded.

Each kind of record has its own one-letter prefix, so a range scan of one kind under a folder
never sees the others:

* ``a:<key>``: attributes (mode, uid, gid, atime, mtime, ctime); advisory: defaults without one.
* ``e:<key>``: an entry that is not a Zarr key: ``d`` a folder made with ``mkdir`` (kept while
  empty), ``l<target>`` a symlink, ``s<type><rdev>`` a FIFO, device or socket.
* ``epoch``: the time of keys with no attributes yet, fixed at the first mount (``rsync`` compares
  mtimes).
* ``h:<key>``, ``g:<id>``: hard links (:mod:`zarrfs.fs.hardlinks`).
* ``p:<id>/<n>``: parts of a value stored in parts (:mod:`zarrfs.fs.parts`); its ``a:`` record
  then ends with the manifest (:mod:`zarrfs.fs.manifest`).
* ``x:<key>``: extended attributes (:func:`pack_xattrs`), absent when none; like ``a:``, the same
  under each name of a linked file.
"""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass

from zarrfs.fs.manifest import MANIFEST_SIZE, Parted

ATTR = "a:"
ENTRY = "e:"
XATTR = "x:"
POINTER = "h:"
GROUP = "g:"
EPOCH = "epoch"
#: The side records a node has under its own name (a rename moves them with it).
NAMED = (ENTRY, ATTR, XATTR, POINTER)

DIR_MARK = b"d"
LINK_MARK = b"l"
SPECIAL_MARK = b"s"

#: The file types kept as special entries (``mknod``, ``mkfifo``, a socket's ``bind``).
SPECIAL_TYPES = (stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK)

_SPECIAL_RECORD = struct.Struct("<IQ")  # file-type bits, device number

_ATTR_RECORD = struct.Struct("<IIIqqq")
_XATTR_HEAD = struct.Struct("<BI")  # name length, value length; then the name, the value


@dataclass(slots=True)
class Attrs:
    """Mode (including the file-type bits), owner and times in nanoseconds of one node; for a
    file stored in parts, the manifest of its parts (``parted``)."""

    mode: int
    uid: int
    gid: int
    atime: int
    mtime: int
    ctime: int
    parted: Parted | None = None

    def pack(self) -> bytes:
        """Encode for the side space."""
        return self.pack_parted(self.parted)

    def pack_parted(self, parted: Parted | None) -> bytes:
        """:meth:`pack` with ``parted`` for the manifest (a commit's own): no copy of the
        attributes made to be packed once."""
        raw = _ATTR_RECORD.pack(self.mode, self.uid, self.gid, self.atime, self.mtime, self.ctime)
        return raw if parted is None else raw + parted.manifest()

    @classmethod
    def unpack(cls, raw: bytes) -> Attrs | None:
        """Decode a side record; ``None`` for a record this version cannot read."""
        base = _ATTR_RECORD.size
        if len(raw) == base:
            return cls(*_ATTR_RECORD.unpack(raw))
        parted = Parted.parse(raw[base:]) if len(raw) == base + MANIFEST_SIZE else None
        if parted is None:
            return None
        return cls(*_ATTR_RECORD.unpack(raw[:base]), parted=parted)

    @classmethod
    def unpack_plain(cls, raws: list[bytes | None]) -> list[Attrs | None]:
        """:meth:`unpack` of many records in one call (a listing's window), for those without
        a manifest; None for the others (no record, one in parts, one this version cannot read)."""
        base, unpack = _ATTR_RECORD.size, _ATTR_RECORD.unpack
        return [cls(*unpack(raw)) if raw is not None and len(raw) == base else None for raw in raws]

    def with_type(self, type_bits: int) -> Attrs:
        """The same attributes with the file-type bits of ``type_bits`` (a node's kind wins over
        a stale record)."""
        return Attrs(
            stat.S_IMODE(self.mode) | stat.S_IFMT(type_bits),
            self.uid,
            self.gid,
            self.atime,
            self.mtime,
            self.ctime,
            self.parted,
        )


def attr_key(key: str) -> str:
    """Side key of the attributes of ``key``."""
    return ATTR + key


def entry_key(key: str) -> str:
    """Side key of the non-Zarr entry (empty folder, symlink) at ``key``."""
    return ENTRY + key


def pointer_key(key: str) -> str:
    """Side key of the link-group pointer of the file at ``key``."""
    return POINTER + key


def group_key(gid: str) -> str:
    """Side key of the names of link group ``gid``."""
    return GROUP + gid


def moved_key(record_key: str, src: str, dst: str) -> str:
    """Where a data key or a named side record of ``src`` or below goes when ``src`` is
    renamed to ``dst``."""
    for prefix in NAMED:
        if record_key.startswith(prefix):
            return prefix + dst + record_key[len(prefix) + len(src) :]
    return dst + record_key[len(src) :]


def named_of(record_key: str) -> str | None:
    """The key whose node the side record ``record_key`` is one of (:data:`NAMED`), or None
    for a record of no name's own (a link group's names, the epoch)."""
    for prefix in NAMED:
        if record_key.startswith(prefix):
            return record_key[len(prefix) :]
    return None


def special_mark(kind: int, rdev: int) -> bytes:
    """The entry marker of a special file of type ``kind`` (file-type bits) and device ``rdev``."""
    return SPECIAL_MARK + _SPECIAL_RECORD.pack(stat.S_IFMT(kind), rdev)


def read_special(mark: bytes) -> tuple[int, int]:
    """``(kind, rdev)`` of a special file's entry marker; a marker this version cannot read
    shows as a FIFO (harmless to open, never a device)."""
    body = bytes(mark[1:])
    if len(body) != _SPECIAL_RECORD.size:
        return stat.S_IFIFO, 0
    kind, rdev = _SPECIAL_RECORD.unpack(body)
    return (kind, rdev) if kind in SPECIAL_TYPES else (stat.S_IFIFO, 0)


def xattr_key(key: str) -> str:
    """Side key of the extended attributes of ``key``."""
    return XATTR + key


def pack_xattrs(xattrs: dict[bytes, bytes]) -> bytes:
    """Encode a node's extended attributes (name -> value) for the side space."""
    out = []
    for name, value in sorted(xattrs.items()):
        out += [_XATTR_HEAD.pack(len(name), len(value)), name, value]
    return b"".join(out)


def unpack_xattrs(raw: bytes | None) -> dict[bytes, bytes]:
    """Decode :func:`pack_xattrs`; what is cut short is left out."""
    out: dict[bytes, bytes] = {}
    raw = bytes(raw or b"")
    at = 0
    while at + _XATTR_HEAD.size <= len(raw):
        n, v = _XATTR_HEAD.unpack_from(raw, at)
        at += _XATTR_HEAD.size
        if at + n + v > len(raw):
            break
        out[raw[at : at + n]] = raw[at + n : at + n + v]
        at += n + v
    return out

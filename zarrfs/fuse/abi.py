"""The FUSE kernel protocol: request codes, flags and the byte layouts of ``<linux/fuse.h>``.

zarrfs speaks the protocol itself (see :mod:`zarrfs.fuse.session`): a request is a
``fuse_in_header`` followed by the operation's arguments, a reply a ``fuse_out_header``
followed by its result, both little-endian C structs packed here with :mod:`struct`. The
layouts are those of protocol 7.31, which every kernel since 5.4 speaks; newer kernels adapt to
the minor version given in the INIT reply. Nothing here does I/O.
"""

from __future__ import annotations

import stat
import struct
from collections.abc import Iterable

MAJOR = 7
MINOR = 31
ROOT_ID = 1

# Opcodes.
LOOKUP = 1
FORGET = 2
GETATTR = 3
SETATTR = 4
READLINK = 5
SYMLINK = 6
MKNOD = 8
MKDIR = 9
UNLINK = 10
RMDIR = 11
RENAME = 12
LINK = 13
OPEN = 14
READ = 15
WRITE = 16
STATFS = 17
RELEASE = 18
FSYNC = 20
FLUSH = 25
INIT = 26
OPENDIR = 27
READDIR = 28
RELEASEDIR = 29
FSYNCDIR = 30
CREATE = 35
INTERRUPT = 36
DESTROY = 38
BATCH_FORGET = 42
RENAME2 = 45

OPCODE_NAMES = {
    code: name.lower()
    for name, code in list(globals().items())
    if name.isupper() and isinstance(code, int) and name not in ("MAJOR", "MINOR", "ROOT_ID")
}

# INIT flags (fuse_init_in.flags / fuse_init_out.flags).
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
ASYNC_DIO = 1 << 15
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
# What zarrfs asks for when the kernel offers it. Not AUTO_INVAL_DATA: the kernel would drop
# a file's pages whenever it sees a new mtime, also after writes through the mount, whose
# pages are right; the session decides at each open instead (FOPEN_KEEP_CACHE).
WANTED = ASYNC_READ | ATOMIC_O_TRUNC | BIG_WRITES | ASYNC_DIO | PARALLEL_DIROPS | MAX_PAGES

# SETATTR valid bits.
FATTR_MODE = 1 << 0
FATTR_UID = 1 << 1
FATTR_GID = 1 << 2
FATTR_SIZE = 1 << 3
FATTR_ATIME = 1 << 4
FATTR_MTIME = 1 << 5
FATTR_FH = 1 << 6
FATTR_ATIME_NOW = 1 << 7
FATTR_MTIME_NOW = 1 << 8

GETATTR_FH = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
# Linux >= 5.16 (protocol 7.35) sends no FLUSH at the close of such a file; older kernels
# ignore the bit and send it as before.
FOPEN_NOFLUSH = 1 << 5
FSYNC_FDATASYNC = 1 << 0

# Notifications (fuse_out_header.error when unique is 0).
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3
NOTIFY_STORE = 4

# d_ino of listed entries: the inode number is known only once the name is looked up.
UNKNOWN_INO = 0xFFFFFFFF

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
IN_HEADER_SIZE = IN_HEADER.size  # 40
OUT_HEADER_SIZE = OUT_HEADER.size  # 16

_ATTR = "QQQQQQIIIIIIIIII"  # ino size blocks atime mtime ctime, *nsec, mode nlink uid gid rdev blksize flags
ATTR_SIZE = struct.calcsize("<" + _ATTR)  # 88
# Replies with the header in front, so that each is one pack.
ENTRY_REPLY = struct.Struct("<IiQ" + "QQQQII" + _ATTR)  # header, fuse_entry_out
ATTR_REPLY = struct.Struct("<IiQ" + "QII" + _ATTR)  # header, fuse_attr_out
OPEN_REPLY = struct.Struct("<IiQ" + "QII")  # header, fuse_open_out
CREATE_REPLY = struct.Struct("<IiQ" + "QQQQII" + _ATTR + "QII")  # header, entry_out, open_out
WRITE_REPLY = struct.Struct("<IiQ" + "II")  # header, fuse_write_out
STATFS_REPLY = struct.Struct("<IiQ" + "QQQQQIIII24x")  # header, fuse_kstatfs
INIT_REPLY = struct.Struct("<IiQ" + "IIIIHHIIHHI28x")  # header, fuse_init_out

INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags
FORGET_IN = struct.Struct("<Q")
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
GETATTR_IN = struct.Struct("<IIQ")
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
MKNOD_IN = struct.Struct("<IIII")
MKDIR_IN = struct.Struct("<II")
RENAME_IN = struct.Struct("<Q")
RENAME2_IN = struct.Struct("<QII")
LINK_IN = struct.Struct("<Q")
OPEN_IN = struct.Struct("<II")
CREATE_IN = struct.Struct("<IIII")
RELEASE_IN = struct.Struct("<QIIQ")
FLUSH_IN = struct.Struct("<QIIQ")
READ_IN = struct.Struct("<QQIIQII")
WRITE_IN = struct.Struct("<QQIIQII")
FSYNC_IN = struct.Struct("<QII")
DIRENT = struct.Struct("<QQII")
NOTIFY_INVAL_INODE_OUT = struct.Struct("<IiQ" + "Qqq")
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("<IiQ" + "QII")
NOTIFY_STORE_OUT = struct.Struct("<IiQ" + "QQII")  # header, nodeid offset size padding; data follows

WRITE_DATA = IN_HEADER_SIZE + WRITE_IN.size  # where a WRITE's data starts


def split_time(seconds: float) -> tuple[int, int]:
    """A cache timeout as the (seconds, nanoseconds) pair the kernel takes."""
    whole = int(seconds)
    return whole, int(round((seconds - whole) * 1e9))


_PADS = [b"\0" * i for i in range(8)]


def dirents(entries: Iterable[tuple[str, int, int]], size: int) -> bytes:
    """``fuse_dirent`` records (each padded to 8 bytes) of ``(name, kind, next offset)``
    entries, as many as fit in ``size`` bytes; the entries are taken one by one, so a listing
    produces only what fits (the next READDIR resumes at the last offset sent)."""
    parts: list[bytes] = []
    append = parts.append
    used = 0
    pack = DIRENT.pack
    for name, kind, offset in entries:
        raw = name.encode("utf-8", "surrogateescape")
        n = len(raw)
        length = (DIRENT.size + n + 7) & ~7
        if used + length > size:
            break
        append(pack(UNKNOWN_INO, offset, n, stat.S_IFMT(kind) >> 12))
        append(raw)
        append(_PADS[-n & 7])
        used += length
    return b"".join(parts)


def names(buf, start: int, end: int) -> list[bytes]:
    """The NUL-terminated names of a request from ``start`` to ``end``."""
    return bytes(buf[start:end]).split(b"\0")[:-1]

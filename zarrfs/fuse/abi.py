"""The FUSE kernel protocol: request codes, flags and the byte layouts of ``<linux/fuse.h>``.

A request is a ``fuse_in_header`` followed by the operation's arguments, a reply a
``fuse_out_header`` followed by its result, both little-endian C structs packed here with
:mod:`struct` (zarrfs speaks the protocol itself: :mod:`zarrfs.fuse.session`). :data:`OPCODES`
is the table of the requests zarrfs answers: each opcode's name, the size of the fixed input
struct after the header and how many NUL-terminated names follow it, which the session checks
before a request reaches its handler.

The layouts hold for every protocol version from :data:`MIN_MINOR` to :data:`MINOR` (the kernel
adapts to the minor given in the INIT reply): each struct read or written has had its size since
7.12 (the umask of CREATE and MKNOD) except INIT's: its reply is shorter below 7.23
(:data:`INIT_REPLY_22`), and from 7.36 its request carries a second word of flags
(:data:`INIT_IN_EXT`, when the kernel sets :data:`INIT_EXT`). Later additions reuse padding or
come with features zarrfs does not ask for. Nothing here does I/O.
"""

from __future__ import annotations

import stat
import struct
from collections.abc import Iterable
from typing import NamedTuple

from zarrfs.fs.api import name_bytes

MAJOR = 7
MINOR = 39  # the newest minor whose layouts zarrfs writes
MIN_MINOR = 12  # the oldest minor it serves: see the module's docstring
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
SETXATTR = 21
GETXATTR = 22
LISTXATTR = 23
REMOVEXATTR = 24
FLUSH = 25
GETLK = 31
SETLK = 32
SETLKW = 33
INIT = 26
OPENDIR = 27
READDIR = 28
RELEASEDIR = 29
FSYNCDIR = 30
CREATE = 35
INTERRUPT = 36
DESTROY = 38
BATCH_FORGET = 42
READDIRPLUS = 44
FALLOCATE = 43
RENAME2 = 45
LSEEK = 46

# INIT flags (fuse_init_in.flags / fuse_init_out.flags).
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
HANDLE_KILLPRIV_V2 = 1 << 28  # zarrfs clears set-id bits on write, truncate and chown (7.33)
INIT_EXT = 1 << 30  # the flags go on in fuse_init_in.flags2 / fuse_init_out.flags2 (7.36)
# 64-bit features: bit 32 on is flags2's bit 0.
DIRECT_IO_ALLOW_MMAP = 1 << 36  # a file opened with FOPEN_DIRECT_IO may be mmap()ed (7.39)
DIRECT_IO_ALLOW_MMAP_MINOR = 39
# What zarrfs asks for when the kernel offers it. Not AUTO_INVAL_DATA: the kernel would drop
# a file's pages whenever it sees a new mtime, also after writes through the mount, whose
# pages are right; the session decides at each open instead (FOPEN_KEEP_CACHE).
# DIRECT_IO_ALLOW_MMAP: a file read past the page cache (FOPEN_DIRECT_IO, see
# zarrfs.fs.pagecache) can still be mapped; without it mmap(MAP_SHARED) would fail (ENODEV).
# DO_READDIRPLUS: names come with their node IDs and attributes, so ls -l, du or find -size
# cost no lookup per name. Not READDIRPLUS_AUTO: the kernel would send plain READDIR after the
# first reply until a lookup in the folder, and du or find read a whole folder before their
# first stat (a lookup per name: 22 s instead of 3.7 s for 100,000 names, docs/performance.md).
# HANDLE_KILLPRIV_V2: without it the kernel asks GETXATTR security.capability before every
# write(2) (it may not remember "none" across writes), and clears set-id bits with a SETATTR of
# its own; with it, once a file until its attributes are read again, and the write, truncate,
# chown or open(O_TRUNC) of a caller without CAP_FSETID carries a flag (WRITE_KILL_SUIDGID,
# FATTR_KILL_SUIDGID, OPEN_KILL_SUIDGID) on which zarrfs clears them (Session._kill_suidgid).
# A write past the page cache (a new file's write-only descriptor, Session._create) is never
# preceded by that GETXATTR: there the daemon removes a capability too (XattrRequests).
WANTED = (
    ASYNC_READ
    | ATOMIC_O_TRUNC
    | BIG_WRITES
    | ASYNC_DIO
    | PARALLEL_DIROPS
    | MAX_PAGES
    | DIRECT_IO_ALLOW_MMAP
    | DO_READDIRPLUS
    | HANDLE_KILLPRIV_V2
)
# Asked for too when the mount checks permissions (default_permissions): the kernel enforces
# POSIX ACLs, which zarrfs keeps as xattrs (zarrfs.fs.acl), and leaves the umask to zarrfs
# (DONT_MASK: a folder's default ACL replaces it), which then comes in CREATE, MKNOD, MKDIR.
DONT_MASK = 1 << 6
POSIX_ACL = 1 << 20
ACL_FLAGS = POSIX_ACL | DONT_MASK
# Asked for too when the mount keeps locks in the database: the kernel then sends fcntl record
# locks (GETLK/SETLK/SETLKW) and flock (SETLK/SETLKW with LK_FLOCK) instead of keeping them.
POSIX_LOCKS = 1 << 1
FLOCK_LOCKS = 1 << 10
LOCKS = POSIX_LOCKS | FLOCK_LOCKS
LK_FLOCK = 1 << 0  # fuse_lk_in.lk_flags: a flock lock
RELEASE_FLOCK_UNLOCK = 1 << 1  # fuse_release_in.release_flags
F_RDLCK, F_WRLCK, F_UNLCK = 0, 1, 2  # fuse_file_lock.type: Linux's values

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
FATTR_KILL_SUIDGID = 1 << 11  # a truncate by a caller without CAP_FSETID, or a chown (7.33)
WRITE_KILL_SUIDGID = 1 << 2  # fuse_write_in.write_flags: a write by a caller without CAP_FSETID
OPEN_KILL_SUIDGID = 1 << 0  # fuse_open_in.open_flags: an open(O_TRUNC) by one without CAP_FSETID

GETATTR_FH = 1 << 0
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
# Linux >= 5.16 (protocol 7.35) sends no FLUSH at the close of such a file; older kernels
# ignore the bit and send it as before.
FOPEN_NOFLUSH = 1 << 5
FOPEN_CACHE_DIR = 1 << 3  # the kernel keeps the folder's listing (7.28); with KEEP_CACHE, across opens
FSYNC_FDATASYNC = 1 << 0

# Notifications (fuse_out_header.error when unique is 0).
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3
NOTIFY_STORE = 4

IN_HEADER = struct.Struct("<IIQQIIIHH")  # the fields of Header
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
OPEN_OUT = struct.Struct("<QII")  # fuse_open_out alone: a CREATE reply's last part
WRITE_REPLY = struct.Struct("<IiQ" + "II")  # header, fuse_write_out
STATFS_REPLY = struct.Struct("<IiQ" + "QQQQQIIII24x")  # header, fuse_kstatfs
INIT_REPLY = struct.Struct("<IiQ" + "IIIIHHIIHHI28x")  # header, fuse_init_out (7.23 on)
# Up to 7.22 the kernel takes only the first 24 bytes (FUSE_COMPAT_22_INIT_OUT_SIZE): major,
# minor, max_readahead, flags, max_background, congestion_threshold, max_write.
INIT_REPLY_22 = struct.Struct("<IiQ" + "IIIIHHI")
INIT_REPLY_MINOR = 23  # the first minor that takes INIT_REPLY

INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags (7.36 on: more after)
INIT_IN_EXT = struct.Struct("<IIIII")  # ... and flags2 (7.36 on, with INIT_EXT in flags)
INIT_VERSION = struct.Struct("<II")  # major, minor: all an INIT before 7.6 holds
INTERRUPT_IN = struct.Struct("<Q")
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
FALLOCATE_IN = struct.Struct("<QQQII")  # fh, offset, length, mode
LSEEK_IN = struct.Struct("<QQII")  # fh, offset, whence, padding
LSEEK_REPLY = struct.Struct("<IiQ" + "Q")  # header, fuse_lseek_out (offset)
SETXATTR_IN = struct.Struct("<II")  # value size, flags; then the name, its NUL, the value
GETXATTR_IN = struct.Struct("<II")  # size the caller takes (0: only ask it), padding
GETXATTR_OUT = struct.Struct("<IiQII")  # the reply header, then the size, padding
LK_IN = struct.Struct("<QQQQIIII")  # fh, owner, fuse_file_lock (start end type pid), lk_flags, padding
LK_REPLY = struct.Struct("<IiQ" + "QQII")  # header, fuse_lk_out (start end type pid)
DIRENT = struct.Struct("<QQII")
ENTRY_OUT = struct.Struct("<QQQQII" + _ATTR)  # fuse_entry_out alone: a READDIRPLUS entry's first part
# ENTRY_OUT in four parts, for a READDIRPLUS reply's names packed at once: the node ID, the
# generation and validity times (ENTRY_VALID, one copy a reply), the inode number, size and
# blocks, and the rest of the attributes (ATTR_TAIL: times, mode, owner...), bytes the names
# of a window stored with the same attributes share (a zarr client's chunks: all of them).
ENTRY_PARTS = struct.Struct("<Q32sQQQ64s")
ENTRY_VALID = struct.Struct("<QQQII")  # generation, entry_valid, attr_valid, their nsec
ATTR_TAIL = struct.Struct("<QQQIIIIIIIIII")  # atime mtime ctime, *nsec, mode nlink uid gid rdev blksize flags
# fuse_direntplus: a fuse_entry_out (nodeid generation entry_valid attr_valid *_nsec attr),
# then a fuse_dirent and its name, padded to 8 bytes.
DIRENTPLUS = struct.Struct("<QQQQII" + _ATTR + "QQII")
NOTIFY_INVAL_INODE_OUT = struct.Struct("<IiQ" + "Qqq")
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("<IiQ" + "QII")
NOTIFY_STORE_OUT = struct.Struct("<IiQ" + "QQII")  # header, nodeid offset size padding; data follows
NOTIFY_INVAL_MINOR = 12  # the minor that brought NOTIFY_INVAL_INODE and NOTIFY_INVAL_ENTRY
NOTIFY_STORE_MINOR = 15  # the minor that brought NOTIFY_STORE
NOTIFY_EXPIRE_MINOR = 38  # the minor that brought FUSE_EXPIRE_ONLY for NOTIFY_INVAL_ENTRY
EXPIRE_ONLY = 1 << 0  # NOTIFY_INVAL_ENTRY: the entry is looked up again, not dropped

WRITE_DATA = IN_HEADER_SIZE + WRITE_IN.size  # where a WRITE's data starts


class Header(NamedTuple):
    """``fuse_in_header``: what every request starts with. ``extlen`` counts 8-byte units of
    extensions after the arguments (7.38, only when the daemon asks for them: zarrfs never does)."""

    len: int
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    extlen: int
    padding: int


class Opcode(NamedTuple):
    """What a request of one type holds after its header: ``fixed`` bytes of its input struct,
    then ``names`` NUL-terminated names; ``answered`` is False for the requests the kernel
    wants no reply to."""

    name: str
    fixed: int = 0
    names: int = 0
    answered: bool = True


# The requests zarrfs serves (others get ENOSYS). Sizes are those of every minor from MIN_MINOR.
OPCODES: dict[int, Opcode] = {
    LOOKUP: Opcode("lookup", 0, 1),
    FORGET: Opcode("forget", FORGET_IN.size, answered=False),
    GETATTR: Opcode("getattr", GETATTR_IN.size),
    SETATTR: Opcode("setattr", SETATTR_IN.size),
    READLINK: Opcode("readlink"),
    SYMLINK: Opcode("symlink", 0, 2),  # the new name, then the target
    MKNOD: Opcode("mknod", MKNOD_IN.size, 1),
    MKDIR: Opcode("mkdir", MKDIR_IN.size, 1),
    UNLINK: Opcode("unlink", 0, 1),
    RMDIR: Opcode("rmdir", 0, 1),
    RENAME: Opcode("rename", RENAME_IN.size, 2),
    LINK: Opcode("link", LINK_IN.size, 1),
    OPEN: Opcode("open", OPEN_IN.size),
    READ: Opcode("read", READ_IN.size),
    WRITE: Opcode("write", WRITE_IN.size),  # and the data
    STATFS: Opcode("statfs"),
    RELEASE: Opcode("release", RELEASE_IN.size),
    FSYNC: Opcode("fsync", FSYNC_IN.size),
    FLUSH: Opcode("flush", FLUSH_IN.size),
    GETLK: Opcode("getlk", LK_IN.size),
    SETLK: Opcode("setlk", LK_IN.size),
    SETLKW: Opcode("setlkw", LK_IN.size),
    # Only the version is required: a kernel too old to be served hears so, not EINVAL.
    INIT: Opcode("init", INIT_VERSION.size),
    OPENDIR: Opcode("opendir", OPEN_IN.size),
    READDIR: Opcode("readdir", READ_IN.size),
    READDIRPLUS: Opcode("readdirplus", READ_IN.size),
    RELEASEDIR: Opcode("releasedir", RELEASE_IN.size),
    FSYNCDIR: Opcode("fsyncdir", FSYNC_IN.size),
    CREATE: Opcode("create", CREATE_IN.size, 1),
    INTERRUPT: Opcode("interrupt", INTERRUPT_IN.size, answered=False),
    DESTROY: Opcode("destroy"),
    BATCH_FORGET: Opcode("batch_forget", BATCH_FORGET_IN.size, answered=False),  # and the list
    RENAME2: Opcode("rename2", RENAME2_IN.size, 2),
    FALLOCATE: Opcode("fallocate", FALLOCATE_IN.size),
    LSEEK: Opcode("lseek", LSEEK_IN.size),  # the kernel sends only SEEK_DATA and SEEK_HOLE
    SETXATTR: Opcode("setxattr", SETXATTR_IN.size, 1),
    GETXATTR: Opcode("getxattr", GETXATTR_IN.size, 1),
    LISTXATTR: Opcode("listxattr", GETXATTR_IN.size),
    REMOVEXATTR: Opcode("removexattr", 0, 1),
}
# The kernel's names (fuse_kernel.h) of the requests zarrfs does not serve, for counts and logs.
UNSERVED_NAMES = {
    34: "access", 37: "bmap", 39: "ioctl", 40: "poll", 41: "notify_reply", 47: "copy_file_range",
    48: "setupmapping", 49: "removemapping", 50: "syncfs", 51: "tmpfile", 52: "statx",
    53: "copy_file_range_64",
}
assert not UNSERVED_NAMES.keys() & OPCODES.keys()
OPCODE_NAMES = {**UNSERVED_NAMES, **{code: op.name for code, op in OPCODES.items()}}
# Opcodes index lists of this length; larger ones (CUSE_INIT is 4096) share the last slot.
TABLE_SIZE = 64
assert max(OPCODES) < TABLE_SIZE


def min_length(op: Opcode) -> int:
    """The fewest bytes a request of type ``op`` can hold: the header, the input struct and
    one NUL for each name."""
    return IN_HEADER_SIZE + op.fixed + op.names


class Malformed(ValueError):
    """A request that does not hold what its opcode needs (the kernel never sends one)."""


#: The longest cache timeout handed to the kernel (its seconds field is 64 bits; the kernel
#: caps what it is given at its longest timer anyway): about 292 billion years.
LONGEST_TIMEOUT = 2**63 - 1


def split_time(seconds: float) -> tuple[int, int]:
    """A cache timeout as the (seconds, nanoseconds) pair the kernel takes; a longer one than
    :data:`LONGEST_TIMEOUT` is that."""
    if seconds >= LONGEST_TIMEOUT:
        return LONGEST_TIMEOUT, 0
    whole = int(seconds)
    return whole, int(round((seconds - whole) * 1e9))


#: ``fuse_dirent`` with its name, padded to 8 bytes, by the name's length: one pack an entry.
DIRENTS = [struct.Struct(DIRENT.format + f"{(n + 7) & ~7}s") for n in range(256)]


def dirent_of(n: int) -> struct.Struct:
    """:data:`DIRENTS` of a name of ``n`` bytes (made for a name longer than 255: a listing
    may hold one, written around the kernel)."""
    return DIRENTS[n] if n < 256 else struct.Struct(DIRENT.format + f"{(n + 7) & ~7}s")


def dirents(entries: Iterable[tuple[str, int, int, int]], size: int) -> bytes:
    """``fuse_dirent`` records (each padded to 8 bytes) of ``(name, kind, next offset, inode
    number)`` entries, as many as fit in ``size`` bytes; the entries are taken one by one, so a
    listing produces only what fits (the next READDIR resumes at the last offset sent)."""
    parts: list[bytes] = []
    append = parts.append
    used = 0
    for name, kind, offset, ino in entries:
        raw = name_bytes(name)
        n = len(raw)
        length = (DIRENT.size + n + 7) & ~7
        if used + length > size:
            break
        append((DIRENTS[n] if n < 256 else dirent_of(n)).pack(ino, offset, n, stat.S_IFMT(kind) >> 12, raw))
        used += length
    return b"".join(parts)


def name(buf, start: int, end: int) -> bytes:
    """The one NUL-terminated name that fills ``buf[start:end]`` (``start < end``), without its
    NUL; :class:`Malformed` unless it ends at ``end`` and holds no other NUL."""
    # The cheapest checks found: every LOOKUP passes here.
    if buf[end - 1]:
        raise Malformed("a name without its NUL")
    raw = bytes(buf[start : end - 1])
    if 0 in raw:
        raise Malformed("a NUL inside a name")
    return raw


def names(buf, start: int, end: int, count: int = 2) -> list[bytes]:
    """The ``count`` NUL-terminated names that fill ``buf[start:end]``, without their NULs;
    :class:`Malformed` unless there are exactly that many."""
    if start >= end or buf[end - 1] != 0:
        raise Malformed("names without their NUL")
    parts = bytes(buf[start : end - 1]).split(b"\0")
    if len(parts) != count:
        raise Malformed(f"{len(parts)} names where {count} belong")
    return parts


# Where the (first) name of a request about a name in a folder starts.
_NAMED = {
    LOOKUP: IN_HEADER_SIZE,
    UNLINK: IN_HEADER_SIZE,
    RMDIR: IN_HEADER_SIZE,
    SYMLINK: IN_HEADER_SIZE,
    MKNOD: IN_HEADER_SIZE + MKNOD_IN.size,
    MKDIR: IN_HEADER_SIZE + MKDIR_IN.size,
    CREATE: IN_HEADER_SIZE + CREATE_IN.size,
    RENAME: IN_HEADER_SIZE + RENAME_IN.size,
    RENAME2: IN_HEADER_SIZE + RENAME2_IN.size,
    LINK: IN_HEADER_SIZE + LINK_IN.size,
}


def request_name(opcode: int, buf, end: int) -> str | None:
    """The (first) name a request about a name in a folder carries (a lookup, a create, an
    unlink), for log lines; None for other requests, or a malformed one."""
    at = _NAMED.get(opcode)
    if at is None:
        return None
    try:
        two = opcode in (SYMLINK, RENAME, RENAME2)
        raw = names(buf, at, end)[0] if two else name(buf, at, end)
    except Exception:  # a malformed request: the folder is all there is to say
        return None
    return raw.decode("utf-8", "backslashreplace")

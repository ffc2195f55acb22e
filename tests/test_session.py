"""The FUSE protocol session without a mount: requests packed as the kernel packs them, handed
to :meth:`Session.handle`, replies read back from a pipe and unpacked with the structs of
``<linux/fuse.h>`` (7.31). Real LMDB databases in ``tmp_path``; no FUSE, no mocks."""

from __future__ import annotations

import errno
import os
import select
import stat
import struct
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from zarrfs.backends import open_driver
from zarrfs.daemon import MountOptions, make_hooks
from zarrfs.fs.api import Operations
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.namespace import DIR, FILE, RENAME_EXCHANGE, RENAME_NOREPLACE, Tree
from zarrfs.fuse import abi as k
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.session import MAX_WRITE, Session

UID, GID = 1000, 1000
ATTR_FIELDS = (
    "ino size blocks atime mtime ctime atimensec mtimensec ctimensec mode nlink uid gid rdev blksize flags"
).split()
ENTRY_FIELDS = "nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec".split()


# ---------------------------------------------------------------------- the wire
@dataclass
class Reply:
    """One message read back: the out header and what follows it."""

    raw: bytes

    @property
    def length(self) -> int:
        return k.OUT_HEADER.unpack_from(self.raw)[0]

    @property
    def error(self) -> int:
        """The errno (positive) of an error reply, 0 for success."""
        return -k.OUT_HEADER.unpack_from(self.raw)[1]

    @property
    def unique(self) -> int:
        return k.OUT_HEADER.unpack_from(self.raw)[2]

    @property
    def body(self) -> bytes:
        return self.raw[k.OUT_HEADER_SIZE :]


def _attr(values) -> SimpleNamespace:
    return SimpleNamespace(**dict(zip(ATTR_FIELDS, values, strict=True)))


def entry_of(reply: Reply) -> SimpleNamespace:
    """A fuse_entry_out reply (its size checked by the unpack)."""
    v = k.ENTRY_REPLY.unpack(reply.raw)
    e = SimpleNamespace(**dict(zip(ENTRY_FIELDS, v[3:9], strict=True)))
    e.attr = _attr(v[9:])
    return e


def attr_of(reply: Reply) -> SimpleNamespace:
    """A fuse_attr_out reply."""
    v = k.ATTR_REPLY.unpack(reply.raw)
    a = _attr(v[6:])
    a.attr_valid, a.attr_valid_nsec = v[3], v[4]
    return a


def dirents_of(reply: Reply) -> list[tuple[bytes, int, int, int]]:
    """(name, d_type, next offset, ino) of each fuse_dirent in a READDIR reply; checks the
    8-byte padding of each record."""
    out, at, data = [], 0, reply.body
    while at < len(data):
        ino, off, namelen, dtype = k.DIRENT.unpack_from(data, at)
        name = data[at + k.DIRENT.size : at + k.DIRENT.size + namelen]
        out.append((name, dtype, off, ino))
        at += (k.DIRENT.size + namelen + 7) // 8 * 8
    assert at == len(data), "the last record is padded to 8 bytes"
    return out


def z(name: str) -> bytes:
    return name.encode() + b"\0"


class Wire:
    """A Session writing to a pipe; requests are packed like the kernel's and handed over in a
    buffer longer than the request (as the loop's is), its tail not NUL, so a request must be
    read up to its header's length and no further."""

    def __init__(self, ops: Operations, **kwargs) -> None:
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        self.session = Session(ops, self.wfd, **kwargs)
        self.ops = ops
        self._unique = 100

    def close(self) -> None:
        self.session.close()
        os.close(self.rfd)
        os.close(self.wfd)

    @property
    def inodes(self) -> InodeTable:
        return self.session.inodes

    def send(self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"") -> int:
        """Hand one request to the session; its unique ID."""
        self._unique += 2
        length = k.IN_HEADER_SIZE + len(body)
        head = k.IN_HEADER.pack(length, opcode, self._unique, nodeid, UID, GID, os.getpid(), 0, 0)
        self.session.handle(memoryview(bytearray(head + body + b"\xff" * 64)))
        return self._unique

    def messages(self, wait: float = 0.0, count: int = 0) -> list[Reply]:
        """Every message now in the pipe (waiting up to ``wait`` s for ``count`` of them)."""
        data = b""
        deadline = time.monotonic() + wait
        while True:
            try:
                chunk = os.read(self.rfd, 1 << 16)
            except BlockingIOError:
                chunk = b""
            data += chunk
            if chunk:
                continue
            if _count(data) >= count or time.monotonic() >= deadline:
                break
            select.select([self.rfd], [], [], max(0.0, deadline - time.monotonic()))
        out = []
        while data:
            length = k.OUT_HEADER.unpack_from(data)[0]
            assert length >= k.OUT_HEADER_SIZE and length <= len(data), "a reply's length is its size"
            out.append(Reply(data[:length]))
            data = data[length:]
        return out

    def call(self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"") -> Reply:
        """One request and its one reply (matched by unique ID)."""
        unique = self.send(opcode, nodeid, body)
        replies = self.messages()
        assert len(replies) == 1, replies
        assert replies[0].unique == unique
        assert replies[0].length == len(replies[0].raw)
        return replies[0]

    def ok(self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"") -> Reply:
        reply = self.call(opcode, nodeid, body)
        assert reply.error == 0, (k.OPCODE_NAMES.get(opcode), errno.errorcode.get(reply.error))
        return reply

    def fails(self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"") -> int:
        reply = self.call(opcode, nodeid, body)
        assert reply.raw == reply.raw[: k.OUT_HEADER_SIZE], "an error reply is the header alone"
        return reply.error

    # -------------------------------------------------------------- requests
    def init(self, major: int = 7, minor: int = 31, readahead: int = 128 << 10, flags: int = 0) -> Reply:
        return self.call(k.INIT, 0, k.INIT_IN.pack(major, minor, readahead, flags))

    def lookup(self, parent: int, name: str) -> SimpleNamespace:
        return entry_of(self.ok(k.LOOKUP, parent, z(name)))

    def getattr(self, nodeid: int) -> SimpleNamespace:
        return attr_of(self.ok(k.GETATTR, nodeid, k.GETATTR_IN.pack(0, 0, 0)))

    def mkdir(self, parent: int, name: str, mode: int = 0o755) -> SimpleNamespace:
        return entry_of(self.ok(k.MKDIR, parent, k.MKDIR_IN.pack(mode, 0o022) + z(name)))

    def create(self, parent: int, name: str, mode: int = 0o644) -> tuple[SimpleNamespace, int]:
        """CREATE: the entry and the file handle of the open_out that follows it."""
        flags = os.O_WRONLY | os.O_CREAT
        reply = self.ok(k.CREATE, parent, k.CREATE_IN.pack(flags, mode, 0o022, 0) + z(name))
        v = k.CREATE_REPLY.unpack(reply.raw)
        fh, open_flags, _ = v[-3:]
        assert open_flags == 0
        return entry_of(Reply(reply.raw[: k.ENTRY_REPLY.size])), fh

    def open(self, nodeid: int, flags: int = os.O_RDONLY) -> tuple[int, int]:
        reply = self.ok(k.OPEN, nodeid, k.OPEN_IN.pack(flags, 0))
        fh, open_flags, _ = k.OPEN_REPLY.unpack(reply.raw)[3:]
        return fh, open_flags

    def write(self, nodeid: int, fh: int, data: bytes, offset: int = 0) -> int:
        reply = self.ok(k.WRITE, nodeid, k.WRITE_IN.pack(fh, offset, len(data), 0, 0, 0, 0) + data)
        return k.WRITE_REPLY.unpack(reply.raw)[3]

    def read(self, nodeid: int, fh: int, size: int = 4096, offset: int = 0) -> bytes:
        return self.ok(k.READ, nodeid, k.READ_IN.pack(fh, offset, size, 0, 0, 0, 0)).body

    def flush(self, nodeid: int, fh: int) -> None:
        assert self.ok(k.FLUSH, nodeid, k.FLUSH_IN.pack(fh, 0, 0, 0)).body == b""

    def release(self, nodeid: int, fh: int) -> None:
        assert self.ok(k.RELEASE, nodeid, k.RELEASE_IN.pack(fh, os.O_WRONLY, 0, 0)).body == b""

    def put_file(self, parent: int, name: str, data: bytes, mode: int = 0o644) -> SimpleNamespace:
        """create + write + flush + release, as ``open(O_CREAT); write; close`` does."""
        entry, fh = self.create(parent, name, mode)
        assert self.write(entry.nodeid, fh, data) == len(data)
        self.flush(entry.nodeid, fh)
        self.release(entry.nodeid, fh)
        return entry

    def setattr(self, nodeid: int, valid: int, **fields: int) -> SimpleNamespace:
        f = {"fh": 0, "size": 0, "atime": 0, "mtime": 0, "atimens": 0, "mtimens": 0, "mode": 0} | fields
        body = k.SETATTR_IN.pack(
            valid, 0, f["fh"], f["size"], 0, f["atime"], f["mtime"], 0,
            f["atimens"], f["mtimens"], 0, f["mode"], 0, 0, 0, 0,
        )  # fmt: skip
        return attr_of(self.ok(k.SETATTR, nodeid, body))

    def rename(self, parent: int, old: str, newdir: int, new: str, flags: int | None = None) -> Reply:
        if flags is None:
            return self.call(k.RENAME, parent, k.RENAME_IN.pack(newdir) + z(old) + z(new))
        return self.call(k.RENAME2, parent, k.RENAME2_IN.pack(newdir, flags, 0) + z(old) + z(new))

    def readdir(self, nodeid: int, fh: int, offset: int, size: int = 4096) -> Reply:
        return self.ok(k.READDIR, nodeid, k.READ_IN.pack(fh, offset, size, 0, 0, 0, 0))


def _count(data: bytes) -> int:
    n = 0
    while len(data) >= k.OUT_HEADER_SIZE:
        length = k.OUT_HEADER.unpack_from(data)[0]
        if length > len(data):
            break
        n += 1
        data = data[length:]
    return n


@pytest.fixture
def make_ops(tmp_path):
    """Operations over a fresh LMDB database (format hooks when asked)."""
    drivers = []

    def make(hooks=None) -> Operations:
        driver = open_driver(f"lmdb://{tmp_path}/db{len(drivers)}.lmdb")
        drivers.append(driver)
        tree = Tree(driver, uid=UID, gid=GID, hooks=hooks)
        return Operations(tree, HandleTable(tree))

    yield make
    for d in drivers:
        d.close()


@pytest.fixture
def make_wire(make_ops):
    """A Wire (timeouts as given) over its own database; all closed at the end."""
    wires = []

    def make(ops: Operations | None = None, **kwargs) -> Wire:
        wire = Wire(ops or make_ops(), **kwargs)
        wires.append(wire)
        return wire

    yield make
    for w in wires:
        w.close()


@pytest.fixture
def wire(make_wire) -> Wire:
    return make_wire()


# ---------------------------------------------------------------------- layouts
def test_struct_sizes_match_fuse_h_7_31():
    """The sizes the kernel checks a reply's length against (a wrong one is EINVAL there)."""
    assert (k.IN_HEADER_SIZE, k.OUT_HEADER_SIZE) == (40, 16)
    assert k.ATTR_SIZE == 88  # fuse_attr
    assert k.ENTRY_REPLY.size == 16 + 128  # fuse_entry_out
    assert k.ATTR_REPLY.size == 16 + 104  # fuse_attr_out
    assert k.OPEN_REPLY.size == 16 + 16  # fuse_open_out
    assert k.CREATE_REPLY.size == 16 + 128 + 16
    assert k.WRITE_REPLY.size == 16 + 8  # fuse_write_out
    assert k.STATFS_REPLY.size == 16 + 80  # fuse_statfs_out = fuse_kstatfs
    assert k.INIT_REPLY.size == 16 + 64  # fuse_init_out
    sizes = {
        k.INIT_IN: 16,
        k.WRITE_IN: 40,
        k.READ_IN: 40,
        k.SETATTR_IN: 88,
        k.GETATTR_IN: 16,
        k.CREATE_IN: 16,
        k.MKNOD_IN: 16,
        k.MKDIR_IN: 8,
        k.RENAME_IN: 8,
        k.RENAME2_IN: 16,
        k.RELEASE_IN: 24,
        k.FLUSH_IN: 24,
        k.FSYNC_IN: 16,
        k.FORGET_IN: 8,
        k.BATCH_FORGET_IN: 8,
        k.FORGET_ONE: 16,
        k.DIRENT: 24,
        k.NOTIFY_INVAL_INODE_OUT: 16 + 24,
        k.NOTIFY_INVAL_ENTRY_OUT: 16 + 16,
        k.NOTIFY_STORE_OUT: 16 + 24,
    }
    assert {s.format: s.size for s in sizes} == {s.format: n for s, n in sizes.items()}
    assert k.WRITE_DATA == 80
    # The offsets inside fuse_entry_out: attr at 40, its mode at 40 + 60.
    packed = k.ENTRY_REPLY.pack(144, 0, 7, *range(1, 7), *range(100, 116))
    assert struct.unpack_from("<Q", packed, 16)[0] == 1  # nodeid
    assert struct.unpack_from("<Q", packed, 16 + 40)[0] == 100  # attr.ino
    assert struct.unpack_from("<I", packed, 16 + 40 + 60)[0] == 109  # attr.mode


def test_opcodes_and_flags_are_the_kernels():
    assert (k.LOOKUP, k.FORGET, k.GETATTR, k.SETATTR) == (1, 2, 3, 4)
    assert (k.MKDIR, k.UNLINK, k.RMDIR, k.RENAME, k.LINK) == (9, 10, 11, 12, 13)
    assert (k.OPEN, k.READ, k.WRITE, k.STATFS, k.RELEASE, k.FLUSH, k.INIT) == (14, 15, 16, 17, 18, 25, 26)
    assert (k.OPENDIR, k.READDIR, k.RELEASEDIR, k.CREATE, k.INTERRUPT) == (27, 28, 29, 35, 36)
    assert (k.DESTROY, k.BATCH_FORGET, k.RENAME2) == (38, 42, 45)
    assert k.OPCODE_NAMES[k.BATCH_FORGET] == "batch_forget" and k.ROOT_ID not in k.OPCODE_NAMES.values()
    assert (k.FATTR_MODE, k.FATTR_SIZE, k.FATTR_MTIME, k.FATTR_FH, k.FATTR_MTIME_NOW) == (1, 8, 32, 64, 256)
    assert (k.FOPEN_KEEP_CACHE, k.FOPEN_NOFLUSH) == (2, 32)
    # Not AUTO_INVAL_DATA (1 << 12): pages written through the mount stay valid after a commit.
    assert k.WANTED == (1 << 0) | (1 << 3) | (1 << 5) | (1 << 15) | (1 << 18) | (1 << 22)


def test_dirent_records_pad_to_eight_bytes():
    for name, total in ((b"a", 32), (b"abcdefgh", 32), (b"abcdefghi", 40), (b"", 24)):
        record = k.dirents([(name.decode(), FILE, 5)], 4096)
        assert len(record) == total
        assert k.DIRENT.unpack_from(record) == (k.UNKNOWN_INO, 5, len(name), 8)
        assert record[24 : 24 + len(name)] == name and set(record[24 + len(name) :]) <= {0}
    assert k.DIRENT.unpack_from(k.dirents([("d", DIR, 1)], 4096))[3] == 4  # DT_DIR
    assert k.DIRENT.unpack_from(k.dirents([("l", stat.S_IFLNK, 1)], 4096))[3] == 10  # DT_LNK


def test_names_split_nul_terminated_names():
    buf = memoryview(b"HEAD" + b"old\0new name\0" + b"garbage")
    assert k.names(buf, 4, 4 + 13) == [b"old", b"new name"]
    assert k.names(buf, 4, 8) == [b"old"]
    assert k.split_time(2.5) == (2, 500_000_000) and k.split_time(0) == (0, 0)


# ---------------------------------------------------------------------- INIT
def test_init_answers_with_our_version_and_the_wanted_flags(make_wire):
    calls = []
    wire = make_wire(on_init=lambda: calls.append(1))
    offered = (1 << 32) - 1 & ~k.ATOMIC_O_TRUNC  # everything but one wanted flag
    reply = wire.init(7, 36, 256 << 10, offered)
    assert reply.error == 0
    v = k.INIT_REPLY.unpack(reply.raw)
    major, minor, readahead, flags, _, _, max_write, time_gran, max_pages = v[3:12]
    assert (major, minor) == (7, k.MINOR)
    assert flags == offered & k.WANTED and not flags & k.ATOMIC_O_TRUNC and flags & k.MAX_PAGES
    assert (readahead, max_write, time_gran, max_pages) == (256 << 10, MAX_WRITE, 1, MAX_WRITE // 4096)
    assert calls == [1] and wire.session.initialized
    wire.init()  # a second INIT is answered; the callback stays a one-off
    assert calls == [1]
    assert wire.ok(k.DESTROY, 0).body == b""


def test_init_refuses_an_older_major_version(make_wire):
    calls = []
    wire = make_wire(on_init=lambda: calls.append(1))
    reply = wire.init(6, 9)
    assert reply.error == errno.EPROTO and len(reply.raw) == k.OUT_HEADER_SIZE
    assert calls == [] and not wire.session.initialized


# ---------------------------------------------------------------------- names and attributes
def test_lookup_counts_and_forget_drops_the_node(make_wire):
    wire = make_wire(entry_timeout=2.5, attr_timeout=0.75)
    wire.put_file(k.ROOT_ID, "f", b"0123456789", mode=0o640)
    wire.send(k.FORGET, wire.inodes.ids["f"], k.FORGET_IN.pack(1))  # the CREATE's count
    assert "f" not in wire.inodes.ids

    first = wire.lookup(k.ROOT_ID, "f")
    assert first.nodeid > k.ROOT_ID and first.generation == 0
    assert (first.entry_valid, first.entry_valid_nsec) == (2, 500_000_000)
    assert (first.attr_valid, first.attr_valid_nsec) == (0, 750_000_000)
    a = first.attr
    assert (a.ino, a.size, a.mode, a.nlink, a.uid, a.gid) == (first.nodeid, 10, FILE | 0o640, 1, UID, GID)
    assert a.blocks == 1 and a.blksize == 1 << 20
    second = wire.lookup(k.ROOT_ID, "f")
    assert second.nodeid == first.nodeid
    assert wire.inodes.get(first.nodeid).lookups == 2

    wire.send(k.FORGET, first.nodeid, k.FORGET_IN.pack(1))
    assert wire.messages() == []  # FORGET is never answered
    assert wire.inodes.get(first.nodeid).lookups == 1
    assert wire.lookup(k.ROOT_ID, "f").nodeid == first.nodeid
    other = wire.mkdir(k.ROOT_ID, "d")
    batch = (
        k.BATCH_FORGET_IN.pack(2, 0) + k.FORGET_ONE.pack(first.nodeid, 2) + k.FORGET_ONE.pack(other.nodeid, 1)
    )
    wire.send(k.BATCH_FORGET, 0, batch)
    assert wire.messages() == []
    assert wire.inodes.get(first.nodeid) is None and wire.inodes.get(other.nodeid) is None
    assert "f" not in wire.inodes.ids and "d" not in wire.inodes.ids
    assert wire.fails(k.GETATTR, first.nodeid, k.GETATTR_IN.pack(0, 0, 0)) == errno.ENOENT

    again = wire.lookup(k.ROOT_ID, "f")  # node IDs are never reused
    assert again.nodeid > other.nodeid > first.nodeid
    assert wire.inodes.get(again.nodeid).lookups == 1


def test_forget_never_drops_the_root(wire):
    wire.send(k.FORGET, k.ROOT_ID, k.FORGET_IN.pack(5))
    assert wire.messages() == []
    assert wire.getattr(k.ROOT_ID).mode == DIR | 0o755


def test_lookup_of_a_missing_name_is_a_negative_entry(make_wire):
    """With a negative timeout the kernel caches "no such file": node ID 0, entry_valid set."""
    wire = make_wire(negative_timeout=3.25)
    e = wire.lookup(k.ROOT_ID, "missing")
    assert (e.nodeid, e.entry_valid, e.entry_valid_nsec) == (0, 3, 250_000_000)
    assert (e.attr_valid, e.attr_valid_nsec) == (0, 0)
    assert vars(e.attr) == dict.fromkeys(ATTR_FIELDS, 0)
    assert "missing" not in wire.inodes.ids and len(wire.inodes) == 1


def test_lookup_of_a_missing_name_without_negative_caching_is_enoent(make_wire):
    wire = make_wire(negative_timeout=0)
    assert wire.fails(k.LOOKUP, k.ROOT_ID, z("missing")) == errno.ENOENT
    wire.mkdir(k.ROOT_ID, "d")
    d = wire.lookup(k.ROOT_ID, "d")
    assert wire.fails(k.LOOKUP, d.nodeid, z("missing")) == errno.ENOENT


def test_getattr_of_the_root_and_of_an_unknown_node(make_wire):
    wire = make_wire(attr_timeout=4)
    root = wire.getattr(k.ROOT_ID)
    assert stat.S_ISDIR(root.mode) and root.ino == k.ROOT_ID
    assert (root.attr_valid, root.attr_valid_nsec, root.uid, root.gid) == (4, 0, UID, GID)
    assert wire.fails(k.GETATTR, 12345, k.GETATTR_IN.pack(0, 0, 0)) == errno.ENOENT


# ---------------------------------------------------------------------- namespace and data
def test_create_write_read_unlink(wire):
    d = wire.mkdir(k.ROOT_ID, "d", 0o750)
    assert d.nodeid > k.ROOT_ID and d.attr.mode == DIR | 0o750 and wire.inodes.key(d.nodeid) == "d"
    entry, fh = wire.create(d.nodeid, "f.bin", 0o600)
    assert fh > 0 and entry.nodeid not in (0, k.ROOT_ID, d.nodeid)
    assert (entry.attr.mode, entry.attr.size) == (FILE | 0o600, 0)
    assert wire.inodes.key(entry.nodeid) == "d/f.bin"
    assert wire.write(entry.nodeid, fh, b"hello ") == 6
    assert wire.write(entry.nodeid, fh, b"world", offset=6) == 5
    assert wire.getattr(entry.nodeid).size == 11  # pending writes show
    wire.flush(entry.nodeid, fh)
    wire.release(entry.nodeid, fh)
    assert wire.ops.tree.driver.get("d/f.bin") == b"hello world"

    fh, _ = wire.open(entry.nodeid)
    assert wire.read(entry.nodeid, fh) == b"hello world"
    assert wire.read(entry.nodeid, fh, size=4, offset=6) == b"worl"
    wire.release(entry.nodeid, fh)

    assert wire.ok(k.UNLINK, d.nodeid, z("f.bin")).body == b""
    assert wire.inodes.key(entry.nodeid) is None  # detached; the kernel may still hold it
    assert wire.lookup(d.nodeid, "f.bin").nodeid == 0
    assert wire.ops.tree.driver.get("d/f.bin") is None


def test_rmdir_refuses_a_folder_with_files(wire):
    d = wire.mkdir(k.ROOT_ID, "d")
    wire.put_file(d.nodeid, "f", b"x")
    assert wire.fails(k.RMDIR, k.ROOT_ID, z("d")) == errno.ENOTEMPTY
    assert wire.lookup(k.ROOT_ID, "d").nodeid == d.nodeid
    wire.ok(k.UNLINK, d.nodeid, z("f"))
    wire.ok(k.RMDIR, k.ROOT_ID, z("d"))
    assert wire.inodes.key(d.nodeid) is None and wire.lookup(k.ROOT_ID, "d").nodeid == 0


def test_rename_of_a_folder_moves_the_node_ids_below_it(wire):
    a = wire.mkdir(k.ROOT_ID, "a")
    b = wire.mkdir(a.nodeid, "b")
    f = wire.put_file(b.nodeid, "f", b"abc")
    dest = wire.mkdir(k.ROOT_ID, "dest")
    assert wire.rename(k.ROOT_ID, "a", dest.nodeid, "moved").error == 0
    moved = [wire.inodes.key(n) for n in (a.nodeid, b.nodeid, f.nodeid)]
    assert moved == ["dest/moved", "dest/moved/b", "dest/moved/b/f"]
    assert not any(key == "a" or key.startswith("a/") for key in wire.inodes.ids)
    assert wire.getattr(f.nodeid).size == 3  # the old node ID still answers, at the new key
    again = wire.lookup(b.nodeid, "f")
    assert again.nodeid == f.nodeid and wire.inodes.get(f.nodeid).lookups == 2
    assert wire.lookup(k.ROOT_ID, "a").nodeid == 0
    assert wire.ops.tree.driver.get("dest/moved/b/f") == b"abc"


def test_rename_onto_a_file_replaces_and_detaches_it(wire):
    x = wire.put_file(k.ROOT_ID, "x", b"new")
    y = wire.put_file(k.ROOT_ID, "y", b"old!")
    assert wire.rename(k.ROOT_ID, "x", k.ROOT_ID, "y").error == 0
    assert wire.inodes.key(x.nodeid) == "y" and wire.inodes.key(y.nodeid) is None
    assert wire.lookup(k.ROOT_ID, "y").nodeid == x.nodeid
    assert wire.getattr(x.nodeid).size == 3


def test_rename2_noreplace_and_exchange(wire):
    x = wire.put_file(k.ROOT_ID, "x", b"xx")
    y = wire.put_file(k.ROOT_ID, "y", b"yyy")
    assert wire.rename(k.ROOT_ID, "x", k.ROOT_ID, "y", RENAME_NOREPLACE).error == errno.EEXIST
    assert (wire.inodes.key(x.nodeid), wire.inodes.key(y.nodeid)) == ("x", "y")
    assert wire.ops.tree.driver.get("y") == b"yyy"

    assert wire.rename(k.ROOT_ID, "x", k.ROOT_ID, "y", RENAME_EXCHANGE).error == 0
    assert (wire.inodes.key(x.nodeid), wire.inodes.key(y.nodeid)) == ("y", "x")
    assert (wire.ops.tree.driver.get("x"), wire.ops.tree.driver.get("y")) == (b"yyy", b"xx")
    assert wire.lookup(k.ROOT_ID, "x").attr.size == 3 and wire.lookup(k.ROOT_ID, "x").nodeid == y.nodeid

    assert wire.rename(k.ROOT_ID, "x", k.ROOT_ID, "z", RENAME_NOREPLACE).error == 0
    assert wire.inodes.key(y.nodeid) == "z"


def test_symlink_link_mknod_and_fsync(wire):
    d = wire.mkdir(k.ROOT_ID, "d")
    ln = entry_of(wire.ok(k.SYMLINK, d.nodeid, z("ln") + z("../target")))  # the name first, then the target
    assert (ln.attr.mode, ln.attr.size) == (stat.S_IFLNK | 0o777, 9)
    assert wire.ok(k.READLINK, ln.nodeid).body == b"../target"
    f = wire.put_file(d.nodeid, "f", b"abc")
    copy = entry_of(wire.ok(k.LINK, d.nodeid, k.LINK_IN.pack(f.nodeid) + z("f2")))
    assert copy.nodeid not in (0, f.nodeid) and copy.attr.size == 3  # a copy: its own node
    assert wire.ops.tree.driver.get("d/f2") == b"abc"
    assert wire.fails(k.LINK, d.nodeid, k.LINK_IN.pack(f.nodeid) + z("f2")) == errno.EEXIST
    node = entry_of(wire.ok(k.MKNOD, d.nodeid, k.MKNOD_IN.pack(FILE | 0o600, 0, 0o022, 0) + z("node")))
    assert node.attr.mode == FILE | 0o600 and wire.ops.tree.driver.get("d/node") == b""
    entry, fh = wire.create(d.nodeid, "synced")
    wire.write(entry.nodeid, fh, b"now")
    assert wire.ops.tree.driver.get("d/synced") is None  # not stored before a flush or fsync
    assert wire.ok(k.FSYNC, entry.nodeid, k.FSYNC_IN.pack(fh, k.FSYNC_FDATASYNC, 0)).body == b""
    assert wire.ops.tree.driver.get("d/synced") == b"now"
    assert wire.ok(k.FSYNCDIR, d.nodeid, k.FSYNC_IN.pack(0, 0, 0)).body == b""
    wire.release(entry.nodeid, fh)


def test_exchange_keeps_the_writes_of_a_file_open_at_the_destination(wire):
    """After renameat2(RENAME_EXCHANGE) an open descriptor still names the same file, now under
    the other name: what it writes must be stored there."""
    a = wire.put_file(k.ROOT_ID, "a", b"AAAA")
    b = wire.put_file(k.ROOT_ID, "b", b"BB")
    fh, _ = wire.open(b.nodeid, os.O_RDWR)
    assert wire.rename(k.ROOT_ID, "a", k.ROOT_ID, "b", RENAME_EXCHANGE).error == 0
    assert (wire.inodes.key(a.nodeid), wire.inodes.key(b.nodeid)) == ("b", "a")
    assert wire.write(b.nodeid, fh, b"bb!") == 3
    wire.flush(b.nodeid, fh)  # answers success
    wire.release(b.nodeid, fh)
    assert wire.ops.tree.driver.get("b") == b"AAAA"
    assert wire.ops.tree.driver.get("a") == b"bb!"


def test_exchange_of_folders_moves_the_open_files_of_the_destination(wire):
    p = wire.mkdir(k.ROOT_ID, "p")
    q = wire.mkdir(k.ROOT_ID, "q")
    wire.put_file(p.nodeid, "f", b"in p")
    g = wire.put_file(q.nodeid, "g", b"in q")
    fh, _ = wire.open(g.nodeid, os.O_RDWR)
    assert wire.rename(k.ROOT_ID, "p", k.ROOT_ID, "q", RENAME_EXCHANGE).error == 0
    assert wire.inodes.key(g.nodeid) == "p/g"
    wire.write(g.nodeid, fh, b"IN Q")
    wire.flush(g.nodeid, fh)
    wire.release(g.nodeid, fh)
    driver = wire.ops.tree.driver
    assert (driver.get("p/g"), driver.get("q/f")) == (b"IN Q", b"in p")
    assert driver.get("q/g") is None


# ---------------------------------------------------------------------- SETATTR
def test_setattr_mode_size_and_times(wire):
    f = wire.put_file(k.ROOT_ID, "f", b"0123456789")
    n = f.nodeid
    assert wire.setattr(n, k.FATTR_MODE, mode=FILE | 0o604).mode == FILE | 0o604
    a = wire.setattr(n, k.FATTR_SIZE, size=4)
    assert (a.size, a.ino) == (4, n)
    assert wire.ops.tree.driver.get("f") == b"0123"
    a = wire.setattr(
        n,
        k.FATTR_MTIME | k.FATTR_ATIME,
        mtime=1_600_000_000,
        mtimens=123_456_789,
        atime=1_500_000_000,
        atimens=7,
    )
    assert (a.mtime, a.mtimensec, a.atime, a.atimensec) == (1_600_000_000, 123_456_789, 1_500_000_000, 7)
    assert wire.getattr(n).mtimensec == 123_456_789  # stored, not only answered
    before = time.time_ns()
    a = wire.setattr(n, k.FATTR_MTIME | k.FATTR_MTIME_NOW, mtime=5, mtimens=5)  # the given time is ignored
    after = time.time_ns()
    assert before <= a.mtime * 1_000_000_000 + a.mtimensec <= after
    assert (a.atime, a.atimensec) == (1_500_000_000, 7)  # untouched
    assert wire.getattr(n).mode == FILE | 0o604


def test_setattr_through_an_open_handle_of_an_unlinked_file(wire):
    """ftruncate on a file whose name is gone: the kernel names it by handle (FATTR_FH)."""
    f = wire.put_file(k.ROOT_ID, "f", b"0123456789")
    fh, _ = wire.open(f.nodeid, os.O_RDWR)
    wire.ok(k.UNLINK, k.ROOT_ID, z("f"))
    a = wire.setattr(f.nodeid, k.FATTR_SIZE | k.FATTR_FH, fh=fh, size=2)
    assert a.size == 2
    assert wire.read(f.nodeid, fh) == b"01"
    assert wire.fails(k.GETATTR, f.nodeid, k.GETATTR_IN.pack(0, 0, 0)) == errno.ENOENT
    a = attr_of(wire.ok(k.GETATTR, f.nodeid, k.GETATTR_IN.pack(k.GETATTR_FH, 0, fh)))
    assert a.size == 2
    wire.release(f.nodeid, fh)
    assert wire.ops.tree.driver.get("f") is None


# ---------------------------------------------------------------------- READDIR
def test_readdir_lists_dirents_with_types_and_offsets(wire):
    d = wire.mkdir(k.ROOT_ID, "d")
    wire.mkdir(d.nodeid, "sub")
    wire.put_file(d.nodeid, "file", b"1")
    fh = k.OPEN_REPLY.unpack(wire.ok(k.OPENDIR, d.nodeid, k.OPEN_IN.pack(0, 0)).raw)[3]
    got = dirents_of(wire.readdir(d.nodeid, fh, 0))
    assert [(n, t, o) for n, t, o, _ in got] == [(b".", 4, 1), (b"..", 4, 2), (b"file", 8, 3), (b"sub", 4, 4)]
    assert {ino for *_, ino in got} == {k.UNKNOWN_INO}
    assert [n for n, *_ in dirents_of(wire.readdir(d.nodeid, fh, 3))] == [b"sub"]
    assert wire.readdir(d.nodeid, fh, 4).body == b""  # the end
    # A file created and not stored yet is listed too (after the stored names).
    entry, new_fh = wire.create(d.nodeid, "a-new")
    assert wire.ops.tree.driver.get("d/a-new") is None
    fh2 = k.OPEN_REPLY.unpack(wire.ok(k.OPENDIR, d.nodeid, k.OPEN_IN.pack(0, 0)).raw)[3]
    listed = [(n, t, o) for n, t, o, _ in dirents_of(wire.readdir(d.nodeid, fh2, 2))]
    assert listed == [(b"file", 8, 3), (b"sub", 4, 4), (b"a-new", 8, 5)]
    wire.ok(k.RELEASEDIR, d.nodeid, k.RELEASE_IN.pack(fh2, 0, 0, 0))
    wire.release(entry.nodeid, new_fh)
    assert wire.ok(k.RELEASEDIR, d.nodeid, k.RELEASE_IN.pack(fh, 0, 0, 0)).body == b""
    assert wire.fails(k.READDIR, d.nodeid, k.READ_IN.pack(fh, 0, 4096, 0, 0, 0, 0)) == errno.EBADF
    f = wire.lookup(d.nodeid, "file")
    assert wire.fails(k.OPENDIR, f.nodeid, k.OPEN_IN.pack(0, 0)) == errno.ENOTDIR


def test_readdir_in_small_replies_resumes_without_gaps_or_duplicates(wire):
    """A reply holds only the records that fit in ``size``; the next READDIR starts at the
    offset of the last record kept (the kernel's way), over listing batches of the tree."""
    names = [f"n{i:03d}" for i in range(300)]
    wire.ops.tree.driver.transact(lambda t: [t.put(f"big/{n}", b"v") for n in names])
    d = wire.lookup(k.ROOT_ID, "big")
    fh = k.OPEN_REPLY.unpack(wire.ok(k.OPENDIR, d.nodeid, k.OPEN_IN.pack(0, 0)).raw)[3]
    seen, offset, replies = [], 0, 0
    while True:
        reply = wire.readdir(d.nodeid, fh, offset, size=100)
        if not reply.body:
            break
        replies += 1
        assert len(reply.body) <= 100
        records = dirents_of(reply)
        # 32-byte records: 3 fit in 100 bytes, a 4th does not (the last reply holds what is left).
        assert len(records) == min(3, 302 - len(seen))
        assert [o for _, _, o, _ in records] == list(range(offset + 1, offset + 1 + len(records)))
        seen += [n.decode() for n, _, _, _ in records]
        offset = records[-1][2]
    assert seen == [".", ".."] + names
    assert replies == 302 // 3 + 1
    # A rewind starts over.
    assert [n for n, *_ in dirents_of(wire.readdir(d.nodeid, fh, 0, size=100))] == [b".", b"..", b"n000"]


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("opcode", [99, 39, 22, 4096])
def test_an_unknown_opcode_gets_enosys(wire, opcode):
    assert wire.fails(opcode, k.ROOT_ID, b"\0" * 16) == errno.ENOSYS
    assert wire.getattr(k.ROOT_ID).ino == k.ROOT_ID  # and the session goes on


def test_interrupt_is_not_answered(wire):
    wire.send(k.INTERRUPT, 0, struct.pack("<Q", 12345))
    assert wire.messages() == []
    assert wire.getattr(k.ROOT_ID).ino == k.ROOT_ID


def test_errors_of_the_tree_become_the_replys_errno(wire):
    assert wire.fails(k.UNLINK, k.ROOT_ID, z("missing")) == errno.ENOENT
    assert wire.fails(k.OPEN, 777, k.OPEN_IN.pack(os.O_RDONLY, 0)) == errno.ENOENT  # unknown node
    d = wire.mkdir(k.ROOT_ID, "d")
    assert wire.fails(k.MKDIR, k.ROOT_ID, k.MKDIR_IN.pack(0o755, 0) + z("d")) == errno.EEXIST
    assert wire.fails(k.UNLINK, k.ROOT_ID, z("d")) == errno.EISDIR
    # A file removed behind the mount's back (another client): the read says so.
    f = wire.put_file(d.nodeid, "gone", b"data")
    wire.ops.tree.driver.transact(lambda t: t.delete("d/gone"))
    fh, _ = wire.open(f.nodeid)
    assert wire.fails(k.READ, f.nodeid, k.READ_IN.pack(fh, 0, 4096, 0, 0, 0, 0)) == errno.ENOENT
    wire.release(f.nodeid, fh)
    assert wire.fails(k.READ, f.nodeid, k.READ_IN.pack(fh, 0, 4096, 0, 0, 0, 0)) == errno.EBADF
    # Only regular files can be made with MKNOD.
    fifo = k.MKNOD_IN.pack(stat.S_IFIFO | 0o644, 0, 0, 0) + z("fifo")
    assert wire.fails(k.MKNOD, k.ROOT_ID, fifo) == errno.EPERM
    # The session keeps working.
    wire.put_file(d.nodeid, "after", b"ok")
    assert wire.lookup(d.nodeid, "after").attr.size == 2


def test_format_errors_become_einval(make_ops, make_wire):
    """With the format layer a bad metadata document is refused when it is stored (the close)."""
    wire = make_wire(make_ops(make_hooks(MountOptions())))
    entry, fh = wire.create(k.ROOT_ID, ".zgroup")
    wire.write(entry.nodeid, fh, b"{not json")
    assert wire.fails(k.FLUSH, entry.nodeid, k.FLUSH_IN.pack(fh, 0, 0, 0)) == errno.EINVAL
    wire.release(entry.nodeid, fh)
    assert wire.ops.tree.driver.get(".zgroup") is None
    wire.put_file(k.ROOT_ID, ".zgroup", b'{"zarr_format": 2}')
    assert wire.lookup(k.ROOT_ID, ".zgroup").attr.size == 18


# ---------------------------------------------------------------------- notifications
def test_keys_changed_sends_inval_inode_and_inval_entry(wire):
    g = wire.mkdir(k.ROOT_ID, "g")
    x = wire.put_file(g.nodeid, "x", b"1")
    wire.session.keys_changed(["g/x"])
    assert wire.messages(wait=0.2) == []  # nothing before INIT started the sender
    wire.session.invalidator.start()
    wire.session.keys_changed(["g/x", "g/new", "top", "h/unknown/y"])
    notes = wire.messages(wait=2, count=4)
    assert all(n.unique == 0 for n in notes) and len(notes) == 4
    inode = [n for n in notes if n.error == -k.NOTIFY_INVAL_INODE]
    assert [k.NOTIFY_INVAL_INODE_OUT.unpack(n.raw) for n in inode] == [
        (40, k.NOTIFY_INVAL_INODE, 0, x.nodeid, 0, 0)
    ]
    entries = []
    for n in notes:
        if n.error == -k.NOTIFY_INVAL_ENTRY:
            size, _, _, parent, namelen, _ = k.NOTIFY_INVAL_ENTRY_OUT.unpack_from(n.raw)
            name = n.raw[k.NOTIFY_INVAL_ENTRY_OUT.size :]
            assert size == len(n.raw) and name.endswith(b"\0") and len(name) == namelen + 1
            entries.append((parent, name))
    assert sorted(entries) == sorted([(g.nodeid, b"x\0"), (g.nodeid, b"new\0"), (k.ROOT_ID, b"top\0")])


def test_a_consolidated_document_rewritten_on_the_side_is_invalidated(make_ops, make_wire):
    """consolidate=live: storing the root .zgroup creates .zmetadata; the kernel is told to
    drop its cached "no such file" for it before the close returns."""
    wire = make_wire(make_ops(make_hooks(MountOptions(consolidate="live"))))
    assert wire.init().error == 0  # starts the notification sender
    assert wire.lookup(k.ROOT_ID, ".zmetadata").nodeid == 0
    entry, fh = wire.create(k.ROOT_ID, ".zgroup")
    wire.write(entry.nodeid, fh, b'{"zarr_format": 2}')
    unique = wire.send(k.FLUSH, entry.nodeid, k.FLUSH_IN.pack(fh, 0, 0, 0))
    # (The reply normally comes second; the wait for the notification is bounded, so under load
    # it may not be: the order is not checked.)
    out = wire.messages(wait=2, count=2)
    assert sorted((m.unique, m.error) for m in out) == [(0, -k.NOTIFY_INVAL_ENTRY), (unique, 0)]
    note = next(m for m in out if m.unique == 0)
    assert note.raw[k.NOTIFY_INVAL_ENTRY_OUT.size :] == b".zmetadata\0"
    assert k.NOTIFY_INVAL_ENTRY_OUT.unpack_from(note.raw)[3] == k.ROOT_ID
    meta = wire.lookup(k.ROOT_ID, ".zmetadata")
    # (At the last close the kernel is handed the document itself: its one page is partial.)
    assert release_storing(wire, entry.nodeid, fh) == [(entry.nodeid, 0, b'{"zarr_format": 2}')]
    # Now that the kernel holds .zmetadata, a change to it drops its attributes and pages too.
    wire.put_file(k.ROOT_ID, "a", b"x" * 4096)  # a plain file of full pages: no notification
    assert wire.messages(wait=0.2) == []
    entry, fh = wire.create(k.ROOT_ID, ".zattrs")
    wire.write(entry.nodeid, fh, b'{"k": 1}')
    unique = wire.send(k.FLUSH, entry.nodeid, k.FLUSH_IN.pack(fh, 0, 0, 0))
    out = wire.messages(wait=2, count=3)
    assert sorted((m.unique, m.error) for m in out) == [
        (0, -k.NOTIFY_INVAL_ENTRY),
        (0, -k.NOTIFY_INVAL_INODE),
        (unique, 0),
    ]
    inode = next(m for m in out if m.error == -k.NOTIFY_INVAL_INODE)
    assert k.NOTIFY_INVAL_INODE_OUT.unpack(inode.raw)[3] == meta.nodeid
    assert release_storing(wire, entry.nodeid, fh) == [(entry.nodeid, 0, b'{"k": 1}')]


# ---------------------------------------------------------------------- OPEN and the page cache
def test_open_keeps_the_cache_only_while_the_file_is_unchanged(make_wire):
    wire = make_wire(attr_timeout=60)
    # Stored by a driver directly: the first open finds no pages it could trust.
    wire.ops.tree.commit("f", b"one", None)
    f = wire.lookup(k.ROOT_ID, "f")
    fh, flags = wire.open(f.nodeid)
    assert not flags & k.FOPEN_KEEP_CACHE
    wire.release(f.nodeid, fh)
    fh, flags = wire.open(f.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE  # unchanged since the pages were read
    wire.release(f.nodeid, fh)
    # Another client changes the file; the kernel's next GETATTR sees it, the next open drops pages.
    wire.ops.tree.commit("f", b"three", None)
    assert wire.getattr(f.nodeid).size == 5
    fh, flags = wire.open(f.nodeid)
    assert not flags & k.FOPEN_KEEP_CACHE
    assert wire.read(f.nodeid, fh) == b"three"
    wire.release(f.nodeid, fh)


def test_pages_written_through_the_mount_are_kept_after_the_commit(make_wire):
    """The kernel's pages of a file written here are its content: a later open keeps them,
    also when the file was a temporary one stored by its rename (zarr-python's .partial)."""
    wire = make_wire(attr_timeout=60)
    g = wire.put_file(k.ROOT_ID, "g", b"written here")
    assert wire.getattr(g.nodeid).size == 12  # the stored size and mtime are what the commit said
    fh, flags = wire.open(g.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE
    wire.release(g.nodeid, fh)
    tmp = wire.put_file(k.ROOT_ID, "c.partial", b"chunk")
    assert wire.ops.tree.driver.get("c.partial") is None  # held until its rename
    assert wire.rename(k.ROOT_ID, "c.partial", k.ROOT_ID, "c").error == 0
    assert wire.inodes.key(tmp.nodeid) == "c"
    fh, flags = wire.open(tmp.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE
    assert wire.read(tmp.nodeid, fh) == b"chunk"
    wire.release(tmp.nodeid, fh)
    # A commit by someone else afterwards still drops them at the next open.
    wire.ops.tree.commit("c", b"another", None)
    assert wire.getattr(tmp.nodeid).size == 7
    fh, flags = wire.open(tmp.nodeid)
    assert not flags & k.FOPEN_KEEP_CACHE
    wire.release(tmp.nodeid, fh)


def test_only_a_file_opened_for_writing_is_flushed_at_its_close(wire):
    """A read-only open asks the kernel not to send FLUSH (nothing to store); one that may write
    keeps it, since its close is where its writes are stored and their errors reported."""
    f = wire.put_file(k.ROOT_ID, "f", b"data")
    for flags, flushed in ((os.O_RDONLY, False), (os.O_WRONLY, True), (os.O_RDWR, True)):
        fh, open_flags = wire.open(f.nodeid, flags)
        assert bool(open_flags & k.FOPEN_NOFLUSH) is not flushed, flags
        wire.release(f.nodeid, fh)


# ---------------------------------------------------------------------- STATFS
def test_statfs_reply_is_the_trees_figures(wire):
    v = k.STATFS_REPLY.unpack(wire.ok(k.STATFS, k.ROOT_ID).raw)[3:]
    s = wire.ops.tree.statfs()
    blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, _ = v
    assert (blocks, files, ffree) == (s["f_blocks"], s["f_files"], s["f_ffree"])
    assert (bsize, namelen, frsize) == (s["f_bsize"], s["f_namemax"], s["f_frsize"])
    # Free space may move between the two calls (other processes write to this disk).
    assert abs(bfree - s["f_bfree"]) < 1 << 18 and abs(bavail - s["f_bavail"]) < 1 << 18
    assert blocks > 0 and bsize == 4096 and namelen == 255


def _stores(messages: list[Reply]) -> list[tuple[int, int, bytes]]:
    """(nodeid, offset, data) of each FUSE_NOTIFY_STORE among ``messages``."""
    out = []
    for m in messages:
        if m.unique == 0 and m.error == -k.NOTIFY_STORE:
            length, _, _, nodeid, offset, size, _ = k.NOTIFY_STORE_OUT.unpack_from(m.raw)
            data = m.raw[k.NOTIFY_STORE_OUT.size :]
            assert length == len(m.raw) and size == len(data)
            out.append((nodeid, offset, data))
    return out


def release_storing(wire: Wire, nodeid: int, fh: int) -> list[tuple[int, int, bytes]]:
    """RELEASE of a file's last descriptor: the stores sent before its reply (one reply)."""
    unique = wire.send(k.RELEASE, nodeid, k.RELEASE_IN.pack(fh, os.O_WRONLY, 0, 0))
    out = wire.messages()
    assert [m.unique for m in out if m.unique != 0] == [unique] and out[-1].unique == unique
    return _stores(out)


def test_a_stored_file_hands_its_last_partial_page_to_the_kernel(wire):
    """The kernel keeps the pages a write covered whole; the last one of a file whose size is
    not a multiple of the page size is handed to it once the file is stored and no descriptor
    of it is open (its last close, or the rename of a held temporary file), before the reply:
    reading the file back then needs no READ."""
    data = bytes(range(256)) * 40  # 10,240 bytes: two full pages and 2,048 bytes
    wire.put_file(k.ROOT_ID, "early", data)  # before INIT there is no kernel to tell
    assert wire.init().error == 0
    entry, fh = wire.create(k.ROOT_ID, "f")
    wire.write(entry.nodeid, fh, data)
    wire.flush(entry.nodeid, fh)  # stored, but the descriptor is still open: one reply only
    assert release_storing(wire, entry.nodeid, fh) == [(entry.nodeid, 8192, data[8192:])]

    wire.put_file(k.ROOT_ID, "pages", b"p" * 8192)  # full pages only: nothing to hand over
    entry, fh = wire.create(k.ROOT_ID, "0.partial")  # held until its rename
    wire.write(entry.nodeid, fh, data[:5000])
    wire.flush(entry.nodeid, fh)
    wire.release(entry.nodeid, fh)
    unique = wire.send(k.RENAME, k.ROOT_ID, k.RENAME_IN.pack(k.ROOT_ID) + z("0.partial") + z("0"))
    out = wire.messages()
    assert [(m.unique, m.error) for m in out] == [(0, -k.NOTIFY_STORE), (unique, 0)]
    assert _stores(out) == [(entry.nodeid, 4096, data[4096:5000])]
    assert wire.ops.tree.driver.get("0") == data[:5000]

    # While another descriptor is open, the page waits for that one's close.
    f = wire.lookup(k.ROOT_ID, "f")
    a, _ = wire.open(f.nodeid, os.O_RDWR)
    b, _ = wire.open(f.nodeid, os.O_RDONLY)
    wire.write(f.nodeid, a, b"new", 10_000)
    wire.flush(f.nodeid, a)
    assert release_storing(wire, f.nodeid, a) == []
    assert release_storing(wire, f.nodeid, b) == [
        (f.nodeid, 8192, data[8192:10_000] + b"new" + data[10_003:])
    ]
    # A file opened and closed without a change: nothing stored, nothing handed over.
    a, _ = wire.open(f.nodeid, os.O_RDWR)
    assert release_storing(wire, f.nodeid, a) == []


# ---------------------------------------------------------------------- the inode table alone
def test_inode_table_remember_and_forget():
    t = InodeTable(DIR)
    assert len(t) == 1 and t.key(k.ROOT_ID) == "" and t.get(k.ROOT_ID).kind == DIR
    a, node = t.remember("a", FILE)
    assert a == k.ROOT_ID + 1 and node.key == "a" and node.lookups == 1
    assert t.remember("a", FILE) == (a, node) and node.lookups == 2
    b, _ = t.remember("b", DIR)
    assert b == a + 1 and t.key(b) == "b"
    t.forget(a, 1)
    assert t.key(a) == "a"
    t.forget(a, 1)
    assert t.get(a) is None and "a" not in t.ids and t.key(a) is None
    t.forget(a, 1)  # an unknown ID: nothing happens
    t.forget(k.ROOT_ID, 100)
    assert t.get(k.ROOT_ID).lookups == 1
    assert t.remember("a", FILE)[0] == b + 1  # a new ID, never an old one
    many = [t.remember(f"k{i}", FILE)[0] for i in range(20)]
    assert many == list(range(b + 2, b + 22))


def test_inode_table_detach():
    t = InodeTable(DIR)
    a, node = t.remember("a", FILE)
    t.detach("a")
    assert node.key is None and t.key(a) is None and t.get(a) is node and "a" not in t.ids
    again, _ = t.remember("a", FILE)
    assert again != a
    t.forget(a, 1)  # the detached node goes; the new one at the same key stays
    assert t.get(a) is None and t.ids["a"] == again
    t.detach("never-seen")


def test_inode_table_kind_change_gives_a_new_id():
    """A file replaced by a folder of the same name behind the mount: the kernel's inode of the
    old type is detached and the name gets a new node."""
    t = InodeTable(DIR)
    old, old_node = t.remember("x", FILE)
    new, new_node = t.remember("x", DIR)
    assert new != old and old_node.key is None and new_node.key == "x" and new_node.lookups == 1
    assert t.ids["x"] == new
    t.forget(old, 1)
    assert t.ids["x"] == new and t.get(new) is new_node


def test_inode_table_moved_with_nested_keys_and_a_replaced_target():
    t = InodeTable(DIR)
    src = t.remember("a", DIR)[0]
    child = t.remember("a/b", DIR)[0]
    leaf = t.remember("a/b/c", FILE)[0]
    sibling = t.remember("ab", FILE)[0]  # shares the prefix "a" but is not below "a/"
    target = t.remember("z", DIR)[0]
    stale = t.remember("z/b", DIR)[0]  # a node the kernel still holds under the target
    t.moved("a", "z")
    assert (t.key(src), t.key(child), t.key(leaf)) == ("z", "z/b", "z/b/c")
    assert t.key(sibling) == "ab" and t.key(target) is None and t.key(stale) is None
    assert t.ids == {"": k.ROOT_ID, "z": src, "z/b": child, "z/b/c": leaf, "ab": sibling}
    t.moved("ab", "z/b/d")  # a file into a moved folder
    assert t.key(sibling) == "z/b/d" and "ab" not in t.ids


def test_inode_table_exchanged():
    t = InodeTable(DIR)
    a = t.remember("a", DIR)[0]
    a1 = t.remember("a/1", FILE)[0]
    b = t.remember("b", DIR)[0]
    b2 = t.remember("b/2", FILE)[0]
    t.exchanged("a", "b")
    assert (t.key(a), t.key(a1), t.key(b), t.key(b2)) == ("b", "b/1", "a", "a/2")
    assert t.ids == {"": k.ROOT_ID, "a": b, "a/2": b2, "b": a, "b/1": a1}
    only = t.remember("only", FILE)[0]
    t.exchanged("only", "unknown")  # the kernel never looked the other name up
    assert t.key(only) == "unknown" and "only" not in t.ids

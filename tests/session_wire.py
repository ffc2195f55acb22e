"""Driving the FUSE protocol session without a mount, for the tests of the session: requests
packed as the kernel packs them, handed to :meth:`Session.handle`, replies read back from a pipe
and unpacked with the structs of ``<linux/fuse.h>``. Real LMDB databases in ``tmp_path``; no
FUSE, no mocks. conftest.py makes the fixtures (make_ops, make_wire, wire) shared."""

from __future__ import annotations

import errno
import os
import select
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from zarrfs.backends import open_driver
from zarrfs.fs.api import Operations
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.tree import Tree
from zarrfs.fuse import abi as k
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.session import Session

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

    def send(self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"", length: int | None = None) -> int:
        """Hand one request to the session; its unique ID. ``length``: what the header says
        (the true length unless given), for malformed requests."""
        self._unique += 2
        if length is None:
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

    def call(
        self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"", length: int | None = None
    ) -> Reply:
        """One request and its one reply (matched by unique ID)."""
        unique = self.send(opcode, nodeid, body, length)
        replies = self.messages()
        assert len(replies) == 1, replies
        assert replies[0].unique == unique
        assert replies[0].length == len(replies[0].raw)
        return replies[0]

    def ok(self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"") -> Reply:
        reply = self.call(opcode, nodeid, body)
        assert reply.error == 0, (k.OPCODE_NAMES.get(opcode), errno.errorcode.get(reply.error))
        return reply

    def fails(
        self, opcode: int, nodeid: int = k.ROOT_ID, body: bytes = b"", length: int | None = None
    ) -> int:
        """The errno of a request's reply (which must be an error, the header alone)."""
        reply = self.call(opcode, nodeid, body, length)
        assert reply.raw == reply.raw[: k.OUT_HEADER_SIZE], "an error reply is the header alone"
        return reply.error

    # -------------------------------------------------------------- requests
    def init(
        self,
        major: int = 7,
        minor: int = 31,
        readahead: int = 128 << 10,
        flags: int = 0,
        flags2: int | None = None,
    ) -> Reply:
        if flags2 is None:
            return self.call(k.INIT, 0, k.INIT_IN.pack(major, minor, readahead, flags))
        # A 7.36+ kernel: a second word of flags, announced by INIT_EXT, in a 64-byte struct.
        body = k.INIT_IN_EXT.pack(major, minor, readahead, flags | k.INIT_EXT, flags2) + bytes(44)
        return self.call(k.INIT, 0, body)

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
        # Past the page cache when the wire agreed DIRECT_IO_ALLOW_MMAP at INIT; nothing else.
        assert open_flags & ~k.FOPEN_DIRECT_IO == 0, open_flags
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


def stores(messages: list[Reply]) -> list[tuple[int, int, bytes]]:
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
    return stores(out)

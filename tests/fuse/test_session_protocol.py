"""The FUSE protocol of the session: the layouts of ``<linux/fuse.h>``, the opcode table, INIT
(the version and features agreed), requests that do not hold what their type needs, the
counters, and the layering of :mod:`zarrfs.fuse` over :mod:`zarrfs.fs.api`."""

from __future__ import annotations

import ast
import errno
import os
import stat
import struct
from pathlib import Path

import pytest
from session_wire import Reply, Wire, release_storing, z

from zarrfs.fs.tree import DIR, FILE
from zarrfs.fuse import abi as k
from zarrfs.fuse.session import MAX_WRITE


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
    assert k.INIT_REPLY_22.size == 16 + 24  # FUSE_COMPAT_22_INIT_OUT_SIZE
    sizes = {
        k.INIT_IN: 16,
        k.INIT_VERSION: 8,
        k.INTERRUPT_IN: 8,
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
    # DIRECT_IO_ALLOW_MMAP is flags2's bit 4, announced by INIT_EXT (1 << 30).
    # DO_READDIRPLUS (1 << 13): names come with their attributes; not READDIRPLUS_AUTO (1 << 14),
    # whose plain READDIR after the first would leave du a lookup per name.
    # HANDLE_KILLPRIV_V2 (1 << 28): set-id bits are cleared by zarrfs, on the flags below.
    bits = (0, 3, 5, 13, 15, 18, 22, 28, 36)
    assert k.WANTED == sum(1 << bit for bit in bits)
    assert (k.FATTR_KILL_SUIDGID, k.WRITE_KILL_SUIDGID, k.OPEN_KILL_SUIDGID) == (1 << 11, 1 << 2, 1)
    assert k.READDIRPLUS == 44 and k.DIRENTPLUS.size == 152
    assert k.INIT_EXT == 1 << 30 and k.FOPEN_DIRECT_IO == 1


def test_dirent_records_pad_to_eight_bytes():
    for name, total in ((b"a", 32), (b"abcdefgh", 32), (b"abcdefghi", 40), (b"", 24)):
        record = k.dirents([(name.decode(), FILE, 5, 77)], 4096)
        assert len(record) == total
        assert k.DIRENT.unpack_from(record) == (77, 5, len(name), 8)
        assert record[24 : 24 + len(name)] == name and set(record[24 + len(name) :]) <= {0}
    assert k.DIRENT.unpack_from(k.dirents([("d", DIR, 1, 2)], 4096))[3] == 4  # DT_DIR
    assert k.DIRENT.unpack_from(k.dirents([("l", stat.S_IFLNK, 1, 3)], 4096))[3] == 10  # DT_LNK


def test_names_split_nul_terminated_names():
    buf = memoryview(b"HEAD" + b"old\0new name\0" + b"garbage")
    assert k.names(buf, 4, 4 + 13) == [b"old", b"new name"]
    assert k.names(buf, 4, 8, count=1) == [b"old"] and k.name(buf, 4, 8) == b"old"
    assert k.name(buf, 8, 17) == b"new name"
    for start, end, count in ((4, 17, 1), (4, 8, 2), (4, 12, 2), (4, 4, 2), (4, 20, 2)):
        with pytest.raises(k.Malformed):  # too many, too few, or not NUL-terminated
            k.names(buf, start, end, count)
    for start, end in ((4, 17), (4, 7), (17, 20)):
        with pytest.raises(k.Malformed):
            k.name(buf, start, end)
    assert k.split_time(2.5) == (2, 500_000_000) and k.split_time(0) == (0, 0)


# ---------------------------------------------------------------------- INIT
def test_init_answers_with_our_version_and_the_wanted_flags(make_wire):
    calls = []
    wire = make_wire(on_init=lambda: calls.append(1))
    offered = (1 << 32) - 1 & ~k.ATOMIC_O_TRUNC  # everything but one wanted flag
    reply = wire.init(7, 40, 256 << 10, offered)  # a newer kernel: our version
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


@pytest.mark.parametrize(
    ("major", "minor", "body"),
    [(6, 9, 16), (8, 0, 16), (7, k.MIN_MINOR - 1, 16), (7, 5, 8), (7, 0, 8)],
)
def test_init_refuses_a_kernel_it_cannot_serve(make_wire, caplog, major, minor, body):
    """Another major version, or a minor below the oldest served (also an INIT of a kernel so
    old that it holds only the version): EPROTO and a log line that names both versions."""
    calls = []
    wire = make_wire(on_init=lambda: calls.append(1))
    args = k.INIT_IN.pack(major, minor, 128 << 10, 0xFFFF)[:body]
    reply = wire.call(k.INIT, 0, args)
    assert reply.error == errno.EPROTO and len(reply.raw) == k.OUT_HEADER_SIZE
    assert calls == [] and not wire.session.initialized and wire.session.agreed is None
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert f"FUSE {major}.{minor}" in record.getMessage()
    assert f"{k.MAJOR}.{k.MIN_MINOR}" in record.getMessage() and record.exc_info is None


@pytest.mark.parametrize(
    ("kernel", "agreed", "size"),
    [
        (k.MIN_MINOR, k.MIN_MINOR, 24),
        (22, 22, 24),  # the last minor of the short reply (FUSE_COMPAT_22_INIT_OUT_SIZE)
        (23, 23, 64),
        (k.MINOR, k.MINOR, 64),
        (40, k.MINOR, 64),  # a newer kernel speaks our version
    ],
)
def test_init_agrees_on_the_older_minor_in_its_reply_layout(make_wire, kernel, agreed, size):
    wire = make_wire()
    offered = k.ASYNC_READ | k.BIG_WRITES | k.AUTO_INVAL_DATA | (1 << 30)
    reply = wire.init(7, kernel, 64 << 10, offered)
    assert reply.error == 0 and reply.length == k.OUT_HEADER_SIZE + size
    major, minor, readahead, flags, _, _, max_write = k.INIT_REPLY_22.unpack_from(reply.raw)[3:]
    assert (major, minor, readahead, max_write) == (7, agreed, 64 << 10, MAX_WRITE)
    # Only wanted features the kernel offered; not AUTO_INVAL_DATA, nor one zarrfs never heard of.
    assert flags == k.ASYNC_READ | k.BIG_WRITES
    assert wire.session.agreed == (agreed, flags)
    if size == 64:
        time_gran, max_pages = k.INIT_REPLY.unpack(reply.raw)[10:12]
        assert (time_gran, max_pages) == (1, 0)  # no MAX_PAGES offered: the kernel's own limit


def test_init_reads_and_answers_the_second_word_of_flags(make_wire):
    """From 7.36 the kernel offers more features in flags2 (INIT_EXT in flags says so); the
    reply grants them in its own flags2. DIRECT_IO_ALLOW_MMAP is asked only at 7.39 on."""
    for minor, granted in ((39, True), (38, False)):
        wire = make_wire()
        offered2 = (k.DIRECT_IO_ALLOW_MMAP >> 32) | (1 << 9)  # and one zarrfs does not want
        reply = wire.init(7, minor, 64 << 10, k.ASYNC_READ | k.AUTO_INVAL_DATA, flags2=offered2)
        assert reply.error == 0
        fields = k.INIT_REPLY.unpack(reply.raw)
        flags, flags2 = fields[6], fields[13]
        assert flags == k.ASYNC_READ | (k.INIT_EXT if granted else 0)
        assert flags2 == ((k.DIRECT_IO_ALLOW_MMAP >> 32) if granted else 0)
        assert wire.session.agreed.direct_io_mmap is granted
        assert wire.session.agreed.flags == k.ASYNC_READ | (k.DIRECT_IO_ALLOW_MMAP if granted else 0)


def test_init_too_short_for_the_version_it_names_is_einval(make_wire):
    wire = make_wire()
    assert wire.fails(k.INIT, 0, k.INIT_VERSION.pack(7, k.MINOR)) == errno.EINVAL
    assert not wire.session.initialized
    assert wire.init().error == 0


def test_notifications_wait_for_a_version_that_has_them(make_wire):
    """NOTIFY_STORE came with 7.15: a 7.14 kernel is not handed pages (the file is read back
    as before); invalidations (7.12) are sent to both."""
    data = b"x" * 5000  # one full page and a partial one
    for minor, stored in ((14, False), (15, True)):
        wire = make_wire()
        assert wire.init(7, minor).error == 0
        entry, fh = wire.create(k.ROOT_ID, "f")
        wire.write(entry.nodeid, fh, data)
        wire.flush(entry.nodeid, fh)
        expected = [(entry.nodeid, 4096, data[4096:])] if stored else []
        assert release_storing(wire, entry.nodeid, fh) == expected
        wire.session.keys_changed(["f"])
        notes = wire.messages(wait=30, count=3)  # the file's, its entry, its folder's listing
        inode, entry = -k.NOTIFY_INVAL_INODE, -k.NOTIFY_INVAL_ENTRY
        assert sorted(n.error for n in notes) == [entry, inode, inode]


# ---------------------------------------------------------------------- malformed requests
def _refused(wire: Wire, caplog, opcode: int, body: bytes, length: int | None = None) -> None:
    """The request gets EINVAL with at most one log line and no traceback; the session goes on."""
    caplog.clear()
    assert wire.fails(opcode, k.ROOT_ID, body, length) == errno.EINVAL
    assert len(caplog.records) <= 1 and all(r.exc_info is None for r in caplog.records)
    assert wire.getattr(k.ROOT_ID).ino == k.ROOT_ID


def test_requests_shorter_than_their_input_are_einval(wire, caplog):
    _refused(wire, caplog, k.GETATTR, k.GETATTR_IN.pack(0, 0, 0)[:8])
    _refused(wire, caplog, k.READ, b"\0" * 24)
    _refused(wire, caplog, k.SETATTR, b"\0" * 80)
    _refused(wire, caplog, k.LOOKUP, b"")  # not even the name's NUL
    _refused(wire, caplog, k.MKDIR, k.MKDIR_IN.pack(0o755, 0))
    _refused(wire, caplog, k.STATFS, b"", length=k.IN_HEADER_SIZE - 8)  # shorter than its header
    _refused(wire, caplog, k.GETATTR, k.GETATTR_IN.pack(0, 0, 0), length=4096)  # longer than read
    entry, fh = wire.create(k.ROOT_ID, "f")
    _refused(wire, caplog, k.WRITE, k.WRITE_IN.pack(fh, 0, 100, 0, 0, 0, 0) + b"only 9 b")
    wire.release(entry.nodeid, fh)
    assert wire.ops.tree.driver.get("f") == b""


def test_names_not_nul_terminated_in_the_request_are_einval(wire, caplog):
    _refused(wire, caplog, k.LOOKUP, b"name")  # the buffer's next byte is not NUL either
    _refused(wire, caplog, k.LOOKUP, b"a\0b\0")  # two names where one belongs
    _refused(wire, caplog, k.UNLINK, b"na\0me\0")
    _refused(wire, caplog, k.MKDIR, k.MKDIR_IN.pack(0o755, 0) + b"d")
    _refused(wire, caplog, k.RENAME, k.RENAME_IN.pack(k.ROOT_ID) + z("old"))  # one name of two
    _refused(wire, caplog, k.RENAME2, k.RENAME2_IN.pack(k.ROOT_ID, 0, 0) + z("a") + b"b")
    _refused(wire, caplog, k.SYMLINK, z("a") + z("b") + z("c"))
    assert wire.ops.tree.driver.get("d") is None and wire.lookup(k.ROOT_ID, "d").nodeid == 0


def test_malformed_requests_without_replies_are_dropped(wire, caplog):
    f = wire.put_file(k.ROOT_ID, "f", b"x")
    wire.send(k.FORGET, f.nodeid, b"\0" * 4)
    wire.send(k.INTERRUPT, 0, b"")
    # A batch that counts more nodes than it holds: those it holds are forgotten.
    wire.send(k.BATCH_FORGET, 0, k.BATCH_FORGET_IN.pack(50, 0) + k.FORGET_ONE.pack(f.nodeid, 1))
    assert wire.messages() == [] and wire.inodes.held("f") is None
    wire.session.handle(memoryview(b"\x28\0\0\0"))  # less than a header: nothing to answer
    assert wire.messages() == [] and all(r.exc_info is None for r in caplog.records)
    assert wire.getattr(k.ROOT_ID).ino == k.ROOT_ID


# ---------------------------------------------------------------------- counters
def test_stats_count_requests_and_errors_by_type(wire):
    nothing = {
        "requests": {}, "errors": {}, "busy_ns": {}, "bytes": {"read": 0, "written": 0},
        "notifications": {"sent": 0, "late": 0},
    }
    assert wire.session.stats() == nothing
    wire.init()
    wire.lookup(k.ROOT_ID, "missing")  # a negative entry is an answer, not an error
    wire.put_file(k.ROOT_ID, "f", b"x" * 4096)  # full pages: no NOTIFY_STORE in between
    wire.fails(k.UNLINK, k.ROOT_ID, z("gone"))
    wire.fails(k.LOOKUP, k.ROOT_ID, b"bad")
    wire.fails(39, k.ROOT_ID)  # IOCTL: not served
    wire.fails(4096, k.ROOT_ID)
    wire.send(k.FORGET, 2, b"")
    stats = wire.session.stats()
    assert stats["requests"] == {
        "init": 1, "lookup": 2, "create": 1, "write": 1, "flush": 1, "release": 1, "unlink": 1,
        "ioctl": 1, "unknown": 1, "forget": 1,
    }  # fmt: skip
    assert stats["errors"] == {"unlink": 1, "lookup": 1, "ioctl": 1, "unknown": 1, "forget": 1}
    assert stats["busy_ns"].keys() == stats["requests"].keys()  # each answer timed (zarrfs stats)
    assert stats["bytes"] == {"read": 0, "written": 4096}
    node = wire.lookup(k.ROOT_ID, "f").nodeid
    fh, _ = wire.open(node)
    assert wire.read(node, fh, 8192) == b"x" * 4096
    assert wire.session.stats()["bytes"] == {"read": 4096, "written": 4096}


def test_request_cpu_is_counted_by_type_when_asked(make_wire, monkeypatch):
    """ZARRFS_REQUEST_CPU: each request type's handlers' CPU time (scripts/bench_ops.py);
    without it, none is measured."""
    assert "cpu_us" not in make_wire().session.stats()
    monkeypatch.setenv("ZARRFS_REQUEST_CPU", "1")
    wire = make_wire()
    wire.init()
    for i in range(200):
        wire.lookup(k.ROOT_ID, f"missing{i}")
    wire.put_file(k.ROOT_ID, "f", b"x" * 4096)
    cpu = wire.session.stats()["cpu_us"]
    assert {"init", "lookup", "create", "write", "flush", "release"} <= cpu.keys(), cpu
    assert cpu["lookup"] > 0


def test_closes_answered_together_count_their_time_and_cpu_as_one_close_does(make_wire, monkeypatch):
    """A group of closes committed together (``Session.flushes``, the request threads of a
    database server) counts its requests, its time answering (``zarrfs stats``) and, with
    ZARRFS_REQUEST_CPU, its CPU under FLUSH, as one close through ``handle`` does: the group's
    commit was counted nowhere."""
    monkeypatch.setenv("ZARRFS_REQUEST_CPU", "1")
    wire = make_wire()
    wire.init()
    requests = []
    for i in range(3):
        entry, fh = wire.create(k.ROOT_ID, f"g{i}")
        wire.write(entry.nodeid, fh, b"y" * 5000)
        body = k.FLUSH_IN.pack(fh, 0, 0, 0)
        length = k.IN_HEADER_SIZE + len(body)
        head = k.IN_HEADER.pack(length, k.FLUSH, 900 + 2 * i, entry.nodeid, 0, 0, 1, 0, 0)
        requests.append(memoryview(head + body))
    before = wire.session.stats()
    assert "flush" not in before["requests"] and "flush" not in before["cpu_us"]
    wire.session.flushes(requests)
    replies = [m for m in wire.messages() if m.unique]
    assert sorted(m.unique for m in replies) == [900, 902, 904] and not any(m.error for m in replies)
    assert all(wire.ops.tree.find(f"g{i}").size == 5000 for i in range(3))
    stats = wire.session.stats()
    assert stats["requests"]["flush"] == 3
    assert stats["busy_ns"]["flush"] > 0 and stats["cpu_us"]["flush"] > 0, stats


def test_a_write_without_cap_fsetid_clears_suid_and_sgid_at_its_commit(wire):
    """WRITE_KILL_SUIDGID: the bits go with the written content, in one commit; an
    open(O_TRUNC) with OPEN_KILL_SUIDGID likewise; without the flags (a writer with
    CAP_FSETID) they stay."""

    def answer(opcode: int, nodeid: int, body: bytes) -> Reply:  # notifications left aside
        unique = wire.send(opcode, nodeid, body)
        (reply,) = [m for m in wire.messages() if m.unique == unique]
        assert reply.error == 0, errno.errorcode.get(-reply.error)
        return reply

    def close(nodeid: int, fh: int) -> None:
        answer(k.FLUSH, nodeid, k.FLUSH_IN.pack(fh, 0, 0, 0))
        answer(k.RELEASE, nodeid, k.RELEASE_IN.pack(fh, os.O_WRONLY, 0, 0))

    wire.init()
    f = wire.put_file(k.ROOT_ID, "f", b"d" * 4096, mode=0o6755)  # full pages: no NOTIFY_STORE
    fh = k.OPEN_REPLY.unpack(answer(k.OPEN, f.nodeid, k.OPEN_IN.pack(os.O_WRONLY, 0)).raw)[3]
    answer(k.WRITE, f.nodeid, k.WRITE_IN.pack(fh, 0, 4, 0, 0, 0, 0) + b"root")  # may keep them
    answer(k.FLUSH, f.nodeid, k.FLUSH_IN.pack(fh, 0, 0, 0))
    assert wire.ops.tree.find("f").attrs.mode & 0o7777 == 0o6755
    answer(k.WRITE, f.nodeid, k.WRITE_IN.pack(fh, 0, 2, k.WRITE_KILL_SUIDGID, 0, 0, 0) + b"ab")
    close(f.nodeid, fh)
    assert wire.ops.tree.find("f").attrs.mode & 0o7777 == 0o755  # stored with the content
    wire.ops.set_attrs("f", mode=0o6750)  # S_ISGID and group execute
    body = k.OPEN_IN.pack(os.O_WRONLY | os.O_TRUNC, k.OPEN_KILL_SUIDGID)
    close(f.nodeid, k.OPEN_REPLY.unpack(answer(k.OPEN, f.nodeid, body).raw)[3])
    assert wire.ops.tree.find("f").attrs.mode & 0o7777 == 0o750


# ---------------------------------------------------------------------- layering
def test_the_protocol_layer_reaches_the_filesystem_only_through_its_api():
    """zarrfs.fuse imports zarrfs.fs.api and nothing else of zarrfs.fs."""
    package = Path(k.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("zarrfs.fs.") and not name.startswith("zarrfs.fs.api"):
                    pytest.fail(f"{path.name} imports {name}")


@pytest.mark.parametrize("opcode", [99, 39, 51, 4096])
def test_an_unknown_opcode_gets_enosys(wire, opcode):
    assert wire.fails(opcode, k.ROOT_ID, b"\0" * 16) == errno.ENOSYS
    assert wire.getattr(k.ROOT_ID).ino == k.ROOT_ID  # and the session goes on


def test_interrupt_is_not_answered(wire):
    wire.send(k.INTERRUPT, 0, struct.pack("<Q", 12345))
    assert wire.messages() == []
    assert wire.getattr(k.ROOT_ID).ino == k.ROOT_ID



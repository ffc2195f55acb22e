"""No request leaves garbage in reference cycles: the daemon runs the collector's youngest
generation after 50,000 new objects rather than 700 (``zarrfs.fuse.tuning.collect_less_often``),
which is harmless only while what a request makes is freed by reference counting. Each road,
answered or refused, run with the collector off; then a collection must find nothing."""

from __future__ import annotations

import gc
import os
import stat

from session_wire import z

from zarrfs.fuse import abi as k

ROUNDS = 40


def _small_file(wire, parent: int, name: str, data: bytes) -> int:
    """create + write + flush + release, the stores the change feed sends read off too."""
    entry, fh = wire.create(parent, name)
    wire.write(entry.nodeid, fh, data)
    wire.flush(entry.nodeid, fh)
    wire.send(k.RELEASE, entry.nodeid, k.RELEASE_IN.pack(fh, os.O_WRONLY, 0, 0))
    wire.messages()
    return entry.nodeid


def _roads(wire, folder: int, file: int):
    """(what, one round of it) for the requests of reading, writing, listing and failing."""

    def listing(i: int) -> None:
        fh = k.OPEN_REPLY.unpack(wire.ok(k.OPENDIR, folder, k.OPEN_IN.pack(0, 0)).raw)[3]
        offset = 0
        while body := wire.ok(k.READDIRPLUS, folder, k.READ_IN.pack(fh, offset, 4096, 0, 0, 0, 0)).body:
            at = 0
            while at < len(body):
                values = k.DIRENTPLUS.unpack_from(body, at)
                offset = values[-3]
                at += (k.DIRENTPLUS.size + values[-2] + 7) // 8 * 8
        wire.ok(k.RELEASEDIR, folder, k.RELEASE_IN.pack(fh, 0, 0, 0))

    def read(i: int) -> None:
        fh, _ = wire.open(file)
        wire.read(file, fh)
        wire.release(file, fh)

    def rename_and_unlink(i: int) -> None:
        _small_file(wire, folder, f"r{i}", b"r")
        assert wire.rename(folder, f"r{i}", folder, f"s{i}").error == 0
        wire.ok(k.UNLINK, folder, z(f"s{i}"))

    def xattrs(i: int) -> None:
        wire.ok(k.SETXATTR, file, k.SETXATTR_IN.pack(1, 0) + b"user.k\0" + b"v")
        wire.ok(k.GETXATTR, file, k.GETXATTR_IN.pack(64, 0) + b"user.k\0")
        wire.ok(k.LISTXATTR, file, k.GETXATTR_IN.pack(64, 0))

    yield "lookup", lambda i: wire.lookup(folder, "f1")
    yield "lookup of a missing name", lambda i: wire.call(k.LOOKUP, folder, z(f"missing{i}"))
    yield "lookup of a name no file can have", lambda i: wire.call(k.LOOKUP, folder, b"\xff\0")
    yield "getattr", lambda i: wire.getattr(file)
    yield "getattr of a node gone", lambda i: wire.call(k.GETATTR, 10**9, k.GETATTR_IN.pack(0, 0, 0))
    yield "listing", listing
    yield "read", read
    yield "create, write, close", lambda i: _small_file(wire, folder, f"n{i}", b"x" * 5000)
    yield "rename and unlink", rename_and_unlink
    yield "mkdir and rmdir", lambda i: (wire.mkdir(folder, f"d{i}"), wire.ok(k.RMDIR, folder, z(f"d{i}")))
    yield "mkdir of a name taken", lambda i: wire.call(k.MKDIR, folder, k.MKDIR_IN.pack(0o755, 0) + z("f1"))
    yield "rmdir of a folder not empty", lambda i: wire.call(k.RMDIR, k.ROOT_ID, z("d"))
    yield "chmod", lambda i: wire.setattr(file, k.FATTR_MODE, mode=stat.S_IFREG | 0o600 + (i & 1))
    yield "extended attributes", xattrs
    yield (
        "getxattr of a missing name",
        lambda i: wire.call(k.GETXATTR, file, k.GETXATTR_IN.pack(0, 0) + b"user.none\0"),
    )


def test_no_request_leaves_garbage_in_reference_cycles(make_ops, make_wire):
    from zarrfs.fs.changes import ChangeWatcher
    from zarrfs.fuse.coherence import Coherence

    ops = make_ops()
    wire = make_wire(ops)
    wire.session.coherence = Coherence(wire.session, ChangeWatcher(ops.tree))
    folder = wire.mkdir(k.ROOT_ID, "d").nodeid
    file = [_small_file(wire, folder, f"f{i}", b"data") for i in range(300)][1]
    left = {}
    was = gc.isenabled()
    try:
        for what, one in _roads(wire, folder, file):
            one(-1)  # first: what a road makes once (a cache filled, a module's lazy part)
            gc.collect()
            gc.disable()
            for i in range(ROUNDS):
                one(i)
            left[what] = gc.collect()
            gc.enable()
    finally:
        if was:
            gc.enable()
    assert left == dict.fromkeys(left, 0)

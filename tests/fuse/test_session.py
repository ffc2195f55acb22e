"""The FUSE session's calls without a mount: names, data, attributes, listings, errors and
notifications, through :class:`zarrfs.fuse.session.Session` over real LMDB databases (see
``session_wire``)."""

from __future__ import annotations

import errno
import os
import stat
import time

import pytest
from session_wire import ATTR_FIELDS, GID, UID, attr_of, dirents_of, entry_of, release_storing, z

from zarrfs.daemon.main import make_hooks
from zarrfs.fs.commitoptions import REWRITE
from zarrfs.fs.tree import DIR, FILE, RENAME_EXCHANGE, RENAME_NOREPLACE
from zarrfs.fuse import abi as k
from zarrfs.options import MountOptions


# ---------------------------------------------------------------------- names and attributes
def test_lookup_counts_and_forget_leaves_the_node_idle(make_wire):
    wire = make_wire(entry_timeout=2.5, attr_timeout=0.75)
    wire.put_file(k.ROOT_ID, "f", b"0123456789", mode=0o640)
    wire.send(k.FORGET, wire.inodes.ids["f"], k.FORGET_IN.pack(1))  # the CREATE's count
    assert wire.inodes.held("f") is None

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
    assert wire.inodes.held("f") is None and wire.inodes.held("d") is None
    assert wire.inodes.get(first.nodeid).lookups == 0 == wire.inodes.get(other.nodeid).lookups
    assert wire.fails(k.GETATTR, other.nodeid + 100, k.GETATTR_IN.pack(0, 0, 0)) == errno.ENOENT

    again = wire.lookup(k.ROOT_ID, "f")  # forgotten, not gone: the same node ID (inode number)
    assert again.nodeid == first.nodeid and again.attr.ino == first.attr.ino
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
    second = entry_of(wire.ok(k.LINK, d.nodeid, k.LINK_IN.pack(f.nodeid) + z("f2")))
    assert second.nodeid == f.nodeid and (second.attr.size, second.attr.nlink) == (3, 2)  # one inode
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


def test_an_extension_by_ftruncate_counts_no_blocks_while_the_file_is_open(wire):
    """``truncate -s 2G`` (open, ftruncate, close): the reply to the SETATTR, which the kernel
    keeps, said 2 GiB of blocks (du 2.0G) where a pwrite at 1 GiB shows one block."""
    entry, fh = wire.create(k.ROOT_ID, "f")
    a = wire.setattr(entry.nodeid, k.FATTR_SIZE | k.FATTR_FH, fh=fh, size=2 << 30)
    assert a.size == 2 << 30 and a.blocks <= 8, (a.size, a.blocks)
    wire.write(entry.nodeid, fh, b"x", 1 << 30)
    assert wire.getattr(entry.nodeid).blocks <= 16
    wire.release(entry.nodeid, fh)
    assert wire.getattr(entry.nodeid).blocks <= 16 * 2048  # one part of 16 MiB at most


def test_setattr_through_an_open_handle_of_an_unlinked_file(wire):
    """ftruncate on a file whose name is gone: the kernel names it by handle (FATTR_FH)."""
    f = wire.put_file(k.ROOT_ID, "f", b"0123456789")
    fh, _ = wire.open(f.nodeid, os.O_RDWR)
    wire.ok(k.UNLINK, k.ROOT_ID, z("f"))
    a = wire.setattr(f.nodeid, k.FATTR_SIZE | k.FATTR_FH, fh=fh, size=2)
    assert a.size == 2
    assert wire.read(f.nodeid, fh) == b"01"
    a = attr_of(wire.ok(k.GETATTR, f.nodeid, k.GETATTR_IN.pack(k.GETATTR_FH, 0, fh)))
    assert (a.size, a.nlink) == (2, 0)
    # fstat: the kernel names the node alone (no handle); its open handle answers.
    a = attr_of(wire.ok(k.GETATTR, f.nodeid, k.GETATTR_IN.pack(0, 0, 0)))
    assert (a.size, a.nlink) == (2, 0)
    wire.release(f.nodeid, fh)
    assert wire.ops.tree.driver.get("f") is None
    assert wire.fails(k.GETATTR, f.nodeid, k.GETATTR_IN.pack(0, 0, 0)) == errno.ENOENT


# ---------------------------------------------------------------------- READDIR
def test_readdir_lists_dirents_with_types_and_offsets(wire):
    d = wire.mkdir(k.ROOT_ID, "d")
    wire.mkdir(d.nodeid, "sub")
    wire.put_file(d.nodeid, "file", b"1")
    fh = k.OPEN_REPLY.unpack(wire.ok(k.OPENDIR, d.nodeid, k.OPEN_IN.pack(0, 0)).raw)[3]
    got = dirents_of(wire.readdir(d.nodeid, fh, 0))
    assert [(n, t, o) for n, t, o, _ in got] == [(b".", 4, 1), (b"..", 4, 2), (b"file", 8, 3), (b"sub", 4, 4)]
    # d_ino is the inode number stat gives: a name listed before its lookup keeps its number.
    inos = {n: ino for n, _, _, ino in got}
    assert inos[b"."] == d.nodeid and inos[b".."] == k.ROOT_ID
    assert wire.lookup(d.nodeid, "file").nodeid == inos[b"file"]
    assert wire.lookup(d.nodeid, "sub").nodeid == inos[b"sub"] != inos[b"file"]
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
    # MKNOD makes files, FIFOs, devices and sockets; no other type.
    fifo = k.MKNOD_IN.pack(stat.S_IFIFO | 0o644, 0, 0, 0) + z("fifo")
    assert entry_of(wire.ok(k.MKNOD, k.ROOT_ID, fifo)).attr.mode == stat.S_IFIFO | 0o644
    odd = k.MKNOD_IN.pack(stat.S_IFDIR | 0o644, 0, 0, 0) + z("odd")
    assert wire.fails(k.MKNOD, k.ROOT_ID, odd) == errno.EINVAL
    assert wire.fails(k.LOOKUP, k.ROOT_ID, z("x" * 256)) == errno.ENAMETOOLONG
    # The session keeps working.
    wire.put_file(d.nodeid, "after", b"ok")
    assert wire.lookup(d.nodeid, "after").attr.size == 2


def test_a_node_known_without_extended_attributes_answers_each_missing_name_as_getxattr_raises(
    make_ops, make_wire
):
    """Under a change feed a node read with no extended attributes answers a GETXATTR of a
    name it lacks from the node table, with the errno ``Operations.getxattr`` raises for it:
    POSIX ACL names too (EOPNOTSUPP where the kernel does not enforce ACLs, ENODATA where it
    does: ``ls -l`` asks each file's access ACL on an ACL mount), and EOPNOTSUPP for the SELinux
    label; neither the database nor the operations are asked."""
    from zarrfs.fs.api import ChangeWatcher, FsError
    from zarrfs.fuse import coherence

    names = [b"user.k", b"trusted.t", b"system.posix_acl_access", b"system.posix_acl_default"]
    for enforced in (False, True):
        ops = make_ops()
        ops.acl = enforced
        wire = make_wire(ops)
        wire.session.coherence = coherence.Coherence(wire.session, ChangeWatcher(ops.tree))
        f = wire.put_file(k.ROOT_ID, "f", b"x")
        asked = k.GETXATTR_IN.pack(0, 0)
        assert wire.fails(k.GETXATTR, f.nodeid, asked + b"user.first\0") == errno.ENODATA
        assert wire.inodes.bare_of_xattrs(f.nodeid)
        expected = {}
        for name in names:
            with pytest.raises(FsError) as exc:
                ops.getxattr("f", name)
            expected[name] = exc.value.errno
        expected[b"security.selinux"] = errno.EOPNOTSUPP

        def not_asked(*args):
            raise AssertionError(f"asked the operations: {args}")

        reads = ops.tree.driver.reads
        ops.getxattr = ops.xattrs = not_asked
        got = {name: wire.fails(k.GETXATTR, f.nodeid, asked + name + b"\0") for name in expected}
        assert got == expected, enforced
        assert expected[b"system.posix_acl_access"] == (errno.ENODATA if enforced else errno.EOPNOTSUPP)
        assert ops.tree.driver.reads == reads


def test_a_file_created_here_answers_the_kernels_getxattr_before_its_first_write_without_a_read(
    make_ops, make_wire
):
    """The kernel asks a new file's ``security.capability`` before its first write: under a
    change feed a file created through the mount with no extended attributes (no default ACL
    from its folder) is known to have none, so that GETXATTR reads nothing, before its commit
    and after it."""
    from zarrfs.fs.api import ChangeWatcher
    from zarrfs.fuse import coherence

    ops = make_ops()
    wire = make_wire(ops)
    wire.session.coherence = coherence.Coherence(wire.session, ChangeWatcher(ops.tree))
    asked = k.GETXATTR_IN.pack(0, 0) + b"security.capability\0"
    entry, fh = wire.create(k.ROOT_ID, "new")
    assert wire.inodes.bare_of_xattrs(entry.nodeid)
    reads = ops.tree.driver.reads
    assert wire.fails(k.GETXATTR, entry.nodeid, asked) == errno.ENODATA
    wire.write(entry.nodeid, fh, b"x" * 4096)
    wire.flush(entry.nodeid, fh)
    wire.send(k.RELEASE, entry.nodeid, k.RELEASE_IN.pack(fh, os.O_WRONLY, 0, 0))
    wire.messages()
    reads = ops.tree.driver.reads
    assert wire.fails(k.GETXATTR, entry.nodeid, asked) == errno.ENODATA
    assert ops.tree.driver.reads == reads
    # Extended attributes set through the mount are seen.
    wire.ok(k.SETXATTR, entry.nodeid, k.SETXATTR_IN.pack(1, 0) + b"user.k\0v")
    assert not wire.inodes.bare_of_xattrs(entry.nodeid)
    assert wire.ok(k.GETXATTR, entry.nodeid, k.GETXATTR_IN.pack(0, 0) + b"user.k\0")


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
    assert wire.init().error == 0
    wire.session.keys_changed(["g/x", "g/new", "top", "h/unknown/y"])
    notes = wire.messages(wait=30, count=6)
    assert all(n.unique == 0 for n in notes) and len(notes) == 6
    # The file's attributes and pages, and those of each held folder a name changed in (the
    # kernel's kept listing of it: a name may be new there).
    inode = [n for n in notes if n.error == -k.NOTIFY_INVAL_INODE]
    assert sorted(k.NOTIFY_INVAL_INODE_OUT.unpack(n.raw) for n in inode) == sorted(
        (40, k.NOTIFY_INVAL_INODE, 0, nodeid, 0, 0) for nodeid in (x.nodeid, g.nodeid, k.ROOT_ID)
    )
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
    out = wire.messages(wait=30, count=3)
    assert sorted((m.unique, m.error) for m in out) == [
        (0, -k.NOTIFY_INVAL_ENTRY),
        (0, -k.NOTIFY_INVAL_INODE),  # the root's kept listing
        (unique, 0),
    ]
    root = next(m for m in out if m.error == -k.NOTIFY_INVAL_INODE)
    assert k.NOTIFY_INVAL_INODE_OUT.unpack(root.raw)[3] == k.ROOT_ID
    note = next(m for m in out if m.error == -k.NOTIFY_INVAL_ENTRY)
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
    out = wire.messages(wait=30, count=4)
    assert sorted((m.unique, m.error) for m in out) == [
        (0, -k.NOTIFY_INVAL_ENTRY),
        (0, -k.NOTIFY_INVAL_INODE),
        (0, -k.NOTIFY_INVAL_INODE),
        (unique, 0),
    ]
    dropped = {k.NOTIFY_INVAL_INODE_OUT.unpack(m.raw)[3] for m in out if m.error == -k.NOTIFY_INVAL_INODE}
    assert dropped == {meta.nodeid, k.ROOT_ID}
    assert release_storing(wire, entry.nodeid, fh) == [(entry.nodeid, 0, b'{"k": 1}')]


# ---------------------------------------------------------------------- STATFS
def test_statfs_reply_is_the_trees_figures(wire):
    v = k.STATFS_REPLY.unpack(wire.ok(k.STATFS, k.ROOT_ID).raw)[3:]
    s = wire.ops.statfs()
    blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, _ = v
    assert (blocks, files, ffree) == (s["f_blocks"], s["f_files"], s["f_ffree"])
    assert (bsize, namelen, frsize) == (s["f_bsize"], s["f_namemax"], s["f_frsize"])
    # Free space may move between the two calls (other processes write to this disk).
    assert abs(bfree - s["f_bfree"]) < 1 << 18 and abs(bavail - s["f_bavail"]) < 1 << 18
    assert blocks > 0 and bsize == 4096 and namelen == 255


def test_missing_names_stay_cached_long_however_many_names_were_made(make_wire, monkeypatch):
    """A name made through the mount is no longer a remembered missing name; past the limit
    the oldest remembered ones are dropped from the kernel, and every "no such file" is still
    cached for the long time."""
    from zarrfs.fs.api import ChangeWatcher
    from zarrfs.fuse import coherence

    monkeypatch.setattr(coherence, "NEGATIVES", 16)
    monkeypatch.setattr(coherence, "EVICTED", 4)
    wire = make_wire(negative_timeout=3600)
    wire.session.coherence = coherence.Coherence(wire.session, ChangeWatcher(wire.ops.tree))
    wire.init()
    for i in range(40):  # as a program making files does: a lookup, then the create
        assert wire.lookup(k.ROOT_ID, f"f{i}").nodeid == 0
        wire.put_file(k.ROOT_ID, f"f{i}", b"x" * 4096)  # full pages: no NOTIFY_STORE
    assert len(wire.session.coherence.negatives) == 0
    for i in range(40):
        wire.send(k.LOOKUP, k.ROOT_ID, z(f"missing{i}"))
    replies, dropped = [], b""
    deadline = time.monotonic() + 30
    while (len(replies) < 40 or b"missing0\0" not in dropped) and time.monotonic() < deadline:
        for m in wire.messages(wait=1, count=1):
            if m.unique:
                replies.append(entry_of(m))
            elif m.error == -k.NOTIFY_INVAL_ENTRY:
                dropped += m.raw
    assert [(e.nodeid, e.entry_valid) for e in replies] == [(0, 3600)] * 40
    assert len(wire.session.coherence.negatives) <= 16
    # The ones forgotten were dropped from the kernel's cache (they could not be later).
    assert b"missing0\0" in dropped


# ---------------------------------------------------------------------- hard links changed elsewhere
@pytest.fixture
def elsewhere(tmp_path, make_wire):
    """A session with its change feed over a SQLite database, and the filesystem calls of
    another mount of that database (its own driver): ``(wire, other)``."""
    from zarrfs.backends import open_driver
    from zarrfs.fs.api import ChangeWatcher, Operations
    from zarrfs.fs.handles import HandleTable
    from zarrfs.fs.tree import Tree
    from zarrfs.fuse.coherence import Coherence

    url = f"sqlite://{tmp_path}/shared.sqlite"
    drivers = [open_driver(url), open_driver(url)]
    here, there = (Tree(d, uid=UID, gid=GID) for d in drivers)
    wire = make_wire(Operations(here, HandleTable(here)))
    wire.session.coherence = Coherence(wire.session, ChangeWatcher(here))
    yield wire, Operations(there, HandleTable(there))
    for d in drivers:
        d.close()


def test_a_name_linked_elsewhere_is_the_files_node_before_the_feed_tells(elsewhere):
    """``link(h, i)`` made through another mount: a lookup of ``i`` before the change feed told
    it gives the node of ``h``, which the kernel holds (not a node of its own)."""
    wire, other = elsewhere
    h = wire.put_file(k.ROOT_ID, "h", b"y").nodeid
    other.link("h", "i")
    i = wire.lookup(k.ROOT_ID, "i")
    assert (i.nodeid, i.attr.nlink) == (h, 2)
    wire.session.coherence.poll()
    assert wire.lookup(k.ROOT_ID, "h").nodeid == h and wire.getattr(h).nlink == 2


def test_a_name_removed_elsewhere_leaves_the_node_to_the_name_left(elsewhere):
    """``h`` and ``i`` one node here; ``h`` unlinked through another mount: the node's
    attributes before the change feed told it, and an open (which asks the feed first), are
    the file's under ``i``, not ENOENT for the name gone."""
    wire, other = elsewhere
    nodes = {}
    for name in ("getattr", "open"):
        nodes[name] = wire.put_file(k.ROOT_ID, name, name.encode()).nodeid
        other.link(name, f"{name}-2")
    wire.session.coherence.poll()
    for name, nodeid in nodes.items():
        assert wire.lookup(k.ROOT_ID, f"{name}-2").nodeid == nodeid
        other.unlink(name)
    attr = wire.getattr(nodes["getattr"])
    assert (attr.nlink, attr.size) == (1, 7)
    fh, _ = wire.open(nodes["open"])
    assert wire.read(nodes["open"], fh) == b"open"
    wire.release(nodes["open"], fh)
    assert wire.getattr(nodes["open"]).nlink == 1
    assert wire.lookup(k.ROOT_ID, "open").nodeid == 0  # "no such file", cached


def linked_x_and_l(wire, other) -> int:
    """``x`` ("old content") and ``l`` one file, linked through the other mount, and one node
    here (``x``'s, returned); ``y`` ("new") another file."""
    x = wire.put_file(k.ROOT_ID, "x", b"old content").nodeid
    wire.put_file(k.ROOT_ID, "y", b"new")
    other.link("x", "l")
    wire.session.coherence.poll()
    assert wire.lookup(k.ROOT_ID, "l").nodeid == x
    return x


def read_through(wire, nodeid: int) -> bytes:
    fh, _ = wire.open(nodeid)
    try:
        return wire.read(nodeid, fh)
    finally:
        wire.release(nodeid, fh)


def test_a_rename_elsewhere_onto_one_name_of_a_linked_file(elsewhere):
    """``x`` and ``l`` one node here; ``rename(y, x)`` through another mount: once the change
    feed told it, ``l`` is still the node, with the old content and one link, and ``x`` is
    another node (it was the node still, whose name the kernel then read ``l`` by). A
    descriptor open for writing on the node (under ``x``, its first name) stores its writes
    under ``l`` at its close, and leaves ``x`` as the rename made it."""
    wire, other = elsewhere
    x = linked_x_and_l(wire, other)
    fh, _ = wire.open(x, os.O_RDWR)
    other.rename("y", "x")
    wire.session.coherence.poll()
    assert wire.lookup(k.ROOT_ID, "l").nodeid == x and wire.getattr(x).nlink == 1
    new = wire.lookup(k.ROOT_ID, "x")
    assert new.nodeid != x and (new.attr.size, new.attr.nlink) == (3, 1)
    assert wire.write(x, fh, b"OLD") == 3
    wire.flush(x, fh)
    wire.release(x, fh)
    assert (read_through(wire, x), read_through(wire, new.nodeid)) == (b"OLD content", b"new")
    assert other.tree.driver.get("l") == b"OLD content" and other.tree.driver.get("x") == b"new"


def test_a_rename_elsewhere_onto_a_linked_name_when_the_feed_cannot_tell_what(elsewhere):
    """The same rename, the change feed saying only "something changed" (a feed that lost
    track): the name whose version is the one a descriptor open on the node reads is the file
    (``l``: the node, its content); the other name gets a node of its own."""
    wire, other = elsewhere
    x = linked_x_and_l(wire, other)
    fh, _ = wire.open(x)
    other.rename("y", "x")
    wire.session.coherence.everything()  # what a poll does when the feed says that
    assert wire.lookup(k.ROOT_ID, "l").nodeid == x
    assert (wire.getattr(x).nlink, wire.getattr(x).size) == (1, 11)
    assert wire.read(x, fh) == b"old content"
    wire.release(x, fh)
    new = wire.lookup(k.ROOT_ID, "x")
    assert new.nodeid != x and read_through(wire, new.nodeid) == b"new"


def test_a_reader_let_in_beside_a_writer_leaves_the_change_feed_to_it(elsewhere):
    """With several request threads, a writer waiting (on another program's lock, say) lets
    readers of other files run (``Admission.let_through``): an open or an opendir among them
    does not ask the change feed, whose news would drop the kernel's caches and change the
    mount's tables under the writer, half way through its work. One running alone does."""
    import threading

    from zarrfs.fuse.admission import Admission

    wire, other = elsewhere
    f = wire.put_file(k.ROOT_ID, "f", b"data").nodeid
    admission = wire.session.admission = Admission()
    other.tree.store([("g", b"news", None, REWRITE)])  # the feed has news for whoever asks
    polls = wire.session.coherence.polls
    asked: list[int] = []

    def reader() -> None:
        admission.enter_reader(f, f, order=102)
        try:
            wire.send(k.OPEN, f, k.OPEN_IN.pack(os.O_RDONLY, 0))
            wire.send(k.OPENDIR, k.ROOT_ID, k.OPEN_IN.pack(os.O_RDONLY, 0))
            asked.append(wire.session.coherence.polls - polls)
        finally:
            admission.leave_reader(f)

    admission.enter_writer(order=100)
    thread = threading.Thread(target=reader)
    thread.start()
    deadline = time.monotonic() + 60
    while not admission._readers_waiting and time.monotonic() < deadline:
        admission._wait(0.01)  # the writer's lock let go meanwhile: the reader queues
    # The writer's own file is another. A reader that has not woken within the window waits
    # for the writer (as in the daemon): on a busy machine the writer lets it through again.
    while not admission.passes and time.monotonic() < deadline:
        admission.let_through(node=k.ROOT_ID + 1000)
    thread.join(60)
    assert asked == [0], asked
    opened = [m for m in wire.messages() if m.unique]
    assert [m.error for m in opened] == [0, 0]
    wire.send(k.OPEN, f, k.OPEN_IN.pack(os.O_RDONLY, 0))  # the writer's thread: alone
    admission.leave_writer()
    assert wire.session.coherence.polls > polls

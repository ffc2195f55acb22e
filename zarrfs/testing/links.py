"""Hard-link semantics every driver must give, part of
:class:`zarrfs.testing.filesystem.FilesystemConformance` (which mixes this class in).

Through :class:`zarrfs.fs.api.Operations` without FUSE: ``st_nlink`` counts the names of a
file, a write or truncate through one name shows through all (at once, open files included,
and in the database under every name, where zarr-python 2's stores read them), unlink and
rename keep the link-group records exact, and a name deleted behind the filesystem's back
(zarr-python 2 knows nothing of links) is simply not a name any more.
"""

from __future__ import annotations

import errno
import os
import stat
import time

import pytest

from zarrfs.backends.base import SIDE
from zarrfs.fs.api import Operations
from zarrfs.fs.commitoptions import CREATE, CommitOptions
from zarrfs.fs.errors import FsError
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.tree import FILE, RENAME_EXCHANGE, Tree

from .claims import Claims


def _ops(tree: Tree) -> Operations:
    return Operations(tree, HandleTable(tree))


def _write(ops: Operations, key: str, data: bytes, offset: int = 0) -> None:
    fh = ops.handles.open(key, os.O_WRONLY)
    ops.handles.write(fh, data, offset)
    ops.flush(fh)
    ops.release(fh)


def _nlinks(tree: Tree, *keys: str) -> list[int]:
    return [tree.lookup(k).nlink for k in keys]


def _link_records(tree: Tree) -> list[str]:
    """The link-group side records (``g:``/``h:``) left in the database."""
    return [k for k, _ in tree.driver.scan("", None, space=SIDE) if k.startswith(("g:", "h:"))]


class LinkConformance(Claims):
    """Hard links over one driver (mixed into FilesystemConformance, which gives ``tree``)."""

    def test_link_counts_names_and_shares_content(self, tree):
        ops = _ops(tree)
        tree.store([("a", b"hello", None, CREATE)])
        ops.link("a", "b")
        assert _nlinks(tree, "a", "b") == [2, 2]
        assert tree.lookup("a").group == tree.lookup("b").group != ""
        assert tree.driver.get("b") == b"hello"  # every name is an ordinary key
        _write(ops, "b", b"HE")
        assert tree.driver.get("a") == tree.driver.get("b") == b"HEllo"
        ops.handles.truncate("a", 2)
        assert tree.driver.get("a") == tree.driver.get("b") == b"HE"
        ops.link("b", "c")
        assert _nlinks(tree, "a", "b", "c") == [3, 3, 3]
        assert tree.folder_nodes("", 100)["c"].nlink == 3  # a folder's snapshot says it too
        assert tree.driver.get("c") == b"HE"
        with pytest.raises(FsError) as info:
            ops.link("a", "c")
        assert info.value.errno == errno.EEXIST
        # a new mount of the same database sees the same file
        again = Tree(tree.driver)
        assert again.lookup("c").nlink == 3 and again.link_names("a") == ["a", "b", "c"]

    def test_two_names_open_at_once_share_one_file(self, tree):
        ops = _ops(tree)
        tree.store([("a", b"0123456789", None, CREATE)])
        ops.link("a", "b")
        writer = ops.handles.open("a", os.O_RDWR)
        reader = ops.handles.open("b", os.O_RDONLY)
        ops.handles.write(writer, b"XY", 4)
        assert bytes(ops.handles.read(reader, 100, 0)) == b"0123XY6789"  # before any close
        assert tree.driver.get("b") == b"0123456789"
        pending = ops.find("b")  # what a lookup of either name says while writes are pending
        assert (pending.size, pending.nlink, pending.group) == (10, 2, tree.lookup("a").group)
        ops.flush(writer)
        assert tree.driver.get("a") == tree.driver.get("b") == b"0123XY6789"
        ops.unlink("a")  # the open file keeps its other name
        ops.handles.write(writer, b"Z", 0)
        ops.release(writer)
        ops.release(reader)
        assert tree.driver.get("b") == b"Z123XY6789" and tree.driver.get("a") is None
        assert ops.handles.states == {}

    def test_link_of_a_file_open_for_writing(self, tree):
        ops = _ops(tree)
        fh = ops.create("new", 0o644, os.O_WRONLY, 0, 0)
        ops.handles.write(fh, b"pending", 0)
        ops.link("new", "other")  # the pending content is stored first
        ops.handles.write(fh, b"P", 0)
        ops.release(fh)
        assert tree.driver.get("new") == tree.driver.get("other") == b"Pending"

    def test_unlink_leaves_the_other_names(self, tree):
        ops = _ops(tree)
        tree.store([("a", b"v", None, CREATE)])
        ops.link("a", "b")
        ops.link("a", "c")
        ctime = tree.lookup("b").attrs.ctime
        ops.unlink("a")
        assert tree.find("a") is None and _nlinks(tree, "b", "c") == [2, 2]
        assert tree.lookup("b").attrs.ctime > ctime  # the file's ctime: a name went
        ops.unlink("b")
        assert _nlinks(tree, "c") == [1] and tree.lookup("c").group == ""
        assert _link_records(tree) == []  # a group of one name is dissolved

    def test_attributes_are_shared(self, tree):
        ops = _ops(tree)
        tree.store([("a", b"v", None, CREATE)])
        ops.link("a", "b")
        ops.set_attrs("b", mode=0o600, mtime=123)
        attrs = tree.lookup("a").attrs
        assert (attrs.mode & 0o777, attrs.mtime) == (0o600, 123)
        assert tree.lookup("a").attrs == tree.lookup("b").attrs

    def test_rename_keeps_links(self, tree):
        ops = _ops(tree)
        tree.mkdir("d", 0o755)
        tree.store([("a", b"v", None, CREATE)])
        ops.link("a", "b")
        ops.rename("a", "d/x")
        assert _nlinks(tree, "d/x", "b") == [2, 2]
        ops.rename("d", "e")  # a folder holding a linked name
        assert _nlinks(tree, "e/x", "b") == [2, 2] and tree.link_names("b") == ["e/x", "b"]
        _write(ops, "b", b"W")
        assert tree.driver.get("e/x") == b"W"
        assert ops.rename("b", "e/x") is None  # onto a name of the same file: nothing happens
        assert _nlinks(tree, "e/x", "b") == [2, 2]
        tree.store([("f", b"F", None, CREATE)])
        ops.rename("e/x", "f", RENAME_EXCHANGE)
        assert _nlinks(tree, "f", "b", "e/x") == [2, 2, 1] and tree.driver.get("e/x") == b"F"
        tree.store([("g", b"G", None, CREATE)])
        ops.rename("g", "b")  # a plain file replaces one name: the other stays, alone
        assert _nlinks(tree, "b", "f") == [1, 1] and tree.driver.get("f") == b"W"
        assert _link_records(tree) == []

    def test_a_temporary_file_renamed_onto_a_name_replaces_only_that_name(self, tree):
        ops = _ops(tree)
        tree.store([("c", b"old", None, CREATE)])
        ops.link("c", "c2")
        fh = ops.create("c.partial", 0o644, os.O_WRONLY, 0, 0)
        ops.handles.write(fh, b"new", 0)
        ops.release(fh)  # held until its rename
        ops.rename("c.partial", "c")
        assert tree.driver.get("c") == b"new" and tree.driver.get("c2") == b"old"
        assert _nlinks(tree, "c", "c2") == [1, 1]

    def test_a_name_deleted_by_another_writer_is_no_name(self, tree):
        ops = _ops(tree)
        tree.store([("a", b"v", None, CREATE)])
        ops.link("a", "b")
        ops.link("a", "c")
        tree.driver.delete("b")  # zarr-python 2 deleting one key
        assert tree.find("b") is None and _nlinks(tree, "a", "c") == [2, 2]
        _write(ops, "a", b"w")
        assert tree.driver.get("b") is None and tree.driver.get("c") == b"w"  # never brought back
        tree.driver.delete("c")
        assert _nlinks(tree, "a") == [1]
        ops.unlink("a")
        assert [k for k, _ in tree.driver.scan("")] == []

    @pytest.mark.parametrize("kind", ["symlink", "fifo", "char"])
    def test_a_symlink_or_special_file_has_real_hard_links(self, tree, kind):
        ops = _ops(tree)
        if kind == "symlink":
            tree.symlink("target", "n")
        elif kind == "fifo":
            tree.mknod("n", stat.S_IFIFO | 0o644, 0)
        else:
            tree.mknod("n", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        first = tree.lookup("n")
        ops.link("n", "n2")
        ops.link("n2", "n3")
        a, b, c = (tree.lookup(k) for k in ("n", "n2", "n3"))
        assert {a.nlink, b.nlink, c.nlink} == {3} and a.group and a.group == b.group == c.group
        assert (b.kind, b.target, b.rdev) == (first.kind, first.target, first.rdev)
        tree.set_attrs("n3", uid=65534, gid=65533)  # shared by every name
        assert {(tree.lookup(k).attrs.uid, tree.lookup(k).attrs.gid) for k in ("n", "n2")} == {(65534, 65533)}
        ctime = tree.lookup("n").attrs.ctime
        time.sleep(0.01)
        ops.unlink("n")
        assert _nlinks(tree, "n2", "n3") == [2, 2] and tree.lookup("n2").attrs.ctime > ctime
        tree.rename("n3", "m")  # the group follows the moved name
        assert _nlinks(tree, "n2", "m") == [2, 2]
        assert tree.rename("m", "n2") is False  # onto another name of the same node: nothing
        tree.mknod("x", stat.S_IFIFO | 0o644, 0)
        tree.rename("x", "m")  # a rename onto one name takes it out of the group
        assert _nlinks(tree, "n2", "m") == [1, 1] and tree.lookup("n2").kind == first.kind
        ops.unlink("n2")
        ops.unlink("m")
        assert [k for k, _ in tree.driver.scan("", space=SIDE) if k.startswith(("h:", "g:"))] == []

    def test_a_new_file_at_a_name_deleted_behind_our_back_is_not_linked(self, tree):
        ops = _ops(tree)
        tree.store([("a", b"v", None, CREATE)])
        ops.link("a", "b")
        tree.driver.transact(lambda t: [t.delete("a"), t.delete("b")])  # the group's records stay
        tree.store([("a", b"1", None, CREATE)])
        tree.store([("b", b"2", None, CREATE)])
        assert _nlinks(tree, "a", "b") == [1, 1]
        _write(ops, "a", b"x")
        assert tree.driver.get("b") == b"2"

    def test_links_change_folder_times_and_ctimes(self, tree):
        ops = _ops(tree)
        for folder in ("d", "e"):
            tree.mkdir(folder, 0o755)
        tree.store([("d/a", b"v", None, CommitOptions(create=True, added=time.time_ns()))])

        def times(*keys):
            return [(tree.find(k).attrs.mtime, tree.find(k).attrs.ctime) for k in keys]

        before = times("d", "e", "d/a")
        time.sleep(0.002)
        ops.link("d/a", "e/b")  # the new name's folder and the file change; not the source's
        after = times("d", "e", "d/a")
        assert after[0] == before[0] and after[1] > before[1]
        assert after[2][0] == before[2][0] and after[2][1] > before[2][1]
        assert times("e/b") == [after[2]]  # one file: one record under each name
        _write(ops, "e/b", b"w")  # a commit of a linked file adds no name
        assert times("d", "e") == after[:2] and tree.driver.get("d/a") == b"w"
        time.sleep(0.002)
        ops.unlink("e/b")
        gone = times("d", "e", "d/a")
        assert gone[0] == after[0] and gone[1] > after[1] and gone[2][1] > after[2][1]
        assert _nlinks(tree, "d/a") == [1] and _link_records(tree) == []

    def test_listing_shows_links_and_device_numbers_together(self, tree):
        ops = _ops(tree)
        tree.mkdir("d", 0o755)
        tree.store([("d/a", b"v", None, CREATE)])
        tree.mknod("d/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        ops.link("d/a", "d/b")
        ops.link("d/c", "d/c2")  # a special file's names are one node too
        nodes = tree.folder_nodes("d", 100)
        assert {n: (x.kind, x.nlink, x.rdev) for n, x in nodes.items()} == {
            "a": (FILE, 2, 0),
            "b": (FILE, 2, 0),
            "c": (stat.S_IFCHR, 2, os.makedev(1, 3)),
            "c2": (stat.S_IFCHR, 2, os.makedev(1, 3)),
        }
        assert nodes["a"].group == tree.find("d/b").group != ""
        assert tree.find("d/c2").rdev == os.makedev(1, 3)

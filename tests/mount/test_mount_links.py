"""Hard links through real mounts of every driver: one inode for all names, shared content
(open files included), unlink and rename, remounts, the database as zarr-python 2 reads it,
and the copy tools that preserve hard links (``cp -a``, ``rsync -aH``, ``tar``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mounting import eventually, needs_fuse, read, write

from zarrfs.backends import open_driver

pytestmark = needs_fuse


def stored(url: str, *keys: str) -> list[bytes | None]:
    """The values of ``keys`` as the database holds them (what zarr-python 2's stores read)."""
    driver = open_driver(url)
    try:
        return [driver.get(k) for k in keys]
    finally:
        driver.close()


def inode_groups(root: Path) -> list[list[str]]:
    """The files under ``root`` grouped by inode (names sharing one), each group sorted."""
    groups: dict[int, list[str]] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            groups.setdefault(path.lstat().st_ino, []).append(str(path.relative_to(root)))
    return sorted(sorted(g) for g in groups.values())


def test_hard_links_share_one_inode_and_content(mounted, mount_factory):
    root = mounted.path
    write(root / "a", b"hello")
    os.link(root / "a", root / "b")
    a, b = os.stat(root / "a"), os.stat(root / "b")
    assert a.st_ino == b.st_ino and (a.st_nlink, b.st_nlink) == (2, 2)
    write(root / "b", b"HELLO!")  # truncate and write through one name
    assert read(root / "a") == b"HELLO!"
    with open(root / "a", "r+b") as writer, open(root / "b", "rb") as reader:
        writer.write(b"J")
        writer.flush()
        assert reader.read() == b"JELLO!"  # before the writer's close
        os.truncate(root / "b", 4)
        writer.seek(0, os.SEEK_END)
        writer.write(b"Y")
    assert read(root / "a") == read(root / "b") == b"JELLY"
    os.mkdir(root / "d")
    os.link(root / "b", root / "d" / "c")
    assert os.stat(root / "a").st_nlink == 3
    os.rename(root / "a", root / "d" / "a")  # a linked name moves, still linked
    os.rename(root / "d", root / "e")  # and so does a folder of them
    names = [root / "b", root / "e" / "a", root / "e" / "c"]
    assert {os.stat(p).st_ino for p in names} == {os.stat(root / "b").st_ino}
    assert [os.stat(p).st_nlink for p in names] == [3, 3, 3]
    os.rename(root / "b", root / "e" / "c")  # onto a name of the same file: nothing happens
    assert os.path.exists(root / "b")
    os.unlink(root / "e" / "c")
    assert [os.stat(p).st_nlink for p in names[:2]] == [2, 2]
    write(root / "e" / "a", b"zarr")
    assert stored(mounted.url, "b", "e/a", "e/c") == [b"zarr", b"zarr", None]  # every name a key
    mounted.stop()
    again = mount_factory(mounted.url, name="again")
    b, a = os.stat(again.path / "b"), os.stat(again.path / "e" / "a")
    assert a.st_ino == b.st_ino and (a.st_nlink, b.st_nlink) == (2, 2)
    with open(again.path / "b", "ab") as fh:
        fh.write(b"!")
    assert read(again.path / "e" / "a") == b"zarr!"
    os.unlink(again.path / "b")
    assert os.stat(again.path / "e" / "a").st_nlink == 1
    assert stored(mounted.url, "b", "e/a") == [None, b"zarr!"]


def test_a_name_deleted_by_zarr_python_2_is_gone_and_stays_gone(mounted):
    root = mounted.path
    write(root / "a", b"v")
    os.link(root / "a", root / "b")
    driver = open_driver(mounted.url)
    try:
        driver.delete("b")  # a store that knows nothing of links
    finally:
        driver.close()
    write(root / "a", b"w")
    assert stored(mounted.url, "a", "b") == [b"w", None]
    eventually(  # once the kernel's entry and attribute caches expire or are invalidated
        lambda: not os.path.exists(root / "b") and os.stat(root / "a").st_nlink == 1, "b gone, a alone"
    )


@pytest.mark.parametrize("tool", ["cp", "rsync", "tar"])
def test_copy_tools_preserve_hard_links(mounted, tmp_path, tool):
    src = mounted.path / "src"
    (src / "g").mkdir(parents=True)
    write(src / "one", b"1")
    os.link(src / "one", src / "g" / "one-again")
    write(src / "two", b"2")
    os.link(src / "two", src / "two-again")
    write(src / "alone", b"3")
    expected = [["alone"], ["g/one-again", "one"], ["two", "two-again"]]
    assert inode_groups(src) == expected
    for dst in (mounted.path / "copy", tmp_path / "copy"):  # into the mount and out of it
        if tool == "cp":
            subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
        elif tool == "rsync":
            subprocess.run(["rsync", "-aH", f"{src}/", f"{dst}/"], check=True)
        else:
            dst.mkdir()
            archive = tmp_path / f"{dst.parent.name}.tar"
            subprocess.run(["tar", "-cf", str(archive), "-C", str(src), "."], check=True)
            subprocess.run(["tar", "-xf", str(archive), "-C", str(dst)], check=True)
        assert inode_groups(dst) == expected, dst
        assert read(dst / "g" / "one-again") == b"1"
    # and back: a local tree with hard links copied into the mount
    back = mounted.path / "back"
    subprocess.run(["cp", "-a", str(tmp_path / "copy"), str(back)], check=True)
    assert inode_groups(back) == expected
    assert stored(mounted.url, "back/one", "back/g/one-again") == [b"1", b"1"]


def test_hard_links_of_symlinks_and_special_files_are_one_node(mounted, mount_factory):
    """``link`` of a FIFO, a device or a symlink (``linkat`` without following it) makes a
    second name of the same node, as on a local disk: one inode, nlink counting the names,
    owner shared, kept across a remount."""
    root = mounted.path
    os.mkfifo(root / "p")
    os.mknod(root / "c", 0o600 | 0o020000, os.makedev(1, 3))
    os.symlink("target", root / "s")
    for name in ("p", "c", "s"):
        os.link(root / name, root / f"{name}2", follow_symlinks=False)
        os.link(root / name, root / f"{name}3", follow_symlinks=False)
        os.chown(root / f"{name}3", 65534, 65533, follow_symlinks=False)
    os.unlink(root / "p3")

    def seen(path: Path) -> dict[str, tuple[int, int, int, int]]:
        out = {}
        for name in ("p", "p2", "c", "c2", "c3", "s", "s2", "s3"):
            st = os.lstat(path / name)
            out[name] = (st.st_nlink, st.st_uid, st.st_gid, st.st_rdev)
        return out

    expected = {
        "p": (2, 65534, 65533, 0),
        "p2": (2, 65534, 65533, 0),
        **{n: (3, 65534, 65533, os.makedev(1, 3)) for n in ("c", "c2", "c3")},
        **{n: (3, 65534, 65533, 0) for n in ("s", "s2", "s3")},
    }
    assert seen(root) == expected
    assert os.lstat(root / "c").st_ino == os.lstat(root / "c3").st_ino
    assert os.lstat(root / "s2").st_ino == os.lstat(root / "s").st_ino != os.lstat(root / "p").st_ino
    assert os.readlink(root / "s3") == "target"
    mounted.stop()
    mounted.start()
    assert seen(root) == expected

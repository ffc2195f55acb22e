"""POSIX conformance through real mounts of every driver, in the spirit of go-fuse's posixtest:
special files, name and path lengths, owners and permissions, times, an open file after its
unlink, fallocate. Each test names the behaviour it checks; a non-root user is played by
``setpriv`` (uid 65534 cannot run the venv's python: shell commands do the work)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from mounting import needs_fuse, zarrfs

from zarrfs.backends import open_driver

pytestmark = needs_fuse

NOBODY, OTHER = 65534, 65533
_libc = ctypes.CDLL(None, use_errno=True)
FALLOC_FL_KEEP_SIZE = 1


def as_user(cwd: Path, script: str, uid: int = NOBODY, gid: int = NOBODY) -> subprocess.CompletedProcess:
    """Run ``sh -c script`` as ``uid``/``gid`` (no supplementary groups) in ``cwd``, which is
    entered as root first: the test's temporary folders above the mount are root's alone."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sh", "-c", script]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)


def ok_as(cwd: Path, script: str, uid: int = NOBODY, gid: int = NOBODY) -> str:
    result = as_user(cwd, script, uid, gid)
    assert result.returncode == 0, f"{script!r} as {uid}: {result.stderr}"
    return result.stdout


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """The fallocate system call itself (glibc's posix_fallocate writes zeros when the
    filesystem says EOPNOTSUPP, which would hide a missing FALLOCATE)."""
    if _libc.fallocate(fd, mode, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def data_keys(url: str) -> list[str]:
    """Every key zarr-python's stores see (the DATA space) of a database not mounted."""
    driver = open_driver(url)
    try:
        return driver.transact(lambda t: [k for k, _ in t.scan_prefix("")], write=False)
    finally:
        driver.close()


@pytest.fixture
def shared(db_url, mount_factory):
    """A fresh mount every user may enter (``allow_other``: the kernel checks permissions);
    its root is 0777."""
    m = mount_factory(db_url, ["create", "allow_other"])
    os.chmod(m.path, 0o777)
    return m


# ---------------------------------------------------------------------- 1. special files
def make_specials(where: Path) -> None:
    os.mkfifo(where / "fifo", 0o640)
    os.mknod(where / "chr", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(where / "blk", stat.S_IFBLK | 0o660, os.makedev(7, 1))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(where / "sock"))


def test_special_files_are_side_entries_that_stat_list_rename_and_persist(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    make_specials(m.path)
    kinds = {"fifo": stat.S_IFIFO, "chr": stat.S_IFCHR, "blk": stat.S_IFBLK, "sock": stat.S_IFSOCK}
    for name, kind in kinds.items():
        st = os.lstat(m.path / name)
        assert stat.S_IFMT(st.st_mode) == kind, name
    assert os.lstat(m.path / "chr").st_rdev == os.makedev(1, 3)
    assert os.lstat(m.path / "blk").st_rdev == os.makedev(7, 1)
    assert stat.S_IMODE(os.lstat(m.path / "fifo").st_mode) == 0o640
    assert sorted(os.listdir(m.path)) == sorted(kinds)
    assert {e.name for e in os.scandir(m.path) if not e.is_file() and not e.is_dir()} == set(kinds)
    # A FIFO is opened by the kernel, never by the daemon: data passes through the pipe.
    r = os.open(m.path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(m.path / "fifo", os.O_WRONLY)
    os.write(w, b"through the pipe")
    assert os.read(r, 100) == b"through the pipe"
    os.close(w)
    os.close(r)
    served = json.loads(zarrfs("status", str(m.path), "--json").stdout)["requests"]
    assert "open" not in served and "read" not in served, served
    os.chmod(m.path / "fifo", 0o604)
    os.chown(m.path / "chr", 12, 34)
    os.mkdir(m.path / "d")
    os.rename(m.path / "fifo", m.path / "d" / "fifo2")
    os.rename(m.path / "d", m.path / "e")
    os.unlink(m.path / "blk")
    m.stop()
    assert data_keys(m.url) == []  # zarr-python's stores see none of it
    m.start()
    st = os.lstat(m.path / "e" / "fifo2")
    assert (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode)) == (stat.S_IFIFO, 0o604)
    st = os.lstat(m.path / "chr")
    assert (stat.S_ISCHR(st.st_mode), st.st_rdev, st.st_uid, st.st_gid) == (True, os.makedev(1, 3), 12, 34)
    assert stat.S_ISSOCK(os.lstat(m.path / "sock").st_mode)
    assert not os.path.lexists(m.path / "blk")
    with pytest.raises(OSError) as exc:
        os.mknod(m.path / "chr", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    assert exc.value.errno == errno.EEXIST


def tree_stats(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """What ``stat`` says of every entry below ``root``: type and mode, owner, device, size of
    a file, a symlink's target, mtime in seconds (tar keeps no more)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if rel in skip:
                continue
            st = os.lstat(path)
            out[rel] = (
                st.st_mode,
                st.st_uid,
                st.st_gid,
                st.st_rdev,
                st.st_size if stat.S_ISREG(st.st_mode) else 0,
                os.readlink(path) if stat.S_ISLNK(st.st_mode) else "",
                int(st.st_mtime),
            )
    return out


def native_tree(src: Path) -> None:
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "file").write_bytes(b"x" * 5000)
    (src / "empty").write_bytes(b"")
    (src / "sub" / "deep" / "f").write_bytes(b"deep")
    os.symlink("file", src / "link")
    make_specials(src / "sub")
    os.chmod(src / "file", 0o4750)
    os.chown(src / "file", 1000, 100)
    os.chown(src / "sub" / "fifo", 1234, 5678)
    os.lchown(src / "link", 42, 43)
    for i, path in enumerate([src / "file", src / "empty", src / "sub" / "chr", src / "sub" / "deep" / "f"]):
        os.utime(path, (1_500_000_000 + i, 1_600_000_000 + i))
    os.utime(src / "link", (1_400_000_000, 1_400_000_000), follow_symlinks=False)
    for i, path in enumerate([src / "sub" / "deep", src / "sub"]):
        os.utime(path, (1_300_000_000 + i, 1_300_000_000 + i))


def test_cp_rsync_and_tar_round_trip_a_tree_with_special_files(db_url, mount_factory, tmp_path):
    m = mount_factory(db_url, ["create"])
    src = tmp_path / "src"
    native_tree(src)
    want = tree_stats(src)
    subprocess.run(["cp", "-a", str(src), str(m.path / "cp")], check=True)
    subprocess.run(["rsync", "-a", f"{src}/", str(m.path / "rsync")], check=True)
    (m.path / "tar").mkdir()
    untar = ["tar", "-C", str(m.path / "tar"), "--numeric-owner", "-xpf", "-"]
    packed = subprocess.run(["tar", "-C", str(src), "--numeric-owner", "-cf", "-", "."], capture_output=True)
    subprocess.run(untar, input=packed.stdout, check=True)
    no_socket = ("sub/sock",)  # tar skips sockets
    assert tree_stats(m.path / "cp") == want
    assert tree_stats(m.path / "rsync") == want
    assert tree_stats(m.path / "tar", no_socket) == tree_stats(src, no_socket)
    # And back out of the mount, after a remount: tar of the mount, cp -a from it.
    m.stop()
    m.start()
    assert tree_stats(m.path / "cp") == want
    back = tmp_path / "back"
    back.mkdir()
    packed = subprocess.run(
        ["tar", "-C", str(m.path / "cp"), "--numeric-owner", "-cf", "-", "."], capture_output=True, check=True
    )
    subprocess.run(["tar", "-C", str(back), "--numeric-owner", "-xpf", "-"], input=packed.stdout, check=True)
    assert tree_stats(back, no_socket) == tree_stats(src, no_socket)
    subprocess.run(["cp", "-a", str(m.path / "rsync"), str(tmp_path / "back2")], check=True)
    assert tree_stats(tmp_path / "back2") == want
    shutil.rmtree(m.path / "cp")
    assert not (m.path / "cp").exists()


# ---------------------------------------------------------------------- 2. names and paths
def test_names_over_255_bytes_are_enametoolong(mounted):
    root = mounted.path
    long, ok = "n" * 256, "n" * 255
    (root / "f").write_bytes(b"1")
    calls = [
        lambda: os.stat(root / long),
        lambda: open(root / long, "wb"),
        lambda: os.mkdir(root / long),
        lambda: os.mkfifo(root / long),
        lambda: os.symlink("f", root / long),
        lambda: os.rename(root / "f", root / long),
        lambda: os.link(root / "f", root / long),
    ]
    for call in calls:
        with pytest.raises(OSError) as exc:
            call()
        assert exc.value.errno == errno.ENAMETOOLONG
    (root / ok).write_bytes(b"fits")
    assert (root / ok).read_bytes() == b"fits"
    assert os.statvfs(root).f_namemax == 255


def test_paths_up_to_4096_bytes(mounted):
    """Every driver holds any path the kernel passes (LMDB's keys over its 511 bytes go to its
    long-key store)."""
    part = "p" * 200
    depth = 19  # 19 folders of 201 bytes: a path of 3,819 bytes to the file, 4,020 in all
    folder = mounted.path
    refused = None
    for i in range(depth):
        try:
            os.mkdir(folder / part)
        except OSError as exc:
            refused = (i, exc.errno)
            break
        folder = folder / part
    assert refused is None
    leaf = folder / ("f" * 180)
    assert len(str(leaf.relative_to(mounted.path)).encode()) > 3990
    leaf.write_bytes(b"deep")
    assert leaf.read_bytes() == b"deep"
    assert os.listdir(folder) == [leaf.name]
    os.rename(leaf, folder / "g")
    os.unlink(folder / "g")


# ---------------------------------------------------------------------- 3. owners, modes, times
def test_new_nodes_belong_to_their_caller(shared):
    out = ok_as(shared.path, "mkdir d && touch f && ln -s f l && mkfifo p && stat -c '%n %u %g' d f l p")
    assert sorted(out.split("\n")[:-1]) == [f"{n} {NOBODY} {NOBODY}" for n in "dflp"]
    shared.stop()
    shared.start()
    for name in "dflp":
        st = os.lstat(shared.path / name)
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), name


def test_a_setgid_folder_passes_its_group_on(shared):
    g = shared.path / "g"
    g.mkdir()
    os.chown(g, 0, 1234)
    os.chmod(g, 0o2777)
    ok_as(g, "touch f && mkdir d && ln -s f l && mkfifo p")
    for name in "fdlp":
        assert os.lstat(g / name).st_gid == 1234, name
    assert os.lstat(g / "d").st_mode & stat.S_ISGID
    assert not os.lstat(g / "f").st_mode & stat.S_ISGID
    assert os.lstat(g / "f").st_uid == NOBODY


def test_suid_and_sgid_are_cleared_by_a_write_or_chown_of_another_user(shared):
    f = shared.path / "f"
    f.write_bytes(b"#!/bin/sh\n")
    os.chown(f, NOBODY, NOBODY)
    os.chmod(f, 0o6777)
    ok_as(shared.path, "echo more >> f")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o777
    os.chmod(f, 0o6777)
    ok_as(shared.path, f"chgrp {NOBODY} f")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o777
    os.chmod(f, 0o6777)
    ok_as(shared.path, "truncate -s 2 f")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o777
    os.chmod(f, 0o6777)  # root keeps them (CAP_FSETID)
    with open(f, "ab") as fh:
        fh.write(b"root")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o6777


def test_a_change_by_another_than_the_owner_clears_suid_and_sgid_as_ext4(shared):
    """The kernel leaves set-id bits to zarrfs (FUSE_HANDLE_KILLPRIV_V2): a write, an
    open(O_TRUNC) and a truncate by a user who does not own the file clear S_ISUID, and S_ISGID
    of a group-executable file, stored with the change; S_ISGID without group execute stays."""
    f = shared.path / "f"
    f.write_bytes(b"#!/bin/sh\n")
    os.chown(f, NOBODY, NOBODY)
    dd = "dd if=/dev/zero of=f bs=1 count=2 conv=notrunc"
    for script in ("echo more >> f", ": > f", "truncate -s 1 f", dd):
        os.chmod(f, 0o6777)
        ok_as(shared.path, script, uid=OTHER, gid=OTHER)
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o777, script
    os.chmod(f, 0o2666)
    ok_as(shared.path, "echo more >> f", uid=OTHER, gid=OTHER)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o2666
    os.chmod(f, 0o4755)
    ok_as(shared.path, "cat f >/dev/null", uid=OTHER, gid=OTHER)  # a read changes nothing
    shared.stop()
    shared.start()
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o4755


def changes_ctime(path: Path, action, follow: bool = True) -> None:
    before = os.stat(path, follow_symlinks=follow).st_ctime_ns
    time.sleep(0.01)
    action()
    assert os.stat(path, follow_symlinks=follow).st_ctime_ns > before, action


def test_ctime_changes_with_every_change_of_a_node(mounted):
    f = mounted.path / "f"
    f.write_bytes(b"data")
    changes_ctime(f, lambda: os.chmod(f, 0o600))
    changes_ctime(f, lambda: os.chown(f, 5, 6))
    changes_ctime(f, lambda: f.write_bytes(b"other"))
    changes_ctime(f, lambda: os.truncate(f, 1))
    changes_ctime(f, lambda: os.utime(f, (1, 2)))
    g = mounted.path / "g"
    before = os.stat(f).st_ctime_ns
    time.sleep(0.01)
    os.rename(f, g)
    assert os.stat(g).st_ctime_ns > before


def changes_folder(folder: Path, action) -> None:
    before = os.stat(folder)
    time.sleep(0.01)
    action()
    after = os.stat(folder)
    assert after.st_mtime_ns > before.st_mtime_ns, action
    assert after.st_ctime_ns > before.st_ctime_ns, action


def test_a_folder_changes_when_a_name_comes_or_goes(mounted):
    d, e = mounted.path / "d", mounted.path / "e"
    d.mkdir()
    e.mkdir()
    changes_folder(d, lambda: (d / "f").write_bytes(b"1"))
    changes_folder(d, lambda: (d / "empty").touch())
    changes_folder(d, lambda: os.mkdir(d / "sub"))
    changes_folder(d, lambda: os.mkfifo(d / "p"))
    changes_folder(d, lambda: os.symlink("f", d / "l"))
    changes_folder(d, lambda: os.link(d / "f", d / "h"))
    changes_folder(d, lambda: os.unlink(d / "h"))
    changes_folder(d, lambda: os.rmdir(d / "sub"))
    changes_folder(d, lambda: os.rename(d / "f", d / "f2"))
    changes_folder(d, lambda: os.rename(d / "f2", e / "f"))  # out of d
    changes_folder(e, lambda: os.rename(e / "f", d / "f"))  # out of e
    changes_folder(e, lambda: os.rename(d / "f", e / "f"))  # into e
    changes_folder(mounted.path, lambda: os.mkdir(mounted.path / "top"))
    # A zarr chunk: a temporary file renamed into its folder.
    changes_folder(d, lambda: ((d / "0.partial").write_bytes(b"c"), os.rename(d / "0.partial", d / "0")))
    # Explicit times of a folder stand, even against a file stored after them (an empty file
    # is stored at its release, which comes after close).
    (d / "late").touch()
    os.utime(d, (1_000_000_000, 1_000_000_000))
    time.sleep(0.2)
    assert os.stat(d).st_mtime == 1_000_000_000
    stamp = os.stat(d).st_mtime_ns, os.stat(e).st_mtime_ns
    mounted.stop()
    mounted.start()
    assert (os.stat(d).st_mtime_ns, os.stat(e).st_mtime_ns) == stamp


def test_a_sticky_folder_protects_the_names_of_others(shared):
    t = shared.path / "tmp"
    t.mkdir()
    os.chmod(t, 0o1777)
    ok_as(t, "touch mine && mkdir mydir")
    other = as_user(t, "rm -f mine", OTHER, OTHER)
    assert other.returncode != 0 and "not permitted" in other.stderr
    assert as_user(t, "mv mine stolen", OTHER, OTHER).returncode != 0
    assert as_user(t, "rmdir mydir", OTHER, OTHER).returncode != 0
    ok_as(t, "touch theirs", OTHER, OTHER)
    ok_as(t, "rm mine && rmdir mydir")
    assert os.listdir(t) == ["theirs"]


# ---------------------------------------------------------------------- 4. fstat after unlink
def test_an_open_file_keeps_its_attributes_after_its_unlink(mounted):
    f = mounted.path / "f"
    f.write_bytes(b"0123456789")
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink, stat.S_ISREG(st.st_mode)) == (10, 0, True)
        os.write(fd, b"abc")
        assert os.fstat(fd).st_size == 10
        os.ftruncate(fd, 20)
        assert os.fstat(fd).st_size == 20
        assert os.pread(fd, 3, 0) == b"abc"
    finally:
        os.close(fd)
    assert not f.exists()


@pytest.mark.parametrize("gone", ["unlinked", "replaced", "replaced-new"])
def test_an_unlinked_open_file_takes_fchmod_fchown_and_futimens(mounted, gone):
    """The kernel sends them as SETATTRs of the node without a handle: the node's handles
    answer (a file read-only opened keeps its mode too). The name may be gone by an unlink or
    by a rename of another file onto it (``replaced``; ``replaced-new``: a file the open
    made, not stored yet); after a rename they were ENOENT (the long model found it)."""
    f = mounted.path / "f"
    if gone == "replaced-new":
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    else:
        f.write_bytes(b"x")
        os.chmod(f, 0o600)
        fd = os.open(f, os.O_RDONLY)
    try:
        if gone == "unlinked":
            os.unlink(f)
        else:
            (mounted.path / "other").write_bytes(b"other")
            os.rename(mounted.path / "other", f)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        os.fchmod(fd, 0o640)
        os.fchown(fd, 1234, 5678)
        os.utime(fd, ns=(10**18, 2 * 10**18))
        st = os.fstat(fd)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, st.st_nlink) == (
            0o640,
            1234,
            5678,
            2 * 10**18,
            0,
        )
    finally:
        os.close(fd)
    assert os.listdir(mounted.path) == ([] if gone == "unlinked" else ["f"])
    if gone != "unlinked":
        assert f.read_bytes() == b"other" and stat.S_IMODE(os.stat(f).st_mode) != 0o640


def test_a_file_open_twice_around_a_utime_shows_a_write_through_the_first(mounted):
    """A ``utime`` stores a new mtime, which tells versions of a file apart: the second open
    took it for another version and gave its descriptor a state of its own, and ``stat``
    showed the stored size, not the first descriptor's write, until the close (the long
    model found it)."""
    f = mounted.path / "f"
    f.write_bytes(b"a" * 21)
    fd0 = os.open(f, os.O_RDWR | os.O_APPEND)
    os.utime(f, ns=(10**18, 10**18))
    fd1 = os.open(f, os.O_RDWR)
    try:
        os.write(fd0, b"b" * 9)
        assert (os.stat(f).st_size, os.fstat(fd0).st_size, os.fstat(fd1).st_size) == (30, 30, 30)
        assert os.pread(fd1, 30, 0) == b"a" * 21 + b"b" * 9
        os.pwrite(fd1, b"c", 0)
    finally:
        os.close(fd0)
        os.close(fd1)
    assert f.read_bytes() == b"c" + b"a" * 20 + b"b" * 9


# ---------------------------------------------------------------------- 5. fallocate
def test_fallocate_grows_a_file_with_zeros_stored_at_close(mounted):
    f = mounted.path / "f"
    f.write_bytes(b"head")
    fd = os.open(f, os.O_RDWR)
    try:
        fallocate(fd, 0, 8192, 1000)
        assert os.fstat(fd).st_size == 9192
        fallocate(fd, 0, 0, 10)  # inside the file: nothing changes
        assert os.fstat(fd).st_size == 9192
        with pytest.raises(OSError) as exc:
            fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 100_000)
        assert exc.value.errno == errno.EOPNOTSUPP
        # A mode asked for and refused is routine (rsync --preallocate asks it of every file):
        # no line in the daemon's log.
        assert "ENOTSUP" not in mounted.log_text()
        os.posix_fallocate(fd, 0, 10_000)
    finally:
        os.close(fd)
    mounted.stop()
    mounted.start()
    assert f.read_bytes() == b"head" + bytes(10_000 - 4)
    with open(f, "rb") as fh, pytest.raises(OSError) as exc:
        fallocate(fh.fileno(), 0, 0, 100_000)
    assert exc.value.errno == errno.EBADF

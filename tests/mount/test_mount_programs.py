"""What real programs (CPython's tests, fsstress, tar, rsync, overlayfs) ask of a mount beyond
the POSIX suites, through real mounts of every driver."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest
from mounting import needs_fuse, read, stored, write

pytestmark = needs_fuse

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_WHITEOUT = 4
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 1, 2, 0x10


def _check(result: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def renameat2(old, new, flags: int) -> None:
    _check(_libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags))


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    _check(_libc.fallocate(fd, mode, offset, length))


def test_what_the_mount_does_not_do_is_refused_never_ignored(mounted):
    root = mounted.path
    write(root / "a", b"alpha")
    # RENAME_WHITEOUT (overlayfs) would leave a whiteout at the old name: not done, so EINVAL
    # and nothing moved.
    with pytest.raises(OSError) as exc:
        renameat2(root / "a", root / "b", RENAME_WHITEOUT)
    assert exc.value.errno == errno.EINVAL
    assert read(root / "a") == b"alpha" and not os.path.exists(root / "b")
    # fallocate: reserving space while keeping the size is refused (nothing is reserved).
    fd = os.open(root / "a", os.O_RDWR)
    try:
        with pytest.raises(OSError) as exc:
            fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 4096)
        assert exc.value.errno == errno.EOPNOTSUPP
        fallocate(fd, 0, 0, 8)
        assert os.fstat(fd).st_size == 8
    finally:
        os.close(fd)
    assert read(root / "a") == b"alpha\0\0\0"
    # O_TMPFILE: refused (no nameless file), never a file with a name.
    with pytest.raises(OSError) as exc:
        os.open(root, os.O_TMPFILE | os.O_RDWR, 0o600)
    assert exc.value.errno in (errno.EOPNOTSUPP, errno.EISDIR)
    assert sorted(os.listdir(root)) == ["a"]
    # copy_file_range: done by the kernel's read and write, so the bytes arrive.
    src, dst = os.open(root / "a", os.O_RDONLY), os.open(root / "c", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.copy_file_range(src, dst, 8, offset_src=0, offset_dst=3) == 8
    finally:
        os.close(src)
        os.close(dst)
    assert read(root / "c") == b"\0\0\0alpha\0\0\0"
    # An ioctl the mount does not know: refused.
    import fcntl

    fd = os.open(root / "a", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as exc:
            fcntl.ioctl(fd, 0x80086601, b"\0" * 8)  # FS_IOC_GETFLAGS
        assert exc.value.errno in (errno.ENOTTY, errno.ENOSYS, errno.EOPNOTSUPP)
    finally:
        os.close(fd)


def _punch_and_zero(path, size: int) -> bytes:
    """Punch a hole in, and zero ranges of, the file at ``path`` (``size`` random bytes), then
    check what it reads, before and after the descriptor is closed."""
    data = bytearray(os.urandom(size))
    path.write_bytes(data)
    third = size // 3
    fd = os.open(path, os.O_RDWR)
    try:
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, third, third + 10)
        data[third : 2 * third + 10] = bytes(third + 10)
        # A hole past the end changes nothing and keeps the size.
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, size + 100, 4096)
        assert os.fstat(fd).st_size == size
        assert os.pread(fd, size + 10, 0) == bytes(data)
        try:
            fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 5, 7)
            fallocate(fd, FALLOC_FL_ZERO_RANGE, size - 3, 13)  # grows the file to its end
        except OSError as exc:  # a kernel that does not pass ZERO_RANGE on to FUSE
            assert exc.errno == errno.EOPNOTSUPP
        else:
            data[5:12] = bytes(7)
            data[size - 3 :] = bytes(13)
            assert os.fstat(fd).st_size == size + 10
    finally:
        os.close(fd)
    assert read(path) == bytes(data)
    return bytes(data)


def test_fallocate_punches_holes_and_zeroes_ranges(mounted):
    _punch_and_zero(mounted.path / "small", 10000)


def test_fallocate_punches_a_hole_in_a_parted_file(db_url, mount_factory):
    m = mount_factory(db_url, ["create", "parts_above=1M"])
    data = _punch_and_zero(m.path / "big", 3 * (1 << 20) + 17)
    m.stop()
    m.start()  # what was stored, read through a fresh mount
    assert read(m.path / "big") == data


def test_readdir_gives_the_inode_numbers_stat_gives(mounted):
    root = mounted.path
    os.makedirs(root / "d/sub")
    for i in range(50):
        write(root / f"d/f{i}", b"x")
    os.symlink("f0", root / "d/link")
    # A fresh listing (nothing of it looked up yet by this process) and stat after it.
    listed = {e.name: e.inode() for e in os.scandir(root / "d")}
    assert len(listed) == 52
    for name, ino in listed.items():
        assert os.lstat(root / "d" / name).st_ino == ino, name
    assert len(set(listed.values())) == 52
    assert os.stat(root / "d").st_ino == os.stat(root / "d/sub/..").st_ino


def test_paths_a_thousand_folders_deep(mounted):
    root = mounted.path
    deep = os.path.join(*["d"] * 1000)
    for level in range(1, 1001):
        os.mkdir(root / os.path.join(*["d"] * level))
    write(root / deep / "0.0", b"bottom")  # stored at its close
    assert read(root / deep / "0.0") == b"bottom"
    assert os.listdir(root / deep) == ["0.0"]
    os.rename(root / deep / "0.0", root / deep / "1.0")
    assert read(root / deep / "1.0") == b"bottom"
    os.unlink(root / deep / "1.0")
    assert os.listdir(root / deep) == []


def test_any_name_posix_allows(mounted):
    root = os.fsencode(mounted.path)
    latin1, raw, back = b"caf\xe9.txt", b"\xff\xfe\x80", b"a\\b"
    longest = b"\xe9" * 255
    for name in (latin1, raw, back, longest):
        write(os.path.join(root, name), name)
    os.mkdir(os.path.join(root, b"d\xe9"))
    write(os.path.join(root, b"d\xe9", raw), b"inside")
    # Listings give the bytes back; each name opens its own file.
    assert sorted(os.listdir(root)) == sorted([latin1, raw, back, longest, b"d\xe9"])
    assert os.listdir(os.path.join(root, b"d\xe9")) == [raw]
    for name in (latin1, raw, back, longest):
        assert read(os.path.join(root, name)) == name
    # The key is UTF-8 text (zarr-python 2 and every database can hold and list it): each
    # byte that is not UTF-8 is U+EF80 + (byte - 0x80).
    assert stored(mounted.url, "caf\uefe9.txt") == latin1
    assert stored(mounted.url, "d\uefe9/\uefff\ueffe\uef80") == b"inside"
    os.rename(os.path.join(root, latin1), os.path.join(root, b"\xe9t\xe9"))
    assert read(os.path.join(root, b"\xe9t\xe9")) == latin1
    # A name that is not there is ENOENT, whatever its bytes; one holding a character kept
    # for such bytes cannot be made (EILSEQ); a longer name is ENAMETOOLONG.
    kept = "x\uef80".encode()
    for name in (b"nope\xe9", b"\xc3", kept, "x\udc80".encode("utf-8", "surrogatepass")):
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(root, name))
    with pytest.raises(OSError) as exc:
        write(os.path.join(root, kept), b"x")
    assert exc.value.errno == errno.EILSEQ
    with pytest.raises(OSError) as exc:
        write(os.path.join(root, b"\xe9" * 256), b"x")
    assert exc.value.errno == errno.ENAMETOOLONG
    os.unlink(os.path.join(root, raw))
    assert raw not in os.listdir(root)


def test_a_backslash_is_refused_only_inside_a_zarr_node(mounted):
    root = mounted.path
    os.makedirs(root / "plain")
    write(root / "plain/a\\b", b"1")  # a zip's or a Windows tool's name
    assert os.listdir(root / "plain") == ["a\\b"]
    os.makedirs(root / "grp")
    write(root / "grp/.zgroup", b'{"zarr_format": 2}')
    with pytest.raises(OSError) as exc:
        write(root / "grp/a\\b", b"1")  # zarr-python 2 would read it as grp/a/b
    assert exc.value.errno == errno.EINVAL


def test_extended_attributes_are_kept(mounted):
    root = mounted.path
    os.makedirs(root / "d")
    write(root / "d/f", b"data")
    f = root / "d/f"
    assert os.listxattr(f) == []
    with pytest.raises(OSError) as exc:
        os.getxattr(f, "user.missing")
    assert exc.value.errno == errno.ENODATA
    os.setxattr(f, "user.mime", b"text/plain")
    os.setxattr(f, "user.empty", b"")
    os.setxattr(root / "d", "user.folder", b"\0\xff")
    os.setxattr(f, "trusted.t", b"root only")  # the tests run as root
    assert sorted(os.listxattr(f)) == ["trusted.t", "user.empty", "user.mime"]
    assert os.getxattr(f, "user.mime") == b"text/plain" and os.getxattr(f, "user.empty") == b""
    assert os.getxattr(root / "d", "user.folder") == b"\0\xff"
    # XATTR_CREATE / XATTR_REPLACE
    with pytest.raises(FileExistsError):
        os.setxattr(f, "user.mime", b"x", os.XATTR_CREATE)
    with pytest.raises(OSError) as exc:
        os.setxattr(f, "user.new", b"x", os.XATTR_REPLACE)
    assert exc.value.errno == errno.ENODATA
    os.setxattr(f, "user.mime", b"text/csv", os.XATTR_REPLACE)
    # ext4's limits: all of a node's attributes in one 4 KiB block (ENOSPC), a value of 64 KiB
    # at most (E2BIG), a name of 255 bytes at most (ERANGE).
    os.setxattr(f, "user.big", b"v" * 3900)
    with pytest.raises(OSError) as exc:
        os.setxattr(f, "user.big2", b"v" * 200)
    assert exc.value.errno == errno.ENOSPC
    os.removexattr(f, "user.big")
    with pytest.raises(OSError) as exc:
        os.setxattr(f, "user.huge", b"v" * 65537)
    assert exc.value.errno == errno.E2BIG
    with pytest.raises(OSError) as exc:
        os.setxattr(f, "user." + "n" * 251, b"v")
    assert exc.value.errno == errno.ERANGE
    # A namespace with no name after it: EINVAL, as ext4 and tmpfs answer (it was stored).
    for call in (
        lambda: os.setxattr(f, "user.", b"v"),
        lambda: os.getxattr(f, "user."),
        lambda: os.getxattr(f, "security."),
        lambda: os.removexattr(f, "trusted."),
    ):
        with pytest.raises(OSError) as exc:
            call()
        assert exc.value.errno == errno.EINVAL
    # POSIX ACLs are not kept: refused, as on a filesystem mounted noacl.
    with pytest.raises(OSError) as exc:
        os.setxattr(f, "system.posix_acl_access", b"\2\0\0\0")
    assert exc.value.errno == errno.EOPNOTSUPP
    # Kept by rename (of the file and of its folder), by hard links, gone with the file.
    os.rename(f, root / "d/g")
    os.rename(root / "d", root / "e")
    assert os.getxattr(root / "e/g", "user.mime") == b"text/csv"
    assert os.getxattr(root / "e", "user.folder") == b"\0\xff"
    os.link(root / "e/g", root / "e/h")
    os.setxattr(root / "e/h", "user.both", b"1")
    assert os.getxattr(root / "e/g", "user.both") == b"1"
    os.unlink(root / "e/g")
    assert os.getxattr(root / "e/h", "user.mime") == b"text/csv"
    os.removexattr(root / "e/h", "user.mime")
    with pytest.raises(OSError) as exc:
        os.removexattr(root / "e/h", "user.mime")
    assert exc.value.errno == errno.ENODATA
    os.unlink(root / "e/h")
    write(root / "e/h", b"new")
    assert os.listxattr(root / "e/h") == []
    # A file open and not stored yet: set through its descriptor, and kept.
    fd = os.open(root / "e/new", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.listxattr(fd) == []
        os.write(fd, b"x")
        os.setxattr(fd, "user.early", b"1")
    finally:
        os.close(fd)
    assert os.getxattr(root / "e/new", "user.early") == b"1" and read(root / "e/new") == b"x"


def test_zarrfs_copy_carries_extended_attributes(db_url, mount_factory, tmp_path):
    import zarrfs

    src = tmp_path / "src"
    os.makedirs(src / "grp/arr")
    write(src / "grp/arr/0.0", b"chunk")
    try:
        os.setxattr(src / "grp/arr/0.0", "user.checksum", b"abc")
        os.setxattr(src / "grp", "user.note", b"folder")
    except OSError as exc:
        pytest.skip(f"the test folder keeps no extended attributes: {exc}")
    zarrfs.copy(str(src), db_url)  # folder -> database
    out = tmp_path / "out"
    zarrfs.copy(db_url, str(out))  # database -> folder
    assert os.getxattr(out / "grp/arr/0.0", "user.checksum") == b"abc"
    assert os.getxattr(out / "grp", "user.note") == b"folder"
    m = mount_factory(db_url)
    assert os.getxattr(m.path / "grp/arr/0.0", "user.checksum") == b"abc"
    assert os.getxattr(m.path / "grp", "user.note") == b"folder"


def _hierarchy(root) -> None:
    """A consolidated zarr v2 hierarchy as zarr-python writes it (two arrays in a group)."""
    import json

    zarray = {
        "zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i4", "compressor": None,
        "fill_value": 0, "order": "C", "filters": None,
    }  # fmt: skip
    docs = {".zgroup": {"zarr_format": 2}, "a/.zarray": zarray, "b/.zarray": zarray, "b/.zattrs": {"x": 1}}
    for key, doc in docs.items():
        os.makedirs(os.path.dirname(os.path.join(root, key)), exist_ok=True)
        write(os.path.join(root, key), json.dumps(doc, indent=4, sort_keys=True).encode())
    consolidated = {"metadata": docs, "zarr_consolidated_format": 1}
    write(os.path.join(root, ".zmetadata"), json.dumps(consolidated, indent=1).encode())
    write(os.path.join(root, "a/0"), b"\0" * 8)
    os.utime(os.path.join(root, ".zmetadata"), ns=(1_000_000_000, 1_000_000_000))


@pytest.mark.parametrize("tool", ["cp", "rsync"])
def test_copying_a_hierarchy_in_keeps_its_consolidated_metadata(mounted, tmp_path, tool):
    import subprocess

    src = tmp_path / "src"
    _hierarchy(src)
    dst = mounted.path / "h"
    if tool == "cp":
        subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    else:
        subprocess.run(["rsync", "-a", f"{src}/", f"{dst}/"], check=True)
    assert read(dst / ".zmetadata") == read(src / ".zmetadata")
    assert os.stat(dst / ".zmetadata").st_mtime_ns == 1_000_000_000
    assert read(dst / "b/.zattrs") == read(src / "b/.zattrs")

"""The POSIX calls a DirectoryStore user makes, through real mounts of every driver."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import stat
import subprocess

import pytest
from mounting import eventually, needs_fuse, read, unavailable, write

from zarrfs.backends import open_driver
from zarrfs.fuse import abi as k

pytestmark = needs_fuse

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]


def renameat2(old: str, new: str, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, old.encode(), AT_FDCWD, new.encode(), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def resident(path) -> list[bool]:
    """Which pages of the file the kernel's page cache holds (``mincore`` of a mapping: it
    reads nothing)."""
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        finally:
            _libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return [bool(b & 1) for b in vec]


def test_files_sizes_and_listing(mounted):
    root = mounted.path
    os.makedirs(root / "grp/arr")
    write(root / "grp/arr/0.0", b"x" * 12345)
    write(root / "grp/.zgroup", b'{"zarr_format": 2}')
    assert os.stat(root / "grp/arr/0.0").st_size == 12345
    assert read(root / "grp/arr/0.0") == b"x" * 12345
    kinds = {e.name: e.is_dir() for e in os.scandir(root / "grp")}
    assert kinds == {"arr": True, ".zgroup": False}
    st = os.stat(root / "grp/arr/0.0")
    assert st.st_blksize >= 128 * 1024
    assert st.st_blocks * 512 >= 12345


def test_random_writes_append_truncate(mounted):
    p = mounted.path / "f"
    with open(p, "wb") as fh:
        fh.write(b"abc")
        fh.seek(10)
        fh.write(b"Z")
    assert read(p) == b"abc" + bytes(7) + b"Z"
    with open(p, "r+b") as fh:
        fh.seek(1)
        fh.write(b"BB")
        fh.truncate(5)
    assert read(p) == b"aBB\0\0"
    with open(p, "ab") as fh:
        fh.write(b"++")
    assert read(p) == b"aBB\0\0++"
    os.truncate(p, 100)
    assert os.stat(p).st_size == 100 and read(p)[-1:] == b"\0"
    os.truncate(p, 2)
    assert read(p) == b"aB"
    fd = os.open(p, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, b"new")
        os.fsync(fd)
        assert os.fstat(fd).st_size == 3
    finally:
        os.close(fd)
    assert read(p) == b"new"


def test_a_written_file_is_cached_whole_last_page_too(mounted):
    """What was written through the mount stays in the kernel's page cache, including a last
    page the writes covered only in part: reading the file back does not reach the database."""
    root = mounted.path
    data = os.urandom(3 * mmap.PAGESIZE + 100)
    write(root / "f", data)
    assert resident(root / "f") == [True] * 4
    assert read(root / "f") == data
    write(root / "c.partial", data[:5000])  # zarr-python's write-then-rename
    os.rename(root / "c.partial", root / "c")
    assert resident(root / "c") == [True, True]
    assert read(root / "c") == data[:5000]
    write(root / "f", data[:5000])  # rewritten shorter: the new last page, not the old one
    assert resident(root / "f") == [True, True]
    assert read(root / "f") == data[:5000]
    with open(root / "f", "r+b") as fh:  # a change in the middle of the last page
        fh.seek(4100)
        fh.write(b"zz")
    assert read(root / "f") == data[:4100] + b"zz" + data[4102:5000]


def direct_io_mappable(m) -> bool:
    """Whether the kernel agreed to map files read past its page cache (the daemon's log)."""
    found = re.search(r"FUSE 7\.\d+ agreed with the kernel, flags (0x[0-9a-f]+)", m.log_text())
    assert found, "the debug log names the agreed flags"
    return bool(int(found.group(1), 16) & k.DIRECT_IO_ALLOW_MMAP)


def test_a_file_read_once_through_a_fresh_mount_leaves_the_page_cache_alone(db_url, mount_factory):
    """A first reading goes past the kernel's page cache (the content crosses memory once),
    a second one caches the file, and a mapping of a file opened for the first time works;
    ``-o direct_above=off`` caches at once."""
    data = os.urandom(300_000)
    first = mount_factory(db_url, ["create"])
    write(first.path / "c", data)
    first.stop()
    m = mount_factory(db_url, [])
    if not direct_io_mappable(m):
        pytest.skip("this kernel cannot map files opened with FOPEN_DIRECT_IO (FUSE 7.39)")
    assert read(m.path / "c") == data
    assert not any(resident(m.path / "c"))
    assert read(m.path / "c") == data
    assert all(resident(m.path / "c"))
    m.stop()
    m = mount_factory(db_url, [])
    with open(m.path / "c", "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data
    m.stop()
    m = mount_factory(db_url, ["direct_above=off"])
    assert read(m.path / "c") == data
    assert all(resident(m.path / "c"))


def test_sharded_style_range_reads(mounted):
    p = mounted.path / "shard"
    payload = bytes(range(256)) * 4096
    write(p, payload)
    with open(p, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        assert end == len(payload)
        fh.seek(end - 100)
        assert fh.read() == payload[-100:]
        fh.seek(5000)
        assert fh.read(10) == payload[5000:5010]


def test_mkdir_rmdir_errors(mounted):
    root = mounted.path
    os.mkdir(root / "d")
    with pytest.raises(FileExistsError):
        os.mkdir(root / "d")
    with pytest.raises(FileNotFoundError):
        os.mkdir(root / "missing/child")
    write(root / "d/f", b"1")
    with pytest.raises(OSError) as info:
        os.rmdir(root / "d")
    assert info.value.errno == errno.ENOTEMPTY
    os.unlink(root / "d/f")
    assert os.listdir(root / "d") == []  # the folder outlives its last file
    os.rmdir(root / "d")
    assert not os.path.exists(root / "d")


def test_empty_folders_and_attrs_persist_across_remount(db_url, mount_factory, tmp_path):
    m = mount_factory(db_url, ["create"])
    os.makedirs(m.path / "a/b/c")
    write(m.path / "a/f", b"data")
    os.chmod(m.path / "a/f", 0o640)
    os.utime(m.path / "a/f", ns=(1_600_000_000_123_456_789, 1_500_000_000_987_654_321))
    os.chmod(m.path / "a/b", 0o700)
    before = os.stat(m.path / "a/f")
    m.stop()
    m2 = mount_factory(db_url, name="again")
    assert os.path.isdir(m2.path / "a/b/c")
    st = os.stat(m2.path / "a/f")
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_mtime_ns == 1_500_000_000_987_654_321 == before.st_mtime_ns
    assert stat.S_IMODE(os.stat(m2.path / "a/b").st_mode) == 0o700


def test_a_file_created_read_only_is_stored(db_url, mount_factory):
    """``open(O_CREAT | O_RDONLY)`` makes a file (pjdfstest's ``create`` does): it is stored at
    the last close, as a writer's new file is, though nothing was written (it was forgotten)."""
    m = mount_factory(db_url, ["create"])
    os.close(os.open(m.path / "r", os.O_CREAT | os.O_RDONLY | os.O_EXCL, 0o640))
    os.mkdir(m.path / "d")
    fd = os.open(m.path / "d" / "kept-open", os.O_CREAT | os.O_RDONLY, 0o600)
    try:
        assert sorted(os.listdir(m.path / "d")) == ["kept-open"]  # listed while open
    finally:
        os.close(fd)
    m.stop()
    m2 = mount_factory(db_url, name="again")
    for path, mode in (("r", 0o640), ("d/kept-open", 0o600)):
        st = os.stat(m2.path / path)
        assert (stat.S_IMODE(st.st_mode), st.st_size) == (mode, 0), path


def test_a_folder_changes_when_a_file_is_made_in_it_while_that_file_is_open(mounted):
    """Creating a file changes its folder's mtime and ctime at once, as POSIX says, though the
    mount stores the file only at its close: a ``stat`` of the folder while the new file is
    open shows the change, and the close keeps it (found by the model test, with the folder's
    times set back first)."""
    folder = mounted.path / "d"
    folder.mkdir()
    old = 1_000_000_000 * 10**9
    os.utime(folder, ns=(old, old))
    fd = os.open(folder / "new", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        while_open = os.stat(folder)
        assert while_open.st_mtime_ns > old and while_open.st_ctime_ns >= while_open.st_mtime_ns
        os.write(fd, b"x")
        os.listdir(mounted.path)  # a listing's attributes (READDIRPLUS) show it too
        assert os.stat(folder).st_mtime_ns > old
    finally:
        os.close(fd)
    after = os.stat(folder)
    assert after.st_mtime_ns > old
    os.utime(folder, ns=(old, old))  # a temporary file, held unstored after its close
    (folder / "t.partial").write_bytes(b"held")
    os.listdir(mounted.path)
    assert os.stat(folder).st_mtime_ns > old


def test_rename_files_and_folders(mounted):
    root = mounted.path
    os.makedirs(root / "src/sub")
    write(root / "src/sub/0.0", b"chunk")
    write(root / "src/notes.txt", b"{}")
    write(root / "other", b"old")
    os.rename(root / "src", root / "dst")
    assert not os.path.exists(root / "src")
    assert read(root / "dst/sub/0.0") == b"chunk"
    write(root / "tmp.partial", b"new")
    os.replace(root / "tmp.partial", root / "other")  # replaces atomically
    assert read(root / "other") == b"new"
    assert not os.path.exists(root / "tmp.partial")
    os.mkdir(root / "empty")
    os.rename(root / "dst", root / "empty")  # a folder replaces an empty folder
    assert read(root / "empty/sub/0.0") == b"chunk"
    os.mkdir(root / "full")
    write(root / "full/x", b"")
    with pytest.raises(OSError) as info:
        os.rename(root / "empty", root / "full")
    assert info.value.errno == errno.ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        os.rename(root / "other", root / "full")
    with pytest.raises(OSError) as info:
        os.rename(root / "empty", root / "empty/sub/inside")
    assert info.value.errno == errno.EINVAL


def test_rename_noreplace_and_exchange(mounted):
    root = str(mounted.path)
    write(f"{root}/a", b"A")
    write(f"{root}/b", b"B")
    with pytest.raises(FileExistsError):
        renameat2(f"{root}/a", f"{root}/b", RENAME_NOREPLACE)
    renameat2(f"{root}/a", f"{root}/b", RENAME_EXCHANGE)
    assert read(f"{root}/a") == b"B" and read(f"{root}/b") == b"A"
    renameat2(f"{root}/a", f"{root}/c", RENAME_NOREPLACE)
    assert read(f"{root}/c") == b"B" and not os.path.exists(f"{root}/a")


def test_link_is_atomic_create_if_absent(mounted):
    root = mounted.path
    first = b'{"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}'
    second = b'{"zarr_format": 3, "node_type": "group", "attributes": {"b": 2}}'
    write(root / "zarr.tmp.partial", first)
    os.link(root / "zarr.tmp.partial", root / "zarr.json")
    os.unlink(root / "zarr.tmp.partial")
    assert read(root / "zarr.json") == first
    write(root / "zarr.tmp2.partial", second)
    with pytest.raises(FileExistsError):
        os.link(root / "zarr.tmp2.partial", root / "zarr.json")
    assert read(root / "zarr.json") == first
    assert sorted(os.listdir(root)) == ["zarr.json", "zarr.tmp2.partial"]
    os.unlink(root / "zarr.tmp2.partial")
    assert os.listdir(root) == ["zarr.json"]


def test_symlinks(mounted):
    root = mounted.path
    write(root / "target", b"T")
    os.symlink("target", root / "ln")
    assert os.readlink(root / "ln") == "target"
    assert read(root / "ln") == b"T"
    assert os.path.islink(root / "ln")
    os.unlink(root / "ln")
    assert not os.path.lexists(root / "ln")


def test_open_file_is_visible_and_commits_on_close(mounted):
    p = mounted.path / "x"
    fh = open(p, "wb")
    try:
        fh.write(b"12345")
        fh.flush()
        assert os.stat(p).st_size == 5
        assert "x" in os.listdir(mounted.path) or os.path.exists(p)
    finally:
        fh.close()
    assert read(p) == b"12345"


def test_statfs_is_real(mounted):
    st = os.statvfs(mounted.path)
    assert st.f_blocks > 0 and st.f_bavail > 0 and st.f_bsize > 0


def test_readonly_mount_refuses_writes(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    write(m.path / "f", b"1")
    m.stop()
    ro = mount_factory(db_url, ["ro"], name="ro")
    assert read(ro.path / "f") == b"1"
    for action in (
        lambda: write(ro.path / "g", b"2"),
        lambda: os.mkdir(ro.path / "d"),
        lambda: os.unlink(ro.path / "f"),
        lambda: os.rename(ro.path / "f", ro.path / "h"),
    ):
        with pytest.raises(OSError) as info:
            action()
        assert info.value.errno == errno.EROFS


def test_key_and_folder_of_same_name_folder_wins(db_url, mount_factory, tmp_path):
    driver = open_driver(db_url)
    driver.put("a", b"hidden file")
    driver.put("a/b", b"inside")
    driver.close()
    m = mount_factory(db_url)
    assert os.path.isdir(m.path / "a")
    assert os.listdir(m.path) == ["a"]
    assert read(m.path / "a/b") == b"inside"
    assert "hidden by the folder" in m.log_text()
    driver = open_driver(db_url)
    assert driver.get("a") == b"hidden file"  # nothing deleted
    driver.close()


def test_keys_naming_dot_or_dotdot_are_not_listed(db_url, mount_factory):
    """A database another program wrote may hold keys with a ``.`` or ``..`` segment (``.``,
    ``../x``, ``a/./c``, as a zip archive may): no path reaches them, and listings gave them
    as names beside a folder's own ``.`` and ``..`` (``ls -a`` showed two of each)."""
    driver = open_driver(db_url)
    dotted = (".", "..", "../evil", "./x", "a/./c", "a/../d", "a/..")
    for key in (*dotted, "a/ok", "b..", ".z", "...", "a/.../e"):
        driver.put(key, b"x")
    driver.close()
    m = mount_factory(db_url)

    def listed(folder):
        ls = subprocess.run(["ls", "-a1", str(folder)], capture_output=True, text=True, check=True)
        return ls.stdout.split()

    assert listed(m.path) == [".", "..", "...", ".z", "a", "b.."]
    assert listed(m.path / "a") == [".", "..", "...", "ok"]
    assert sorted(os.listdir(m.path / "a/...")) == ["e"]


def test_large_folder_streams(mounted):
    driver = open_driver(mounted.url)
    names = [f"{i}.{j}" for i in range(30) for j in range(100)]
    driver.transact(lambda t: [t.put(f"big/{n}", b"v") for n in names])
    driver.close()
    eventually(lambda: (mounted.path / "big").exists(), "big through the mount")  # see below
    listed = os.listdir(mounted.path / "big")
    assert sorted(listed) == sorted(names)
    with os.scandir(mounted.path / "big") as it:
        assert all(e.is_file() for e in it)


def test_nested_chunks_are_folders(mounted):
    driver = open_driver(mounted.url)
    driver.transact(lambda t: [t.put(f"arr/{i}/{j}", b"c") for i in range(12) for j in range(3)])
    driver.transact(lambda t: t.put("arr/1.x", b"file beside folder 1"))
    driver.close()
    # Written by another client: on a server the mount shows the new name once its change
    # feed tells (README, consistency), which a busy machine may make a moment.
    eventually(lambda: (mounted.path / "arr" / "1.x").exists(), "arr/1.x through the mount")
    entries = {e.name: e.is_dir() for e in os.scandir(mounted.path / "arr")}
    assert entries == {**{str(i): True for i in range(12)}, "1.x": False}
    assert sorted(os.listdir(mounted.path / "arr/10")) == ["0", "1", "2"]


def test_folders_named_as_prefixes_of_their_siblings_are_listed_once(mounted, mount_factory):
    """``foo`` beside ``foo-max``, ``foo.bar``, ``foo bar``, ``foo!``: in the database the keys
    of ``foo-max/`` sort before those of ``foo/`` ('-' < '/'), the mkdir markers by name; each
    folder is listed once, before and after a remount, and zarr sees each group once."""
    import zarr

    names = ["foo", "foo-max", "foo.bar", "foo bar", "foo!", "fo", "foo0"]
    root = zarr.open_group(mounted.path / "g", mode="w")
    for name in names:
        root.create_group(name)
    os.mkdir(mounted.path / "g" / "foo-")  # empty: a marker alone
    write(mounted.path / "g" / "foo.txt", b"file")
    expected = sorted([*names, "foo-", "foo.txt", "zarr.json"])
    listed = os.listdir(mounted.path / "g")
    assert sorted(listed) == expected, listed
    assert sorted(zarr.open_group(mounted.path / "g", mode="r").group_keys()) == sorted(names)
    mounted.stop()
    again = mount_factory(mounted.url, [], name="again")
    assert sorted(os.listdir(again.path / "g")) == expected
    assert sorted(zarr.open_group(again.path / "g", mode="r").group_keys()) == sorted(names)


def test_a_held_temporary_file_reopened_and_unlinked_stays_usable(mounted):
    """A closed ``*.partial`` is held by the daemon until its rename; opened again and then
    unlinked, its open descriptor goes on working, as an unlinked file's does."""
    p = mounted.path / "a.partial"
    p.write_bytes(b"abc")
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        os.ftruncate(fd, 10)
        assert os.pwrite(fd, b"xy", 1) == 2
        assert os.pread(fd, 20, 0) == b"axy" + bytes(7)
    finally:
        os.close(fd)
    assert not p.exists() and "a.partial" not in os.listdir(mounted.path)


def test_a_held_temporary_file_renamed_onto_a_symlink_replaces_it(mounted):
    root = mounted.path
    os.symlink("nowhere", root / "u")
    (root / "c.partial").write_bytes(b"abc")
    os.rename(root / "c.partial", root / "u")
    assert not os.path.islink(root / "u") and (root / "u").read_bytes() == b"abc"
    assert sorted(os.listdir(root)) == ["u"]


def test_a_folder_reports_nlink_1_and_find_still_walks_every_folder(mounted):
    """A folder is a key prefix, not a stored entry: counting its subfolders for ``st_nlink``
    would cost a scan of everything below it at every ``stat``. It reports 1, Linux's
    "not counted" (as pjdfstest's rename/24.t notes for btrfs), and tools then do not guess
    from it: GNU find's leaf optimisation (nlink - 2 subfolders) stays off and every folder is
    walked. The files inside count as usual."""
    root = mounted.path
    for path in ("a/b/c", "a/d", "a/e/f/g", "h"):
        os.makedirs(root / path)
    (root / "a" / "b" / "c" / "0.0").write_bytes(b"x")
    assert {os.lstat(root / p).st_nlink for p in ("a", "a/b", "a/e/f", "h")} == {1}
    out = subprocess.run(["find", str(root), "-type", "d"], capture_output=True, text=True, check=True)
    found = sorted(os.path.relpath(line, root) for line in out.stdout.split())
    assert found == [".", "a", "a/b", "a/b/c", "a/d", "a/e", "a/e/f", "a/e/f/g", "h"]
    assert os.lstat(root / "a" / "b" / "c" / "0.0").st_nlink == 1


@pytest.mark.serial  # drop_caches: every mount of the machine forgets, other tests' too
def test_an_inode_number_survives_the_kernel_forgetting_the_node(mounted):
    """The kernel forgets nodes under memory pressure (here: ``drop_caches``); a file looked up
    again keeps its inode number, across a rename too, as on a local disk (pjdfstest's
    rename/00 compares them; ``tar`` and ``rsync -H`` pair hard links by them)."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        unavailable("dropping the kernel's caches needs root")
    root = mounted.path
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"x")
    os.mkfifo(root / "d" / "p")
    before = {name: os.lstat(root / "d" / name).st_ino for name in ("f", "p")}
    folder = os.lstat(root / "d").st_ino
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("2")  # dentries and inodes: the kernel FORGETs the mount's nodes
    os.rename(root / "d" / "f", root / "d" / "g")
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("2")
    after = {name: os.lstat(root / "d" / new).st_ino for name, new in (("f", "g"), ("p", "p"))}
    assert after == before and os.lstat(root / "d").st_ino == folder


def _sizes(root, name: str, fd: int) -> tuple[int, int, int]:
    """The size of ``root/name`` as stat, fstat of ``fd`` and a fresh listing's stat see it."""
    listed = {e.name: e.stat().st_size for e in os.scandir(root)}
    return os.stat(root / name).st_size, os.fstat(fd).st_size, listed[name]


@pytest.mark.parametrize("open_before_listing", [False, True])
def test_ftruncate_of_an_open_file_shows_through_stat_and_listings(mounted, open_before_listing):
    """A folder listing's attributes never hide the size an open file's pending ftruncate and
    writes set: stat, fstat and a later listing all see it before the file is closed."""
    root = mounted.path
    if open_before_listing:
        fd = os.open(root / "f", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, b"abc")
        os.fsync(fd)  # stored while still open: a listing finds it in the database
    else:
        write(root / "f", b"abc")
    try:
        for entry in os.scandir(root):
            entry.stat()
        os.listdir(root)
        if not open_before_listing:
            fd = os.open(root / "f", os.O_RDWR)
        os.ftruncate(fd, 70000)
        assert _sizes(root, "f", fd) == (70000, 70000, 70000)
        os.pwrite(fd, b"xyz", 100)
        assert _sizes(root, "f", fd) == (70000, 70000, 70000)
        os.ftruncate(fd, 50)
        assert _sizes(root, "f", fd) == (50, 50, 50)
    finally:
        os.close(fd)
    assert _sizes(root, "f", os.open(root / "f", os.O_RDONLY)) == (50, 50, 50)
    assert read(root / "f") == b"abc" + bytes(47)

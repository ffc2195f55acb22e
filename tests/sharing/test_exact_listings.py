"""Listings of a folder that clients of the same mount change at once are exact.

Under a change feed the kernel keeps what it read of a folder's listing (``FOPEN_CACHE_DIR``,
``zarrfs.fuse.dirreq``). A client that changes a folder and then lists it must see its change,
and a listing must show every name that existed throughout it, whatever other clients list or
change meanwhile: one client makes and removes names while others list the folder without
pause, on a database server (several request threads) and on a database file (one). Files made
through the mount and not stored yet are listed from the mount's table of open files, asked
before each window of a listing is read (``zarrfs.fs.listing.DirListing``): checked in process
too, at the moments that matter.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

import pytest
from mounting import make_url, unavailable, write

from zarrfs.backends import open_driver
from zarrfs.daemon.control import query
from zarrfs.fs import listing as listing_module
from zarrfs.fs.api import Operations
from zarrfs.fs.commitoptions import CREATE
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.listing import DirListing
from zarrfs.fs.tree import Tree

STEPS = 150
KEPT = ["k0", "k1.zarr", "k2"]  # names that exist throughout


@pytest.mark.parametrize("kind", ["redis", "lmdb"])
@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_listing_shows_a_clients_change_and_every_name_kept(kind, request, tmp_path, mount_factory):
    m = mount_factory(make_url(kind, tmp_path, request), ["create"])
    folder = m.path / "f"
    folder.mkdir()
    for name in KEPT:
        write(folder / name, b"kept")
    done = threading.Event()
    wrong: list = []

    def browse() -> None:
        while not done.is_set():
            names = set(os.listdir(folder))
            if not names.issuperset(KEPT):
                wrong.append(("browser", sorted(names)))

    browsers = [threading.Thread(target=browse) for _ in range(2)]
    for b in browsers:
        b.start()
    try:
        for step in range(STEPS):
            name = f"n{step % 5}" + (".zarr" if step % 2 else "")
            write(folder / name, b"x" * (step % 7))
            names = os.listdir(folder)
            if name not in names or not set(names).issuperset(KEPT):
                wrong.append((step, "made", name, sorted(names)))
            os.unlink(folder / name)
            names = os.listdir(folder)
            if name in names or not set(names).issuperset(KEPT):
                wrong.append((step, "removed", name, sorted(names)))
    finally:
        done.set()
        for b in browsers:
            b.join(60)
    assert not wrong, f"{len(wrong)} wrong listings, the first: {wrong[:3]}"


def test_a_file_made_after_its_folder_was_opened_is_listed(tmp_path):
    """Made (not stored yet) between the open of its folder and the listing's first read: the
    kernel labels the listing it keeps as read after the file was made."""
    with open_driver(f"lmdb://{tmp_path}/db.lmdb") as driver:
        tree = Tree(driver, uid=0, gid=0)
        ops = Operations(tree, HandleTable(tree))
        tree.mkdir("d", 0o755)
        tree.store([("d/a", b"v", None, CREATE)])
        fh = ops.opendir("d")
        made = ops.create("d/new", 0o644, os.O_WRONLY | os.O_CREAT, 0, 0)
        assert tree.find("d/new") is None  # not stored yet
        assert [name for name, _, _ in ops.readdir(fh, 0)][2:] == ["a", "new"]
        ops.releasedir(fh)
        ops.release(made)


def test_a_file_stored_between_two_windows_is_listed_once(tmp_path, monkeypatch):
    """Unstored when the first window is read, stored before the second, which starts past its
    name: listed, from the names asked before the first window. A name the first window listed,
    removed and made again before the second, is listed once."""
    monkeypatch.setattr(listing_module, "FIRST_BATCH", 2)
    with open_driver(f"lmdb://{tmp_path}/db.lmdb") as driver:
        stored = ["a", "b", "c", "d", "e"]
        driver.transact(lambda t: [t.put(f"f/{name}", b"v") for name in stored])
        tree = Tree(driver, uid=0, gid=0)
        unstored = ["a2"]
        entries = DirListing(tree.listings, "f", extra=lambda: list(unstored)).entries(0)
        first = [next(entries)[0] for _ in range(4)]  # ".", "..", and the first window
        assert first[2:] == ["a", "b"]
        driver.put("f/a2", b"v")  # stored
        driver.transact(lambda t: t.delete("f/a"))
        unstored[:] = ["a"]  # made again, not stored yet
        rest = [name for name, _, _ in entries]
        assert sorted(first[2:] + rest) == ["a", "a2", "b", "c", "d", "e"]


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis", "postgres"])
@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_window_read_ahead_shows_another_writers_later_change(kind, request, tmp_path, mount_factory):
    """A mount reads a listing's next window while the kernel takes in the last reply
    (``DirListing.read_ahead``; on a server, the thread that polls the change feed reads it).
    Another writer's change, told by the change feed after that read and before the window is
    asked for, has the window read again, and the window being given its nodes: every name
    shows its new size, whether the kernel was given it before the change (the feed drops it)
    or after (the kernel, told of the change already, would keep the window's attributes for
    its timeout)."""
    url = make_url(kind, tmp_path, request)
    n = 20000
    with open_driver(url) as driver:
        driver.transact(lambda t: [t.put(f"f/{i:05d}", b"x") for i in range(n)] + [t.put("g/0", b"")])
        m = mount_factory(url)
        entries = os.scandir(m.path / "f")
        consumed = 0
        for _entry in entries:  # up to a window read ahead and not taken yet
            consumed += 1
            if consumed % 20 == 0:
                ahead = query(str(m.path))["listings_read_ahead"]
                if ahead["windows"] > ahead["taken"]:
                    break
        else:
            pytest.fail("the mount read no window ahead")
        start = consumed + 500
        driver.transact(lambda t: [t.put(f"f/{i:05d}", b"yy") for i in range(start, n)])
        os.listdir(m.path / "g")  # an open of a folder looks at the change feed
        sizes = {e.name: e.stat().st_size for e in entries}
        entries.close()
    old = [name for name in (f"{i:05d}" for i in range(start, n)) if sizes[name] != 2]
    assert not old, f"{len(old)} names of {n - start} with the size before the change, the first {old[:3]}"


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_folder_another_writer_removed_while_it_was_being_listed_is_not_found(
    kind, request, tmp_path, mount_factory
):
    """Folders of the window a listing is giving, removed whole by another writer (their
    last keys deleted) and told by the change feed before the listing reaches them, are
    given without attributes: the listing's scan saw them as folders, and the kernel, told
    of the change already, would keep a folder that is not there for its entry timeout. The
    program reads with a 4 KiB buffer (glibc's is up to 1 MiB here, a window a call)."""
    url = make_url(kind, tmp_path, request)
    n = 6000
    folders = [f"{i:05d}.d" for i in range(0, n, 97)]
    with open_driver(url) as driver:
        driver.transact(
            lambda t: [t.put(f"f/{i:05d}", b"x") for i in range(n)]
            + [t.put(f"f/{name}/0", b"") for name in folders]
            + [t.put("g/0", b"")]
        )
        m = mount_factory(url)
        fd = os.open(m.path / "f", os.O_RDONLY | os.O_DIRECTORY)
        try:
            listed = []
            while len(listed) < 700:
                listed += getdents(fd)
            gone = [name for name in folders if "01000" < name < "02500"]
            driver.transact(lambda t: [t.delete(f"f/{name}/0") for name in gone])
            os.listdir(m.path / "g")  # an open of a folder looks at the change feed
            while more := getdents(fd):
                listed += more
        finally:
            os.close(fd)
    assert set(gone) <= set(listed)  # the window's scan saw them, before the change
    found = [name for name in gone if os.path.lexists(m.path / "f" / name)]
    assert not found, f"{len(found)} of {len(gone)} removed folders found, the first {found[:3]}"


def getdents(fd: int, size: int = 4096) -> list[str]:
    """The names of one ``getdents64`` call of ``size`` bytes on ``fd`` (none: the end)."""
    buffer = ctypes.create_string_buffer(size)
    got = _libc.syscall(_GETDENTS64, fd, buffer, size)
    if got < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    names, at = [], 0
    while at < got:
        length = int.from_bytes(buffer.raw[at + 16 : at + 18], "little")
        name = buffer.raw[at + 19 : at + length].split(b"\0", 1)[0].decode()
        if name not in (".", ".."):
            names.append(name)
        at += length
    return names


_libc = ctypes.CDLL(None, use_errno=True)
_GETDENTS64 = {"x86_64": 217, "aarch64": 61}[platform.machine()]


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
@pytest.mark.serial  # drop_caches: every mount of the machine forgets, other tests' too
@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_files_changed_here_and_forgotten_by_the_kernel_are_listed_as_they_are_now(
    kind, request, tmp_path, mount_factory
):
    """A listing's window holds the nodes it read, up to 4,096 names. Files of the window being
    given, written or removed through this mount after its read and then forgotten by the
    kernel (memory pressure; here ``drop_caches``), are listed as they are now: the kernel
    holds none of them when the reply comes and would keep what it is given for its
    timeouts (a file removed here would be found by ``stat`` again)."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        unavailable("dropping the kernel's caches needs root")
    url = make_url(kind, tmp_path, request)
    n = 20000
    with open_driver(url) as driver:
        driver.transact(lambda t: [t.put(f"f/{i:05d}", b"x") for i in range(n)])
    m = mount_factory(url)
    entries = os.scandir(m.path / "f")
    consumed = [next(entries).name for _ in range(700)]
    given = query(str(m.path))["nodes"]["held"] - 2  # the root and the folder
    start, size = 0, listing_module.FIRST_BATCH  # the window the last name given is in
    while start + size <= given:
        start, size = start + size, min(size * 4, listing_module.MAX_BATCH)
    changed = [f"{i:05d}" for i in range(given + 20, start + size, 3)]
    assert len(changed) > 20, (given, start, size)
    written, removed = changed[::2], changed[1::2]
    for name in written:
        write(m.path / "f" / name, b"yy")
    for name in removed:
        os.unlink(m.path / "f" / name)
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("2")  # dentries and inodes: the kernel FORGETs the files it held
    sizes = {}
    for e in entries:
        try:
            sizes[e.name] = e.stat().st_size
        except FileNotFoundError:
            pass
    entries.close()
    assert len(consumed) + len(sizes) >= n - len(removed)
    old = [name for name in written if sizes[name] != 2]
    assert not old, f"{len(old)} of {len(written)} written files listed with their old size: {old[:3]}"
    found = [name for name in removed if name in sizes]
    assert not found, f"{len(found)} of {len(removed)} removed files found by stat: {found[:3]}"

"""How many FUSE requests and database transactions a user's operation costs through a real
mount, counted by the daemon (``zarrfs status``): each request saved is a round trip through
the kernel and the daemon's Python, so a change that adds one shows here first."""

from __future__ import annotations

import os
import time

import pytest
from mounting import needs_fuse

from zarrfs.daemon.control import query

pytestmark = needs_fuse


def counted(
    mount, action, settle: str = "release", settles: int = 1
) -> tuple[dict[str, int], dict[str, int]]:
    """The requests by type and the transactions the daemon counted during ``action()``; the
    kernel sends a RELEASE after close() returns, so ``settles`` of them are awaited (as long
    as a busy machine takes, within a minute)."""
    before = query(str(mount.path))
    action()
    deadline = time.monotonic() + 60
    while True:
        after = query(str(mount.path))
        done = after["requests"].get(settle, 0) >= before["requests"].get(settle, 0) + settles
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    requests = {k: n - before["requests"].get(k, 0) for k, n in after["requests"].items()}
    txns = {k: after["transactions"][k] - before["transactions"][k] for k in ("read", "write")}
    return {k: n for k, n in requests.items() if n}, txns


@pytest.fixture
def lmdb_mount(tmp_path, mount_factory):
    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create"])
    (m.path / "d").mkdir()
    return m


def test_a_small_file_costs_five_requests_and_one_write_transaction(lmdb_mount):
    """create + write + close of 4 KiB: LOOKUP (the name is new), CREATE, WRITE, FLUSH (the
    commit, whose error close() returns), RELEASE; one write transaction. A file created
    write-only is written past the page cache, so the kernel asks no GETXATTR of
    ``security.capability`` before its first write (it did for every new file: six)."""
    n = 10
    files = [lmdb_mount.path / "d" / f"f{i}" for i in range(n)]

    def write_files():
        for path in files:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, b"x" * 4096)
            os.close(fd)

    requests, txns = counted(lmdb_mount, write_files, settles=n)  # RELEASE follows close()
    per_file = {"lookup": 1, "create": 1, "write": 1, "flush": 1, "release": 1}
    assert requests == {k: n * v for k, v in per_file.items()}, requests
    assert txns["write"] == n, txns
    assert all(p.read_bytes() == b"x" * 4096 for p in files)


@pytest.mark.parametrize("access", [os.O_WRONLY, os.O_RDWR], ids=["write-only", "read-write"])
def test_the_kernel_asks_security_capability_once_a_file_not_once_a_write(lmdb_mount, access):
    """With FUSE_HANDLE_KILLPRIV_V2 the kernel remembers a file has no capability after its
    first write (S_NOSEC), so 16 write(2) calls to a new file opened read-write cost 16 WRITE
    requests and one GETXATTR, not 16 (each a round trip before its write); opened
    write-only (past the page cache), none."""
    path = lmdb_mount.path / "d" / "big"

    def write_pieces():
        fd = os.open(path, access | os.O_CREAT, 0o644)
        for _ in range(16):
            os.write(fd, b"y" * 65536)
        os.close(fd)

    requests, txns = counted(lmdb_mount, write_pieces)
    asked = 1 if access == os.O_RDWR else 0
    assert requests["write"] == 16 and requests.get("getxattr", 0) == asked, requests
    assert txns["write"] == 1, txns
    assert path.stat().st_size == 16 * 65536


def test_a_file_written_past_the_page_cache_is_read_back_from_the_kernels_pages(lmdb_mount):
    """A new file written through a write-only descriptor is handed to the kernel whole at its
    last close: reading it back costs no READ request, as after a write through the cache.
    A reader opened while the writer still writes sees each write."""
    path = lmdb_mount.path / "d" / "chunk"
    data = os.urandom(300_000) + b"end"

    def write() -> None:
        with open(path, "wb") as f:
            f.write(data)

    counted(lmdb_mount, write)  # the RELEASE that hands the pages over follows close()

    def read_back():
        assert path.read_bytes() == data

    requests, _ = counted(lmdb_mount, read_back)
    assert requests.get("read", 0) == 0, requests

    other = lmdb_mount.path / "d" / "growing"
    fd = os.open(other, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"1" * 5000)
        with open(other, "rb") as reader:
            assert reader.read() == b"1" * 5000
            os.write(fd, b"2" * 5000)
            reader.seek(0)
            assert reader.read() == b"1" * 5000 + b"2" * 5000
    finally:
        os.close(fd)
    assert other.read_bytes() == b"1" * 5000 + b"2" * 5000


@pytest.mark.skipif(os.geteuid() != 0, reason="security.capability is the administrator's to set")
def test_a_write_past_the_page_cache_removes_a_capability_as_the_kernel_would(lmdb_mount, tmp_path):
    """The kernel removes ``security.capability`` at a write through the page cache; past it
    (a file created write-only) the daemon does. Beside a native folder."""
    import errno
    import struct

    cap = struct.pack("<5I", 0x02000000, 0, 0, 0, 0)  # VFS_CAP_REVISION_2, no capabilities
    native = tmp_path / "native"
    native.mkdir()
    for folder in (native, lmdb_mount.path / "d"):
        path = folder / "tool"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o755)
        try:
            os.write(fd, b"#!/bin/sh\n")
            os.fsync(fd)  # stored: it may be given attributes now
            os.setxattr(path, "security.capability", cap)
            assert os.getxattr(path, "security.capability") == cap
            os.write(fd, b"true\n")
        finally:
            os.close(fd)
        with pytest.raises(OSError) as exc:
            os.getxattr(path, "security.capability")
        assert exc.value.errno == errno.ENODATA, folder
        assert path.read_bytes() == b"#!/bin/sh\ntrue\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="security.capability is the administrator's to set")
def test_a_write_to_a_removed_file_leaves_the_capability_of_the_file_now_at_its_name(lmdb_mount):
    """A file written past the page cache, stored, then unlinked while open: its writes touch
    no other file's attributes, not even those of a new file at its old name."""
    import struct

    cap = struct.pack("<5I", 0x02000000, 0, 0, 0, 0)
    path = lmdb_mount.path / "d" / "tool"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o755)
    try:
        os.write(fd, b"old")
        os.fsync(fd)
        os.unlink(path)
        path.write_bytes(b"new")
        os.setxattr(path, "security.capability", cap)
        os.write(fd, b" more")
    finally:
        os.close(fd)
    assert os.getxattr(path, "security.capability") == cap
    assert path.read_bytes() == b"new"


def test_ls_l_asks_the_selinux_label_of_one_file_not_of_each(lmdb_mount):
    """``ls -l`` asks each file's ``security.selinux``, which the kernel never caches: a node
    without one answers EOPNOTSUPP, on which ls stops asking for the rest of the folder (with
    ENODATA it asked again for every file, a round trip each). A label set is read back."""
    import errno
    import subprocess

    folder = lmdb_mount.path / "d"
    for i in range(40):
        (folder / f"f{i}").write_bytes(b"x")
    subprocess.run(["ls", "-l", str(folder)], check=True, capture_output=True)  # the kernel holds them

    def ls_l():
        subprocess.run(["ls", "-l", str(folder)], check=True, capture_output=True)

    requests, _ = counted(lmdb_mount, ls_l, settle="releasedir")
    assert requests.get("getxattr", 0) <= 2, requests
    with pytest.raises(OSError) as exc:
        os.getxattr(folder / "f1", "security.selinux")
    assert exc.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as exc:  # another name of the namespace: not there, as ever
        os.getxattr(folder / "f1", "security.other")
    assert exc.value.errno == errno.ENODATA
    if os.geteuid() == 0:  # security.* is the administrator's to set
        os.setxattr(folder / "f2", "security.selinux", b"system_u:object_r:tmp_t:s0")
        assert os.getxattr(folder / "f2", "security.selinux") == b"system_u:object_r:tmp_t:s0"

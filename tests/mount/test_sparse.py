"""Files with holes and changes to large files through real mounts (zarrfs.fs.parts): a part
of zeros is not stored and costs no block; a change stores only the parts it touched and
shares the others with the version it replaces; a kill -9 before the commit leaves that
version whole, and ``zarrfs check --repair`` deletes the new parts but never a shared one;
SEEK_DATA/SEEK_HOLE (FUSE_LSEEK) report the parts stored; fallocate's punch-hole drops whole
parts. POSIX ACLs (zarrfs.fs.acl) with ``allow_other`` (default_permissions): a user an ACL
lets in reads a file its mode shuts out, ``getfacl`` gives back what ``setfacl`` set, a
second mount sees it, a folder's default ACL is inherited, and the umask still applies
where there is none."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import shutil
import stat
import struct
import subprocess

import pytest
from mounting import (
    DRIVERS,
    close_in_background,
    daemon_cpu,
    make_url,
    needs_fuse,
    reads_while,
    unavailable,
    zarrfs,
)
from test_parts_mount import crash_mid_commit_and_repair, stored_parts

pytestmark = needs_fuse

MIB = 1 << 20
GIB = 1 << 30


def _fresh(path) -> int:
    """A descriptor reading ``path`` past the kernel's pages."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd


def _db_bytes(tmp_path) -> int:
    return sum(
        os.stat(os.path.join(r, f)).st_blocks * 512
        for r, _, files in os.walk(tmp_path)
        for f in files
        if ".lmdb" in r or f.endswith((".lmdb", "mdb"))
    )


@pytest.mark.parametrize("kind", DRIVERS)
def test_a_hole_of_a_gib_costs_nothing(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off"])
    # The baseline: one part's worth of data written (16 MiB), what the hole may cost at most.
    cpu = daemon_cpu(m)
    (m.path / "dense").write_bytes(os.urandom(16 * MIB))
    dense = daemon_cpu(m) - cpu
    os.unlink(m.path / "dense")
    before = _db_bytes(tmp_path)
    cpu = daemon_cpu(m)
    fd = os.open(m.path / "sparse", os.O_CREAT | os.O_WRONLY, 0o644)
    os.pwrite(fd, b"x", GIB)
    os.close(fd)
    hole = daemon_cpu(m) - cpu
    st = os.stat(m.path / "sparse")
    assert st.st_size == GIB + 1 and st.st_blocks <= 8, st
    assert len(stored_parts(url)) == 2  # the part holding the byte, and the map
    if kind == "lmdb":
        assert _db_bytes(tmp_path) - before < 8 * MIB
    fd = _fresh(m.path / "sparse")
    try:
        assert os.pread(fd, MIB, 0) == bytes(MIB)
        assert os.pread(fd, MIB, GIB // 2 + 12345) == bytes(MIB)
        assert os.pread(fd, 10, GIB - 9) == bytes(9) + b"x"
    finally:
        os.close(fd)
    # It was 4.4 s of writing zeros (64 parts of them); now no part but the last is read.
    print(f"{kind}: the hole cost {hole:.2f} s of the daemon's CPU, one part of data {dense:.2f} s")
    assert hole < dense, (hole, dense)
    m.stop()
    m.start()
    assert os.stat(m.path / "sparse").st_blocks <= 8


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_one_byte_change_stores_one_part(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off"])
    count = 16  # parts of 16 MiB
    seed = os.urandom(MIB)
    expect = hashlib.sha256()
    cpu = daemon_cpu(m)
    with open(m.path / "big", "wb") as fh:
        for i in range(count * 16):
            block = i.to_bytes(8, "little") + seed[8:]
            fh.write(block)
            expect.update(block if i != 100 else block[:7] + b"!" + block[8:])
        fh.flush()
        # Synced, in both steps: what a database does after its commits (SQLite copies its
        # WAL 0.1 s after the last one) is then counted in the step it belongs to, not in the
        # next one, which a slow machine begins before it.
        os.fsync(fh.fileno())
    written = daemon_cpu(m) - cpu  # the baseline: the whole file written, 16 parts
    first = stored_parts(url)
    assert len(first) == count and os.stat(m.path / "big").st_blocks == count * 16 * MIB // 512
    cpu = daemon_cpu(m)
    fd = os.open(m.path / "big", os.O_WRONLY)
    os.pwrite(fd, b"!", 100 * MIB + 7)
    os.fsync(fd)
    os.close(fd)
    changed = daemon_cpu(m) - cpu
    now = stored_parts(url)
    new = sorted(set(now) - set(first))
    assert len(new) == 2 and new[0].endswith(f"/{100 // 16:08d}") and new[1].endswith("/map"), new
    assert set(first) - set(now) == {first[100 // 16]}  # the part replaced, freed
    fd = _fresh(m.path / "big")
    read = hashlib.sha256()
    while piece := os.read(fd, 4 * MIB):
        read.update(piece)
    os.close(fd)
    assert read.hexdigest() == expect.hexdigest()
    print(f"{kind}: the change cost {changed:.2f} s of the daemon's CPU, the whole file {written:.2f} s")
    assert changed < written / 4, (changed, written)  # one part read and stored of 16
    m.stop()
    assert zarrfs("check", url, check=False).returncode == 0


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_kill_9_before_the_commit_keeps_the_version_that_shares(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off", "parts_above=1M", "feed=0"])
    size = 200 * MIB
    data = bytearray(os.urandom(size))
    (m.path / "f").write_bytes(data)
    with open(m.path / "f", "r+b") as fh:  # a version sharing 199 parts with one now gone
        fh.seek(50 * MIB + 3)
        fh.write(b"?")
    data[50 * MIB + 3] = ord("?")
    before = sorted(stored_parts(url))
    assert len(before) == 201 and len({k.split("/")[0] for k in before}) == 2  # two ids, and a map
    crash_mid_commit_and_repair(m, url, 200, "r+b")
    assert sorted(stored_parts(url)) == before  # the shared parts stayed
    m.start()
    assert hashlib.sha256((m.path / "f").read_bytes()).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("kind", DRIVERS)
def test_seek_data_and_seek_hole_follow_the_parts(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off", "parts_above=1M"])  # parts of 1 MiB
    fd = os.open(m.path / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    os.pwrite(fd, os.urandom(MIB), 0)
    os.pwrite(fd, b"data", 3 * MIB + 6)
    os.close(fd)
    size = 3 * MIB + 10
    (m.path / "small").write_bytes(b"abc")
    fd = os.open(m.path / "f", os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_DATA) == 0
        assert os.lseek(fd, 0, os.SEEK_HOLE) == MIB
        assert os.lseek(fd, 5, os.SEEK_HOLE) == MIB
        assert os.lseek(fd, MIB + 1, os.SEEK_HOLE) == MIB + 1
        assert os.lseek(fd, MIB, os.SEEK_DATA) == 3 * MIB
        assert os.lseek(fd, 3 * MIB + 2, os.SEEK_HOLE) == size
        with pytest.raises(OSError) as exc:
            os.lseek(fd, size, os.SEEK_DATA)
        assert exc.value.errno == errno.ENXIO
        with pytest.raises(OSError) as exc:
            os.lseek(fd, size + 5, os.SEEK_HOLE)
        assert exc.value.errno == errno.ENXIO
        assert os.lseek(fd, 7, os.SEEK_SET) == 7 and os.lseek(fd, 0, os.SEEK_END) == size
    finally:
        os.close(fd)
    fd = os.open(m.path / "small", os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_DATA) == 0 and os.lseek(fd, 1, os.SEEK_HOLE) == 3
    finally:
        os.close(fd)


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def _punch(fd: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, 0x02 | 0x01, offset, length) != 0:  # PUNCH_HOLE | KEEP_SIZE
        raise OSError(ctypes.get_errno(), "fallocate")


@pytest.mark.parametrize("kind", DRIVERS)
def test_punch_hole_drops_whole_parts(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off", "parts_above=1M"])  # parts of 1 MiB
    data = bytearray(os.urandom(8 * MIB))
    (m.path / "f").write_bytes(data)
    assert os.stat(m.path / "f").st_blocks == 8 * MIB // 512
    fd = os.open(m.path / "f", os.O_RDWR)
    _punch(fd, MIB + 5, 4 * MIB)  # parts 2, 3, 4 whole; ends of 1 and 5 zeroed
    os.close(fd)
    data[MIB + 5 : 5 * MIB + 5] = bytes(4 * MIB)
    assert os.stat(m.path / "f").st_blocks == 5 * MIB // 512
    assert os.stat(m.path / "f").st_size == 8 * MIB
    fd = _fresh(m.path / "f")
    try:
        assert os.pread(fd, 8 * MIB, 0) == data
        assert os.lseek(fd, MIB, os.SEEK_HOLE) == 2 * MIB and os.lseek(fd, 2 * MIB, os.SEEK_DATA) == 5 * MIB
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- POSIX ACLs
def _as_nobody(path) -> subprocess.CompletedProcess:
    """``cat`` of ``path`` as the user nobody, through a folder opened here (its
    ``/proc/self/fd`` link): the folders above the mountpoint (pytest's, mode 0700) shut
    other users out."""
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        argv = ["cat", f"/proc/self/fd/{folder}/{os.path.basename(path)}"]
        return subprocess.run(argv, capture_output=True, text=True, user="nobody", pass_fds=[folder])
    finally:
        os.close(folder)


@pytest.mark.parametrize("kind", DRIVERS)
def test_an_acl_lets_a_user_in_and_a_second_mount_sees_it(kind, tmp_path, request, mount_factory):
    if shutil.which("setfacl") is None or os.geteuid() != 0:
        unavailable("needs root and setfacl (apt-get install acl)")
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off", "allow_other"])
    f = m.path / "secret"
    f.write_text("hidden\n")
    os.chmod(f, 0o600)
    assert _as_nobody(f).returncode != 0
    subprocess.run(["setfacl", "-m", "u:nobody:r", str(f)], check=True, capture_output=True)
    assert os.stat(f).st_mode & 0o777 == 0o640  # the mask is the group's bits
    shown = subprocess.run(["getfacl", "-cp", str(f)], check=True, capture_output=True, text=True).stdout
    assert shown.split() == ["user::rw-", "user:nobody:r--", "group::---", "mask::r--", "other::---"], shown
    got = _as_nobody(f)
    assert got.returncode == 0 and got.stdout == "hidden\n", got.stderr
    os.chmod(f, 0o600)  # chmod changes the mask: nobody is out again
    assert "mask::---" in subprocess.run(["getfacl", "-cp", str(f)], capture_output=True, text=True).stdout
    assert _as_nobody(f).returncode != 0
    subprocess.run(["setfacl", "-m", "m::r", str(f)], check=True, capture_output=True)
    # A folder's default ACL is inherited; the umask applies where there is none.
    os.mkdir(m.path / "d")
    setfacl = ["setfacl", "-d", "-m", "u:nobody:rwx", str(m.path / "d")]
    subprocess.run(setfacl, check=True, capture_output=True)
    (m.path / "d" / "new").write_text("x")
    os.mkdir(m.path / "d" / "sub")
    inherited = subprocess.run(["getfacl", "-cp", str(m.path / "d" / "new")], capture_output=True, text=True)
    assert "user:nobody:rwx\t#effective:rw-" in inherited.stdout, inherited.stdout
    sub = subprocess.run(["getfacl", "-cp", str(m.path / "d" / "sub")], capture_output=True, text=True).stdout
    assert "default:user:nobody:rwx" in sub
    old = os.umask(0o027)
    try:
        fd = os.open(m.path / "plain", os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        os.mkdir(m.path / "plaindir", 0o777)
    finally:
        os.umask(old)
    assert os.stat(m.path / "plain").st_mode & 0o777 == 0o640
    assert os.stat(m.path / "plaindir").st_mode & 0o777 == 0o750
    m2 = mount_factory(url, ["validate=off", "allow_other"], name="second")
    f2 = m2.path / "secret"
    shown = subprocess.run(["getfacl", "-cp", str(f2)], check=True, capture_output=True, text=True).stdout
    assert "user:nobody:r--" in shown
    got = _as_nobody(f2)
    assert got.returncode == 0 and got.stdout == "hidden\n", got.stderr
    m.assert_clean_log()


def _acl(*entries: tuple[int, int]) -> bytes:
    """A ``system.posix_acl_access`` value: version 2, then (tag, permissions, id) entries."""
    body = b"".join(struct.pack("<HHI", tag, perm, 0xFFFFFFFF) for tag, perm in entries)
    return struct.pack("<I", 2) + body


@pytest.mark.parametrize("kind", DRIVERS)
def test_extended_attributes_set_on_a_new_file_before_its_close_are_stored_with_it(
    kind, tmp_path, request, mount_factory
):
    """What ``cp -a`` does: a new file's attributes and an access ACL set through its
    descriptor before the close are kept with the file made here (no commit of their own),
    with the same errors as on a stored file, and stored with it at the close; a held
    temporary file's at its rename."""
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create", "validate=off", "allow_other"])
    fd = os.open(m.path / "new", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.write(fd, b"data")
        os.setxattr(fd, "user.a", b"1")
        with pytest.raises(FileExistsError):
            os.setxattr(fd, "user.a", b"2", os.XATTR_CREATE)
        replace = lambda: os.setxattr(fd, "user.b", b"2", os.XATTR_REPLACE)  # noqa: E731
        for call in (replace, lambda: os.removexattr(fd, "user.b")):
            with pytest.raises(OSError) as exc:
                call()
            assert exc.value.errno == errno.ENODATA
        os.setxattr(fd, "user.c", b"3")
        os.removexattr(fd, "user.c")
        assert os.getxattr(fd, "user.a") == b"1" and os.listxattr(fd) == ["user.a"]
        # u::rw- g::r-- o::--- (what the mode says all of: not kept, the mode set)
        os.setxattr(fd, "system.posix_acl_access", _acl((0x01, 6), (0x04, 4), (0x20, 0)))
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o640
    finally:
        os.close(fd)
    with open(m.path / "t.partial", "wb") as fh:
        fh.write(b"held")
        os.setxattr(fh.fileno(), "user.t", b"held")
    os.rename(m.path / "t.partial", m.path / "t")
    m2 = mount_factory(url, ["validate=off", "allow_other"], name="second")
    for where in (m.path, m2.path):
        assert (where / "new").read_bytes() == b"data"
        assert os.listxattr(where / "new") == ["user.a"] and os.getxattr(where / "new", "user.a") == b"1"
        assert stat.S_IMODE(os.stat(where / "new").st_mode) == 0o640
        assert os.listxattr(where / "t") == ["user.t"] and (where / "t").read_bytes() == b"held"
    m.assert_clean_log()


def test_without_default_permissions_an_acl_is_refused(tmp_path, mount_factory):
    if shutil.which("setfacl") is None:
        unavailable("needs setfacl (apt-get install acl)")
    m = mount_factory(f"lmdb://{tmp_path}/db", ["create", "validate=off"])
    (m.path / "f").write_text("x")
    done = subprocess.run(["setfacl", "-m", "u:nobody:r", str(m.path / "f")], capture_output=True, text=True)
    assert done.returncode != 0 and "not supported" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_large_files_commit_does_not_hold_up_other_files(kind, tmp_path, request, mount_factory):
    """Between the parts of a large file, its commit answers the requests that need no write
    and are about other files: while a close stores 256 parts, another process opens, reads
    and closes another file 20 times (before, every request waited for the whole commit)."""
    m = mount_factory(make_url(kind, tmp_path, request), ["create", "parts_above=1048576"])
    (m.path / "kept").write_bytes(b"old")
    fd = os.open(m.path / "big", os.O_WRONLY | os.O_CREAT, 0o644)
    block = os.urandom(1 << 20)
    for _ in range(256):
        os.write(fd, block)  # buffered: the close stores it, 256 parts of 1 MiB
    closer, outcome = close_in_background(fd)
    reads = reads_while(closer, m.path / "kept", b"old")
    closer.join(timeout=600)
    assert reads == 20, f"{reads} reads answered while the close stored the file"
    assert outcome == ["stored"], outcome
    assert os.stat(m.path / "big").st_size == 256 << 20
    with open(m.path / "big", "rb") as fh:
        fh.seek(200 << 20)
        assert fh.read(1 << 20) == block

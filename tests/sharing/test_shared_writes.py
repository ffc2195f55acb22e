"""Writes through several mounts of one database (two and three daemons, as on several
machines): a lock brings the file up to date, an unlock commits it, a commit keeps what the
other mounts committed outside the ranges it wrote, only a writer's close commits, and a
descriptor of a file held whole reads its version until it is closed (README, Guarantees).

Every driver that can be shared: LMDB and SQLite files, Redis, Redis Cluster, PostgreSQL."""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import stat
import struct
import subprocess
import sys
import textwrap
import time

import pytest
from mounting import eventually, make_url, needs_fuse

pytestmark = needs_fuse

SHARED = ["lmdb", "sqlite", "redis", "cluster", "postgres"]


@pytest.fixture(params=SHARED)
def url(request, tmp_path) -> str:
    """A fresh database of each driver that mounts can share."""
    return make_url(request.param, tmp_path, request)


def mounts(mount_factory, url: str, n: int) -> list:
    """``n`` mounts of the database at ``url``, each served by its own daemon."""
    first = mount_factory(url, ["create"])
    return [first] + [mount_factory(url) for _ in range(n - 1)]


def shown(*paths, deadline: float = 60.0) -> None:
    """Wait until every path exists: a file made through one mount shows on the others once
    their change feed brings its name (within a poll)."""
    end = time.monotonic() + deadline
    for path in paths:
        while not os.path.exists(path):
            assert time.monotonic() < end, f"{path} never showed"
            time.sleep(0.01)


def ofd_lock(fd: int, kind: int) -> None:
    """An open file description lock (``F_OFD_SETLKW``) on the whole file."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hh4xqqi4x", kind, os.SEEK_SET, 0, 0, 0))


def lock(fd: int, how: str, unlock: bool = False) -> None:
    """Take (or release) a lock of kind ``how`` on the whole file open as ``fd``."""
    if how == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN if unlock else fcntl.LOCK_EX)
    elif how == "lockf":
        os.lseek(fd, 0, os.SEEK_SET)  # lockf locks from the offset on
        fcntl.lockf(fd, fcntl.LOCK_UN if unlock else fcntl.LOCK_EX)
    else:
        ofd_lock(fd, fcntl.F_UNLCK if unlock else fcntl.F_WRLCK)


# --- the smallest case ----------------------------------------------------------------------------


def test_each_mount_appends_a_line_under_a_lock(url, mount_factory):
    """Each of three mounts has the file open from before the others wrote; under a lock
    (``flock``, ``lockf``, OFD) each appends a line (``O_APPEND``, or a write at
    ``lseek(SEEK_END)``), fsyncs and unlocks: every line is there, in order, on every mount
    (before: ``one three``, or zeros where a line was)."""
    ms = mounts(mount_factory, url, 3)
    cases = [(how, append) for how in ("flock", "lockf", "ofd") for append in (True, False)]
    for how, append in cases:
        name = f"{how}-{'append' if append else 'seek'}"
        (ms[0].path / name).write_bytes(b"one\n")
        shown(*(m.path / name for m in ms))
        flags = os.O_RDWR | (os.O_APPEND if append else 0)
        fds = [os.open(m.path / name, flags) for m in ms[::-1]][::-1]
        try:
            for fd, line in zip(fds, (b"two\n", b"three\n", b"four\n"), strict=True):
                lock(fd, how)
                if not append:
                    os.lseek(fd, 0, os.SEEK_END)
                os.write(fd, line)
                os.fsync(fd)
                lock(fd, how, unlock=True)
        finally:
            for fd in fds:
                os.close(fd)
        for m in ms:
            assert (m.path / name).read_bytes() == b"one\ntwo\nthree\nfour\n", (name, m.path)


def older_descriptor(a, b) -> int:
    """A descriptor on mount ``b`` of the file ``f`` (100 zeros) that has read it, opened
    before mount ``a`` stored 150 ones there: it reads its version still."""
    (a.path / "f").write_bytes(b"0" * 100)
    shown(b.path / "f")
    fd = os.open(b.path / "f", os.O_RDWR)
    try:
        assert os.pread(fd, 200, 0) == b"0" * 100
        (a.path / "f").write_bytes(b"1" * 150)
    except BaseException:
        os.close(fd)
        raise
    return fd


def test_a_lock_shows_the_size_and_content_of_the_newest_version(url, mount_factory):
    """A descriptor open on mount B, which read the file before, sees after taking a lock the
    content and size mount A committed meanwhile (its kernel's cached pages and size dropped)."""
    fd = older_descriptor(*mounts(mount_factory, url, 2))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert os.fstat(fd).st_size == 150
        assert os.pread(fd, 200, 0) == b"1" * 150
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def test_a_descriptor_of_an_older_version_brought_up_to_date_by_a_lock_changes_the_file(url, mount_factory):
    """Mount B has the file open from before mount A's commit, and opens it again after (a
    newer version: its descriptor reads that one), writes under a lock and closes it. The
    older descriptor, brought up to date by a lock, is then the file's: a truncate or write
    through it shows in ``fstat`` and reads, and its unlock commits it. (Its changes were
    kept apart from what the mount showed of the file: ``ftruncate(fd, 0)`` left ``fstat``
    at the stored size, and reads gave the bytes it had cut.)"""
    a, b = mounts(mount_factory, url, 2)
    old = older_descriptor(a, b)
    try:
        new = os.open(b.path / "f", os.O_RDWR)
        fcntl.flock(new, fcntl.LOCK_EX)
        os.ftruncate(new, 7)
        fcntl.flock(new, fcntl.LOCK_UN)
        os.close(new)
        fcntl.flock(old, fcntl.LOCK_EX)
        assert (os.fstat(old).st_size, os.pread(old, 200, 0)) == (7, b"1" * 7)
        os.ftruncate(old, 0)
        assert (os.fstat(old).st_size, os.pread(old, 200, 0)) == (0, b"")
        os.lseek(old, 0, os.SEEK_END)
        os.write(old, b"xyz")
        assert (os.fstat(old).st_size, os.pread(old, 200, 0)) == (3, b"xyz")
        fcntl.flock(old, fcntl.LOCK_UN)
    finally:
        os.close(old)
    eventually(lambda: (a.path / "f").read_bytes() == b"xyz", "the unlock's commit on the other mount")
    assert (b.path / "f").read_bytes() == b"xyz"


def test_a_descriptor_of_an_older_version_reads_what_it_wrote(url, mount_factory):
    """Mount B has the file open from before mount A's commit, and opens it again after (the
    newer version, read past the kernel's page cache). Writes and a truncate through the
    older descriptor, with no lock, are read back through it and show in its ``fstat``,
    and its close commits them. (They were shown at the stored size: 200 bytes written
    read back as 150, a truncate to 50 left 150.)"""
    a, b = mounts(mount_factory, url, 2)
    old = older_descriptor(a, b)
    new = None
    try:
        new = os.open(b.path / "f", os.O_RDWR)
        assert os.pread(new, 300, 0) == b"1" * 150
        os.pwrite(old, b"x" * 200, 0)
        assert (os.fstat(old).st_size, os.pread(old, 300, 0)) == (200, b"x" * 200)
        os.ftruncate(old, 50)
        assert (os.fstat(old).st_size, os.pread(old, 300, 0)) == (50, b"x" * 50)
        os.close(old)
        old = None
    finally:
        for fd in (old, new):
            if fd is not None:
                os.close(fd)
    eventually(lambda: (a.path / "f").read_bytes() == b"x" * 50, "the close's commit on the other mount")
    assert (b.path / "f").read_bytes() == b"x" * 50


# --- appenders in processes, one per mount ------------------------------------------------------------

APPENDER = textwrap.dedent(
    """
    import fcntl, os, struct, sys
    path, how, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    append = how == "append"
    fd = os.open(path, os.O_RDWR | (os.O_APPEND if append else 0))
    def ofd(kind):
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hh4xqqi4x", kind, 0, 0, 0, 0))
    for i in range(n):
        line = f"{name}-{i:05d}-{'x' * 40}\\n".encode()
        if how in ("flock", "append"):
            fcntl.flock(fd, fcntl.LOCK_EX)
        elif how == "lockf":
            os.lseek(fd, 0, os.SEEK_SET)
            fcntl.lockf(fd, fcntl.LOCK_EX)
        else:
            ofd(fcntl.F_WRLCK)
        if not append:
            os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, line)
        if how in ("flock", "append"):
            fcntl.flock(fd, fcntl.LOCK_UN)
        elif how == "lockf":
            os.lseek(fd, 0, os.SEEK_SET)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        else:
            ofd(fcntl.F_UNLCK)
    os.close(fd)
    """
)


def run_all(commands: list[list[str]], timeout: float = 300) -> None:
    procs = [subprocess.Popen(c) for c in commands]
    try:
        for p in procs:
            assert p.wait(timeout) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def check_lines(data: bytes, names: list[str], n: int) -> None:
    """Every line of every writer present once, none mangled."""
    lines = data.split(b"\n")
    assert lines[-1] == b""
    want = {f"{name}-{i:05d}-{'x' * 40}".encode() for name in names for i in range(n)}
    missing = sorted(w[:8].decode() for w in want - set(lines))
    assert len(lines) - 1 == len(want), f"{len(lines) - 1} lines of {len(want)}, missing {missing}"
    assert set(lines[:-1]) == want


@pytest.mark.parametrize("how", ["flock", "lockf", "ofd", "append"])
def test_processes_on_two_mounts_append_under_locks(url, how, mount_factory):
    """Two processes, one per mount, append lines to one file under a lock (``flock``,
    ``lockf``, OFD locks: at ``lseek(SEEK_END)``; ``O_APPEND`` under ``flock``), one open
    descriptor each for the whole run: every line is there once, none mangled. (A drop of
    the kernel's attributes decided by the change feed on the request thread was queued after
    the reply of a lock granted on the waiters' thread: the kernel then ignored the size the
    next ``lseek(SEEK_END)`` was given, and a line was written over; about one run in four
    of 600 lines on Redis and PostgreSQL.)"""
    ms = mounts(mount_factory, url, 2)
    (ms[0].path / "log").write_bytes(b"")
    shown(*(m.path / "log" for m in ms))
    n = 150
    names = [f"p{i}" for i in range(len(ms))]
    run_all(
        [
            [sys.executable, "-c", APPENDER, str(m.path / "log"), how, name, str(n)]
            for m, name in zip(ms, names, strict=True)
        ]
    )
    for m in ms:
        check_lines((m.path / "log").read_bytes(), names, n)


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
def test_processes_on_three_mounts_append_under_flock(kind, tmp_path, request, mount_factory):
    ms = mounts(mount_factory, make_url(kind, tmp_path, request), 3)
    (ms[0].path / "log").write_bytes(b"")
    shown(*(m.path / "log" for m in ms))
    n = 50
    names = [f"p{i}" for i in range(len(ms))]
    run_all(
        [
            [sys.executable, "-c", APPENDER, str(m.path / "log"), "flock", name, str(n)]
            for m, name in zip(ms, names, strict=True)
        ]
    )
    check_lines((ms[1].path / "log").read_bytes(), names, n)


# --- an SQLite database file on the mount, written from two mounts ------------------------------------

INSERTER = textwrap.dedent(
    """
    import sqlite3, sys
    path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    con = sqlite3.connect(path, timeout=120, isolation_level=None)
    for i in range(n):
        con.execute("INSERT INTO t VALUES (?, ?)", (name, i))  # its own transaction
    con.close()
    """
)


def test_an_sqlite_database_on_the_mount_written_from_two_mounts(url, mount_factory):
    """Two processes, one per mount, insert rows into one SQLite database file that lives on
    the mount (rollback journal; SQLite's POSIX locks), each insert its own transaction: every
    committed row is there and ``PRAGMA integrity_check`` says ok (before: one process's rows
    vanished)."""
    a, b = mounts(mount_factory, url, 2)
    con = sqlite3.connect(a.path / "rows.db")
    con.execute("CREATE TABLE t(who TEXT, i INTEGER)")
    con.commit()
    con.close()
    shown(b.path / "rows.db")
    n = 40
    run_all(
        [
            [sys.executable, "-c", INSERTER, str(m.path / "rows.db"), name, str(n)]
            for m, name in ((a, "a"), (b, "b"))
        ]
    )
    for m in (a, b):
        con = sqlite3.connect(m.path / "rows.db")
        try:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            rows = sorted(con.execute("SELECT who, i FROM t"))
        finally:
            con.close()
        assert rows == sorted([("a", i) for i in range(n)] + [("b", i) for i in range(n)])


# --- what a commit keeps -----------------------------------------------------------------------------


def test_a_commit_keeps_bytes_another_mount_committed_since_the_open(url, mount_factory):
    """No lock: two mounts open one file, each writes its own range and closes; both ranges
    are there, and the size is the larger of the two."""
    a, b = mounts(mount_factory, url, 2)
    (a.path / "f").write_bytes(b"." * 20)
    shown(b.path / "f")
    fa = os.open(a.path / "f", os.O_RDWR)
    fb = os.open(b.path / "f", os.O_RDWR)
    os.pwrite(fa, b"AAAA", 0)
    os.pwrite(fb, b"BBBB", 10)
    os.pwrite(fa, b"aa", 22)  # past the end: zeros between
    os.close(fa)
    os.close(fb)
    want = b"AAAA" + b"." * 6 + b"BBBB" + b"." * 6 + b"\0\0aa"
    assert (a.path / "f").read_bytes() == want
    assert (b.path / "f").read_bytes() == want


@pytest.mark.parametrize("how", ["append", "ftruncate"])
def test_a_change_after_another_mounts_chmod_keeps_that_mode(url, how, mount_factory):
    """A file opened through one mount, then chmod'ed through another before the first one
    changes it: the first one's commit keeps the new mode (the attributes its open read are
    no longer the file's), once the chmod shows there."""
    a, b = mounts(mount_factory, url, 2)
    (a.path / "f").write_bytes(b"one\n")
    shown(b.path / "f")
    fd = os.open(a.path / "f", os.O_WRONLY | os.O_APPEND if how == "append" else os.O_RDWR)
    try:
        os.chmod(b.path / "f", 0o600)
        shows = lambda: stat.S_IMODE(os.stat(a.path / "f").st_mode) == 0o600  # noqa: E731
        eventually(shows, "the chmod, on the other mount")
        if how == "append":
            os.write(fd, b"two\n")
        else:
            os.ftruncate(fd, 2)
    finally:
        os.close(fd)
    want = b"one\ntwo\n" if how == "append" else b"on"
    for m in (a, b):
        eventually(lambda m=m: (m.path / "f").read_bytes() == want, "the change, on both mounts")
        assert stat.S_IMODE(os.stat(m.path / "f").st_mode) == 0o600


def test_a_rewrite_from_empty_replaces_the_whole_file(url, mount_factory):
    """``O_TRUNC`` then writes (Zarr clients, ``cp``): the file is the one written, whatever
    another mount committed since the open; an ``O_APPEND`` write lands at the newest end."""
    a, b = mounts(mount_factory, url, 2)
    (a.path / "f").write_bytes(b"old content\n")
    shown(b.path / "f")
    fb = os.open(b.path / "f", os.O_WRONLY | os.O_TRUNC)
    fapp = os.open(a.path / "g", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fapp, b"1\n")
    os.close(fapp)
    shown(b.path / "g")
    fapp = os.open(b.path / "g", os.O_WRONLY | os.O_APPEND)
    (a.path / "f").write_bytes(b"a longer content from mount a\n")
    with open(a.path / "g", "ab") as f:
        f.write(b"2\n")
    os.write(fb, b"new\n")
    os.write(fapp, b"3\n")
    os.close(fb)
    os.close(fapp)
    assert (b.path / "f").read_bytes() == b"new\n"
    assert (a.path / "f").read_bytes() == b"new\n"
    assert (a.path / "g").read_bytes() == b"1\n2\n3\n"


# --- which closes commit --------------------------------------------------------------------------


def test_a_readers_close_publishes_no_unfinished_write(url, mount_factory):
    """A writer on mount A truncates and writes, without closing; a ``cat`` on A (a read-only
    open and close) publishes nothing: mount B and the database keep the committed content
    until the writer closes."""
    a, b = mounts(mount_factory, url, 2)
    old = b"x" * 100_000
    (a.path / "f").write_bytes(old)
    shown(b.path / "f")
    with open(a.path / "f", "r+b") as w:
        w.truncate(0)
        w.write(b"HALF")
        w.flush()
        assert (a.path / "f").read_bytes() == b"HALF"  # this mount sees it; its close stores nothing
        assert (b.path / "f").read_bytes() == old
        fd = os.open(a.path / "f", os.O_RDONLY)
        os.close(fd)
        assert (b.path / "f").read_bytes() == old
    assert (b.path / "f").read_bytes() == b"HALF"


@pytest.mark.parametrize("size", [1000, 100_000, 1 << 20])
def test_a_small_file_reads_its_version_until_closed(url, size, mount_factory):
    """A file up to the held-whole size, opened on mount B after B read it once (the kernel
    holds its pages) and then rewritten on mount A: B's descriptor reads the version it opened,
    never ESTALE; the next open reads the new one."""
    a, b = mounts(mount_factory, url, 2)
    first, second = b"1" * size, b"2" * size
    (a.path / "f").write_bytes(first)
    shown(b.path / "f")
    assert (b.path / "f").read_bytes() == first
    fd = os.open(b.path / "f", os.O_RDONLY)
    try:
        (a.path / "f").write_bytes(second)
        for _ in range(3):
            try:
                got = os.pread(fd, size, 0)
            except OSError as exc:
                assert exc.errno != errno.ESTALE, "ESTALE for a file held whole"
                raise
            assert got == first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the kernel lets its pages go
    finally:
        os.close(fd)
    assert (b.path / "f").read_bytes() == second


# --- permission checks see another mount's chown ------------------------------------------------------

# From inside the mount, as pjdfstest runs: the folders above it are root's alone (pytest's).
AS_NOBODY = (
    "import os, sys; os.chdir(sys.argv[1]); os.setgid(65534); os.setuid(65534); "
    "os.chmod(sys.argv[2], int(sys.argv[3], 8))"
)


def chmod_as_nobody(path, mode: int) -> subprocess.CompletedProcess:
    args = [sys.executable, "-c", AS_NOBODY, str(path.parent), path.name, oct(mode)]
    return subprocess.run(args, capture_output=True, text=True)


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
def test_a_chown_on_one_mount_is_what_the_others_permission_checks_see(kind, tmp_path, request, mount_factory):  # noqa: E501
    """The kernel checks a chmod's caller against the owner it caches (``default_permissions``):
    once another mount's chown has come through the change feed, that owner is the new one.
    pjdfstest's chmod/00 and chmod/07 over two mounts: a file created on one mount, given away
    (or taken back) on the other, then chmod by its new owner (allowed) and by its old one
    (EPERM)."""
    url = make_url(kind, tmp_path, request)
    a = mount_factory(url, ["create", "allow_other"])
    b = mount_factory(url, ["allow_other"])
    os.close(os.open(a.path / "f", os.O_CREAT | os.O_WRONLY, 0o755))
    shown(b.path / "f")
    os.chown(b.path / "f", 65534, 65534)
    (b.path / "after-chown").write_bytes(b"")  # the feed brings it after the chown
    shown(a.path / "after-chown")
    done = chmod_as_nobody(a.path / "f", 0o2755)
    assert done.returncode == 0, done.stderr  # nobody's file now: allowed
    os.chown(b.path / "f", 0, 0)
    (b.path / "after-chown-2").write_bytes(b"")
    shown(a.path / "after-chown-2")
    done = chmod_as_nobody(a.path / "f", 0o644)
    assert done.returncode != 0 and "PermissionError" in done.stderr, done.stderr  # root's again


# --- hard links made and removed through another mount ------------------------------------------------


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
def test_a_hard_link_removed_through_another_mount(kind, tmp_path, request, mount_factory):
    """pjdfstest's link/02 and link/03 over two mounts: a file made on A, linked on B, its
    first name removed on A: B still reads it by the name left (B answered ENOENT until a
    remount; then, now and then under load, when B's kernel had let go of the name removed
    and looked it up, the open of the name left went by the node's first name, taken before
    the open asked the change feed: test_session.py has both orders without a kernel)."""
    a, b = mounts(mount_factory, make_url(kind, tmp_path, request), 2)
    (a.path / "f").write_bytes(b"x")
    shown(b.path / "f")
    os.link(b.path / "f", b.path / "g")
    assert os.stat(b.path / "g").st_nlink == 2
    shown(a.path / "g")
    os.unlink(a.path / "f")
    eventually(lambda: not os.path.exists(b.path / "f"), "f gone on b")
    assert (b.path / "g").read_bytes() == b"x"
    assert os.stat(b.path / "g").st_nlink == 1


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
def test_a_hard_link_made_through_another_mount(kind, tmp_path, request, mount_factory):
    """pjdfstest's rename/23 over two mounts: a file made on B, linked on A: on B both names
    are one file (one inode number, two links; B gave the new name a node of its own, and
    then, now and then under load, when it looked the new name up before its change feed
    told the link)."""
    a, b = mounts(mount_factory, make_url(kind, tmp_path, request), 2)
    (b.path / "h").write_bytes(b"y")
    shown(a.path / "h")
    assert os.stat(b.path / "h").st_nlink == 1  # b holds the node of h
    os.link(a.path / "h", a.path / "i")
    shown(b.path / "i")

    def one_file() -> bool:
        h, i = os.stat(b.path / "h"), os.stat(b.path / "i")
        return h.st_ino == i.st_ino and h.st_nlink == i.st_nlink == 2

    eventually(one_file, "h and i one file on b")


def names_shown(root) -> tuple:
    """``l`` and ``x`` under ``root`` as a local folder shows them after ``y`` was renamed
    onto ``x``, one of two names of a file: their contents, link counts, whether they are one
    inode, whether ``y`` is still there."""
    ls, xs = os.stat(root / "l"), os.stat(root / "x")
    content = ((root / "l").read_bytes(), (root / "x").read_bytes())
    return content, (ls.st_nlink, xs.st_nlink), ls.st_ino == xs.st_ino, os.path.exists(root / "y")


@pytest.mark.parametrize("through", ["this", "other"])
def test_a_rename_onto_one_name_of_a_linked_file_leaves_its_other_name(url, through, mount_factory):
    """``rename(y, x)`` where ``x`` and ``l`` are one file replaces the name ``x`` only: on
    every mount ``l`` keeps the old content and its inode number, with one link, and a
    descriptor open on it reads on; made through the mount that watches (``this``) or through
    another (``other``: the watching mount gave ``x`` and ``l`` one node still, so ``l``
    showed ``y``'s content)."""
    a, b = mounts(mount_factory, url, 2)
    via = a if through == "this" else b
    (a.path / "x").write_bytes(b"old content")
    (a.path / "y").write_bytes(b"new")
    shown(b.path / "x", b.path / "y")
    os.link(b.path / "x", b.path / "l")
    shown(a.path / "l")
    eventually(lambda: os.stat(a.path / "x").st_nlink == 2, "x linked on a")
    assert names_shown(a.path) == ((b"old content", b"old content"), (2, 2), True, True)
    ino = os.stat(a.path / "l").st_ino
    fd = os.open(a.path / "l", os.O_RDONLY)
    try:
        os.rename(via.path / "y", via.path / "x")
        after = ((b"old content", b"new"), (1, 1), False, False)
        for m in (a, b):
            eventually(lambda m=m: names_shown(m.path) == after, f"the rename's outcome on {m.path}")
        assert os.stat(a.path / "l").st_ino == ino
        assert os.pread(fd, 100, 0) == b"old content" and os.fstat(fd).st_nlink == 1
    finally:
        os.close(fd)

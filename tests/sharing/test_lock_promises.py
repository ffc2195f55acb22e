"""The two promises of a lock taken through a mount (docs/guarantees.md, "With locks"; NFS's
lock consistency), each observed directly on every driver, without a race to win:

* a grant shows the newest size and content, even where the kernel of the granting mount holds
  the old ones: mount B follows no change feed (``-o feed=0``) and keeps what its kernel cached
  for an hour (``cache_timeout=3600``), so the grant's drop of the kernel's cached pages and
  attributes (``fuse/lockreq.py``) is the only thing that can show mount A's new version;
* a release commits before another mount's lock is granted: when B's waiting ``F_SETLKW``
  returns, the database itself (read with a driver of its own, no mount between) holds what A
  wrote under the lock, though A still has the file open (so no close committed it).
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading

import pytest
from mounting import DRIVERS, eventually, make_url, needs_fuse

from zarrfs.backends.registry import open_driver

pytestmark = needs_fuse

OLD = b"old version\n" * 10  # 120 bytes
NEW = b"the newest version, longer than the old\n" * 7  # 280 bytes


@pytest.fixture(params=DRIVERS)
def url(request, tmp_path) -> str:
    return make_url(request.param, tmp_path, request)


def setlkw(fd: int, kind: int) -> None:
    """A POSIX record lock on the whole file (``F_SETLKW``: waits for a conflicting one)."""
    fcntl.fcntl(fd, fcntl.F_SETLKW, struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 0, 0))


# fcntl's system call number, by machine: a thread waiting in it shows it in /proc.
SYS_FCNTL = {"x86_64": 72, "aarch64": 25}.get(os.uname().machine)


def lock_in_thread(fd: int) -> tuple[threading.Thread, list]:
    """``F_SETLKW`` of a write lock on ``fd`` in a thread of its own, started, and once it waits
    in the system call (its request is with the mount's daemon); the list its outcome goes to:
    ``None`` once granted, else the error."""
    return _waiting(lambda: setlkw(fd, fcntl.F_WRLCK))


def _waiting(call) -> tuple[threading.Thread, list]:
    """``call()`` (a lock request that must wait) in a thread, as :func:`lock_in_thread`."""
    out: list = []
    tids: list[int] = []

    def run() -> None:
        tids.append(threading.get_native_id())
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    eventually(lambda: bool(tids), "the locking thread started")

    def in_fcntl() -> bool:
        try:
            with open(f"/proc/self/task/{tids[0]}/syscall") as fh:
                return fh.read().split()[0] == str(SYS_FCNTL)
        except (FileNotFoundError, IndexError):
            return False

    if SYS_FCNTL is not None:
        eventually(lambda: in_fcntl() or not thread.is_alive(), "the lock request waiting")
    assert thread.is_alive(), out  # not granted while another mount holds the lock
    return thread, out


def shows(fd: int, want: bytes) -> None:
    """What ``lseek(SEEK_END)``, a read of the whole file and ``fstat`` give through ``fd``, in
    that order: the first two take the size the kernel holds while it is valid, where an
    ``fstat`` after a read asks the daemon (for the time of access) and the kernel drops its
    pages itself on seeing another size."""
    assert os.lseek(fd, 0, os.SEEK_END) == len(want)
    assert os.pread(fd, 4096, 0) == want
    assert os.fstat(fd).st_size == len(want)


def rewrite_under_a_lock(path, data: bytes, held=None) -> None:
    """Through one mount: lock, rewrite to ``data`` (another size), unlock; ``held()`` runs
    while the lock is held and the new content written, before the unlock."""
    fd = os.open(path, os.O_RDWR)
    try:
        setlkw(fd, fcntl.F_WRLCK)
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        if held is not None:
            held()
        setlkw(fd, fcntl.F_UNLCK)
    finally:
        os.close(fd)


def cached_on(b, name: str) -> int:
    """A descriptor of mount B on ``name``, whose whole content (``OLD``) and size B's kernel
    now holds."""
    eventually(lambda: (b.path / name).exists(), f"{name} on the second mount")
    fd = os.open(b.path / name, os.O_RDWR)
    shows(fd, OLD)
    return fd


def test_a_grant_shows_the_newest_size_and_content_the_kernel_had_cached_old(url, mount_factory):
    """Two grants on B, each after A rewrote the file B's kernel holds: one granted at once (A
    unlocked before), one that waited for A's unlock (granted from the waiters' thread)."""
    a = mount_factory(url, ["create"], name="a")
    b = mount_factory(url, ["feed=0", "cache_timeout=3600"], name="b")
    for name in ("now", "waited"):
        (a.path / name).write_bytes(OLD)
    for name in ("now", "waited"):
        fd = cached_on(b, name)
        try:
            if name == "now":
                rewrite_under_a_lock(a.path / name, NEW)
                setlkw(fd, fcntl.F_WRLCK)
            else:
                waiter: list = []

                def held(fd=fd, waiter=waiter) -> None:
                    waiter.extend(lock_in_thread(fd))

                rewrite_under_a_lock(a.path / name, NEW, held)
                waiter[0].join(60)
                assert not waiter[0].is_alive() and waiter[1] == [None], waiter
            shows(fd, NEW)  # the descriptor that read the old version
            fresh = os.open(b.path / name, os.O_RDONLY)
            try:
                shows(fresh, NEW)
            finally:
                os.close(fresh)  # releases this process's POSIX locks of the file on B
        finally:
            os.close(fd)


def test_a_release_commits_before_another_mounts_lock_is_granted(url, mount_factory):
    """A writes under a lock and unlocks with the file still open; B's ``F_SETLKW``, waiting
    meanwhile, returns only once the database holds A's write, read at that moment through a
    driver of the test's own."""
    a = mount_factory(url, ["create"], name="a")
    b = mount_factory(url, [], name="b")
    (a.path / "f").write_bytes(OLD)
    eventually(lambda: (b.path / "f").exists(), "f on the second mount")
    database = open_driver(url, readonly=True)
    fa = os.open(a.path / "f", os.O_RDWR)
    fb = os.open(b.path / "f", os.O_RDWR)
    try:
        setlkw(fa, fcntl.F_WRLCK)
        os.ftruncate(fa, 0)
        os.pwrite(fa, NEW, 0)

        def granted() -> bytes | None:
            setlkw(fb, fcntl.F_WRLCK)
            return database.get("f")  # at once: what the database holds as the grant returns

        waiter, seen = _waiting(granted)
        assert database.get("f") == OLD  # A's write is pending in A
        setlkw(fa, fcntl.F_UNLCK)
        waiter.join(60)
        assert not waiter.is_alive()
        assert seen == [NEW], "B's lock was granted before A's release committed"
        assert os.pread(fb, 4096, 0) == NEW
    finally:
        os.close(fb)
        os.close(fa)
        database.close()

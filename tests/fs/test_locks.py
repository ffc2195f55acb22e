"""Locks held in the database (``zarrfs/fs/locks.py``): the lock table against every driver,
through the drivers' transactions and without a mount; then ``flock`` and ``fcntl`` locks
through two mounts of one database, each served by its own daemon, in two processes."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from mounting import Spinner, make_url

from zarrfs.backends.registry import open_driver
from zarrfs.fs.locks import LEASE, RDLCK, UNLCK, WRLCK, LockTable, Waiters

END = (1 << 63) - 1  # OFFSET_MAX: "to the end of the file"


@pytest.fixture(params=["memory", "lmdb", "sqlite", "redis", "postgres", "cluster"])
def lock_url(request, tmp_path):
    if request.param == "memory":
        return f"memory://locks-{uuid.uuid4().hex}"
    return make_url(request.param, tmp_path, request)


@pytest.fixture
def two_mounts(lock_url):
    """Two lock tables ("mounts") over two drivers of one database, with a clock to move."""
    now = [1000.0]
    drivers = [open_driver(lock_url) for _ in range(2)]
    tables = [LockTable(d, mount=f"m{i}", clock=lambda: now[0]) for i, d in enumerate(drivers)]
    yield tables, now
    for d in drivers:
        d.close()


def test_conflicts_between_mounts(two_mounts):
    (a, b), _ = two_mounts
    assert a.set("f", 1, 0, END, WRLCK, 11)
    assert not b.set("f", 2, 0, 0, RDLCK, 22)  # any overlap with a write lock conflicts
    held = b.test("f", 2, 5, 9, RDLCK)
    assert held is not None and (held.mount, held.type, held.pid) == ("m0", WRLCK, 0)
    assert a.test("f", 1, 0, END, WRLCK) is None  # an owner never conflicts with itself
    assert b.set("f", 2, 0, 0, WRLCK, 22, flock=True)  # flock and POSIX locks are apart
    a.set("f", 1, 0, END, UNLCK, 11)
    assert b.set("f", 2, 0, 9, WRLCK, 22)


def test_posix_ranges_split_and_read_locks_share(two_mounts):
    (a, b), _ = two_mounts
    assert a.set("f", 1, 0, 99, WRLCK, 11)
    assert a.set("f", 1, 40, 59, UNLCK, 11)  # a hole in the middle
    assert b.set("f", 2, 40, 59, WRLCK, 22)
    assert not b.set("f", 2, 30, 45, WRLCK, 22)
    assert a.set("f", 1, 0, 39, RDLCK, 11)  # downgraded in place
    assert b.set("f", 3, 0, 10, RDLCK, 33)
    assert not b.set("f", 3, 60, 60, RDLCK, 33)  # still a write lock from 60 on
    a.release("f", 1)
    assert b.set("f", 3, 60, END, WRLCK, 33)


def test_a_dead_mounts_locks_expire_with_its_lease(two_mounts):
    (a, b), now = two_mounts
    assert a.set("f", 1, 0, END, WRLCK, 11)
    now[0] += a.lease / 2
    assert not b.set("f", 2, 0, END, WRLCK, 22)
    a.renew()  # a live mount keeps its locks
    now[0] += a.lease * 0.9
    assert not b.set("f", 2, 0, END, WRLCK, 22)
    now[0] += a.lease  # no renewal since: "a" is dead
    assert b.set("f", 2, 0, END, WRLCK, 22)
    assert [lk.mount for lk in b.driver.transact(lambda t: b._live(t, "f")[0], write=False)] == ["m1"]


def test_waiters_are_granted_after_release_and_cancelled_with_eintr(two_mounts):
    (a, b), _ = two_mounts
    answers: list[tuple[int, int]] = []
    got = threading.Event()

    def answer(request, code):
        answers.append((request, code))
        got.set()

    waiters = Waiters(b, answer)
    try:
        assert a.set("f", 1, 0, END, WRLCK, 11)
        assert not b.set("f", 2, 0, END, WRLCK, 22)
        waiters.wait(7, ("f", 2, 0, END, WRLCK, 22, False))
        waiters.wait(8, ("f", 3, 0, END, WRLCK, 33, False))
        time.sleep(0.3)
        assert answers == []
        waiters.cancel(8)
        assert answers == [(8, errno.EINTR)]
        got.clear()
        a.set("f", 1, 0, END, UNLCK, 11)  # another mount's release: found by polling
        assert got.wait(60)
        got.clear()
        assert answers[-1] == (7, 0)
        assert b.test("f", 9, 0, 0, WRLCK).owner == 2
        waiters.cancel(9)  # an interrupt before its request: the request is refused at once
        waiters.wait(9, ("f", 9, 0, END, WRLCK, 99, False))
        assert answers[-1] == (9, errno.EINTR)
    finally:
        waiters.stop()


# --- through mounts ----------------------------------------------------------------------------

COUNTER = textwrap.dedent(
    """
    import fcntl, os, sys
    folder, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lock = os.open(os.path.join(folder, "lockfile"), os.O_RDWR | os.O_CREAT)
    for _ in range(n):
        # what zarr-python 2's ProcessSynchronizer does (fasteners: fcntl locks on a lock file)
        if kind == "flock":
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.lockf(lock, fcntl.LOCK_EX)
        path = os.path.join(folder, "count")
        with open(path) as f:
            value = int(f.read())
        with open(path, "w") as f:
            f.write(str(value + 1))
        if kind == "flock":
            fcntl.flock(lock, fcntl.LOCK_UN)
        else:
            fcntl.lockf(lock, fcntl.LOCK_UN)
    """
)


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
@pytest.mark.parametrize("lock", ["flock", "fcntl"])
def test_two_mounts_increment_a_counter_under_a_lock(kind, lock, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    # cache_timeout=0: each open sees the other mount's last write (no cached size or pages)
    m1 = mount_factory(url, ["create", "cache_timeout=0"])
    m2 = mount_factory(url, ["cache_timeout=0"])
    (m1.path / "count").write_text("0")
    n = 40
    procs = [
        subprocess.Popen([sys.executable, "-c", COUNTER, str(m.path), lock, str(n)]) for m in (m1, m2)
    ]
    for p in procs:
        assert p.wait(120) == 0
    assert (m1.path / "count").read_text() == str(2 * n)


HOLD = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_daemons_lock_is_released_after_the_lease(tmp_path, request, mount_factory):
    url = make_url("redis", tmp_path, request)
    m1 = mount_factory(url, ["create"])
    m2 = mount_factory(url)
    (m1.path / "lk").write_bytes(b"")  # stored: a file being created shows in its mount only
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(m1.path / "lk")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        fd = os.open(m2.path / "lk", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pid = int(re.search(r"zarrfs\[(\d+)\]", m1.log_text()).group(1))
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        # Waits in the daemon (SETLKW), in a thread: a lock never released fails the test.
        taker = threading.Thread(target=fcntl.flock, args=(fd, fcntl.LOCK_EX), daemon=True)
        taker.start()
        taker.join(6 * LEASE)
        assert not taker.is_alive(), f"not granted {6 * LEASE:.0f} s after its holder was killed"
        waited = time.monotonic() - killed
        assert waited < 2 * LEASE, waited  # the lease lapsed, and the waiter was told
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()


def test_a_waiting_lock_is_interrupted(tmp_path, mount_factory):
    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create"])
    (m.path / "f").write_bytes(b"")
    first, second, third = (os.open(m.path / "f", os.O_RDWR) for _ in range(3))
    fcntl.flock(first, fcntl.LOCK_EX)

    def interrupted(signum, frame):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, interrupted)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(TimeoutError):  # the daemon answered the interrupt (EINTR)
            fcntl.flock(second, fcntl.LOCK_EX)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    fcntl.flock(first, fcntl.LOCK_UN)
    fcntl.flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the interrupted request holds nothing
    for fd in (first, second, third):
        os.close(fd)


def test_an_idle_mount_renews_its_lease_without_spinning():
    """With nobody waiting for a lock, the waiters' thread sleeps until the lease is due, renews
    it, and sleeps again (it once looped without sleeping or renewing once a renewal was due:
    a core busy and the GIL contended by every idle mount)."""
    driver = open_driver(f"memory://locks-{uuid.uuid4().hex}")
    table = LockTable(driver, mount="m", lease=0.2)  # renewed every 0.05 s
    renewals = []
    renew = table.renew
    table.renew = lambda: renewals.append(time.monotonic()) or renew()
    waiters = Waiters(table, lambda request, code: None)
    spinner = Spinner()  # the baseline: what a loop that never sleeps gets meanwhile
    try:
        started, cpu = time.monotonic(), time.process_time()
        while time.monotonic() - started < 1.0 or len(renewals) < 5:  # the waiters' thread runs
            assert time.monotonic() - started < 60, renewals
            time.sleep(0.05)
        busy = time.process_time() - cpu
    finally:
        spun = spinner.stop()
        waiters.stop()
        driver.close()
    assert busy < spun / 4, f"{busy:.2f} s of CPU while idle; a spinning process got {spun:.2f} s"

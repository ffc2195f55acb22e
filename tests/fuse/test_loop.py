"""The request loop and the daemon's tuning: the pieces alone, then real mounts that use them
(spinning on and off, the read-ahead the kernel ends up with, a large file read in 1 MiB
requests)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from mounting import needs_fuse, unavailable

from zarrfs.backends import open_driver
from zarrfs.cli.main import daemon_pids
from zarrfs.fuse import loop as loop_module
from zarrfs.fuse.channel import option_string
from zarrfs.fuse.loop import DEFAULT_SPIN_US, Loop
from zarrfs.fuse.tuning import DEFAULT_READAHEAD_KIB, keep_freed_memory, mount_device
from zarrfs.options import MountOptions, UsageError, parse_options
from zarrfs.spin import next_window


def test_mount_options_for_libfuse_and_cache_times_for_the_session():
    assert option_string({"fsname": "lmdb:///x", "ro": True, "allow_other": False, "max_read": 4096}) == (
        "fsname=lmdb:///x,ro,max_read=4096"
    )
    opts = parse_options(["cache_timeout=3,negative_timeout=0,allow_other"])
    assert (opts.cache_timeout, opts.negative_timeout, opts.entry_timeout) == (3.0, 0.0, None)
    assert opts.fuse == {"allow_other": True}
    with pytest.raises(UsageError):
        parse_options(["attr_timeout=-1"])


def test_spin_window_refills_on_a_short_gap_and_halves_on_long_ones():
    longest = 200e-6
    assert next_window(0.0, 150e-6, longest) == longest
    window = longest
    for expected in (100e-6, 50e-6, 25e-6):
        window = next_window(window, 1.0, longest)
        assert window == pytest.approx(expected)
    for _ in range(20):
        window = next_window(window, 1.0, longest)
    assert window == 0.0
    assert next_window(window, 10e-6, longest) == longest


def test_the_feed_is_looked_at_when_its_descriptor_wakes_the_loop_or_when_due_not_before_each_request(
    monkeypatch,
):
    """A client whose requests come apart (the loop sleeps between them: no spinning, or a
    program working between two stats) had the idle work (the change feed's look, several
    calls and two environment reads on LMDB) run after every wake, before every request. It
    runs when its descriptor woke the loop (another writer's commit), or once its interval
    is due; a request pipe stands for /dev/fuse."""
    requests_r, requests_w = os.pipe()
    feed_r, feed_w = os.pipe()
    os.set_blocking(feed_r, False)
    handled, idled = [], []

    def idle():
        idled.append(time.monotonic())
        try:
            os.read(feed_r, 64)
        except BlockingIOError:
            pass

    monkeypatch.setattr(loop_module, "IDLE_POLL_MS", 600_000)  # a sleeping loop's own wake: never here
    loop = Loop(requests_r, lambda buf: handled.append(bytes(buf)), 4096, spin_us=0,
                idle=idle, idle_interval=0.25, idle_fd=feed_r)
    thread = threading.Thread(target=loop.run)
    thread.start()
    try:
        started = time.monotonic()
        for i in range(60):  # 60 requests 2 ms apart: about 0.15 s, under one interval
            os.write(requests_w, b"r%02d" % i)
            time.sleep(0.002)
        deadline = time.monotonic() + 30
        while len(b"".join(handled)) < 180 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(b"".join(handled)) == 180
        # Once an interval at most (however slow a loaded machine made the 60), not once a
        # wake: 59 before.
        assert len(idled) <= (time.monotonic() - started) / 0.25 + 3, len(idled)
        before = len(idled)
        os.write(feed_w, b"x")  # another writer's commit: its descriptor wakes the loop
        deadline = time.monotonic() + 60
        while len(idled) == before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(idled) > before
    finally:
        os.close(requests_w)  # the loop ends at the end of its input
        thread.join(10)
        for fd in (requests_r, feed_r, feed_w):
            os.close(fd)
    assert not thread.is_alive()


def test_spin_and_readahead_options():
    opts = parse_options(["spin=0,readahead=4096"])
    assert (opts.spin, opts.readahead) == (0, 4096)
    defaults = MountOptions()
    assert (defaults.spin, defaults.readahead) == (DEFAULT_SPIN_US, DEFAULT_READAHEAD_KIB)
    for bad in ("spin=-1", "readahead=-5", "spin=fast"):
        with pytest.raises(UsageError):
            parse_options([bad])


def test_mount_device_reads_the_topmost_mount_and_unescapes_spaces(tmp_path):
    folder = tmp_path / "a b"
    folder.mkdir()
    escaped = str(folder).replace(" ", "\\040")
    table = tmp_path / "mountinfo"
    table.write_text(
        f"36 25 0:32 / {escaped} rw,nosuid - fuse.zarrfs lmdb rw\n"
        f"40 36 0:45 / {escaped} rw,nosuid - fuse.zarrfs lmdb rw\n"
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
    )
    assert mount_device(os.path.realpath(folder), str(table)) == "0:45"
    assert mount_device(str(tmp_path), str(table)) is None
    assert mount_device(str(folder), str(tmp_path / "missing")) is None


def test_keep_freed_memory_applies_on_glibc():
    # This machine runs glibc; elsewhere the call reports False and changes nothing.
    assert keep_freed_memory() is True


# ---------------------------------------------------------------------- through real mounts
def daemon_pid(m) -> int:
    pids = daemon_pids(str(m.path))
    assert len(pids) == 1, pids
    return pids[0]


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TestThroughMounts:
    pytestmark = needs_fuse

    @pytest.mark.parametrize("spin", ["0", "200"])
    def test_mount_serves_with_and_without_spinning(self, tmp_path, mount_factory, spin):
        m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create", f"spin={spin}"])
        for i in range(200):
            (m.path / f"f{i}").write_bytes(str(i).encode())
        assert sorted(os.listdir(m.path), key=lambda n: int(n[1:])) == [f"f{i}" for i in range(200)]
        assert all((m.path / f"f{i}").read_bytes() == str(i).encode() for i in range(200))
        assert not os.path.exists(m.path / "missing")

    def test_idle_spinning_mount_uses_no_cpu(self, tmp_path, mount_factory):
        m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create"])
        pid = daemon_pid(m)
        start = _cpu_seconds(pid)
        for i in range(500):  # a burst of lookups keeps the loop spinning
            (m.path / f"missing{i}").exists()
        burst = _cpu_seconds(pid) - start  # the baseline: what 500 lookups cost, in this run
        time.sleep(0.3)  # the window closes; the loop sleeps
        before = _cpu_seconds(pid)
        time.sleep(2)
        # A loop spinning for 2 s would burn far more than 500 lookups did; one asleep, nothing:
        # it sleeps on the change feed's descriptor (filewatch). Looking at the feed 50 times a
        # second cost as much as the burst did (0.03 s), which this catches.
        idle = _cpu_seconds(pid) - before
        assert idle < max(burst, 0.02), (burst, idle)

    def test_readahead_is_set_on_the_mount(self, tmp_path, mount_factory):
        if os.geteuid() != 0:
            unavailable("setting a mount's read-ahead needs root")
        m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create", "readahead=2048"])
        dev = os.stat(m.path).st_dev
        path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        assert open(path).read().strip() == "2048"
        data = os.urandom(9 << 20)
        (m.path / "big").write_bytes(data)
        assert (m.path / "big").read_bytes() == data

    def test_sigterm_caught_by_another_thread_still_ends_the_loop(self, tmp_path, mount_factory):
        """A process-wide signal may be handled by any thread of the daemon (here the one that
        sends invalidations, not the loop's): the loop sees the session end within its idle poll,
        and the daemon unmounts and exits with the data committed."""
        url = f"lmdb://{tmp_path}/db.lmdb"
        m = mount_factory(url, ["create"])
        (m.path / "kept").write_bytes(b"1")
        pid = daemon_pid(m)
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        assert others, "the daemon runs its invalidation thread"
        os.kill(others[0], signal.SIGTERM)  # delivered to that thread first
        deadline = time.monotonic() + 60
        while m.mounted():
            assert time.monotonic() < deadline, "still mounted 60 s after SIGTERM"
            time.sleep(0.05)
        with open_driver(url, readonly=True) as d:
            assert d.get("kept") == b"1"

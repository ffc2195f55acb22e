"""A Redis server that stops answering (``SIGSTOP``: a paused server, or a network partition):
its calls fail with ETIMEDOUT within ``-o timeout=``, a caller that gets a signal meanwhile
gets EINTR at once, and the mount works again, without a remount, once the server answers.

Each test starts a redis-server of its own, so that stopping it disturbs no other test."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

from conftest import start_redis, stop_redis
from mounting import eventually, needs_fuse, write

from zarrfs.backends import open_driver

pytestmark = needs_fuse

TIMEOUT = 2  # -o timeout= where a stall is waited out
LONG = 60  # ... where it is interrupted first: a wait for the timeout is far past the signal

# A stat in a process of its own: it prints the errno it got (0: none) and the seconds it took.
# With an alarm, SIGALRM comes after that many seconds and its handler ends the call.
_STAT = """
import os, signal, sys, time
class Alarm(Exception):
    pass
def ring(*_):
    raise Alarm
signal.signal(signal.SIGALRM, ring)
alarm = float(sys.argv[2])
if alarm:
    signal.setitimer(signal.ITIMER_REAL, alarm)
start = time.monotonic()
try:
    os.stat(sys.argv[1])
    what = "0"
except Alarm:
    what = "alarm"
except OSError as exc:
    what = str(exc.errno)
print(what, time.monotonic() - start)
"""


def timed_stat(path, alarm: float = 0.0, limit: float = 20.0) -> tuple[str, float]:
    """``os.stat(path)`` in a child process: what it ended with and how long it took. A stat
    still waiting after ``limit`` seconds fails the test (and is killed).

    The seconds are compared with the mount's ``-o timeout=``, never with a figure of their
    own: a stall ends on a timer, which a busy machine delays by little, and a wrong wait (one
    that ignores the timeout, retries or waits it out where an interrupt should end it) is off
    by several times the timeout."""
    args = [sys.executable, "-c", _STAT, str(path), str(alarm)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise AssertionError(f"stat of {path} still waiting after {limit} s") from None
    what, seconds = out.split()
    return what, float(seconds)


def large_folder(m) -> None:
    """A folder "big" of mount ``m`` larger than a lookup reads whole, made by another client:
    a name missing there is asked of the database at every lookup (one of a small folder the
    mount has read is answered at once)."""
    with open_driver(m.url) as d:
        d.transact(lambda t: [t.put(f"big/{i:03d}", b"x") for i in range(300)])
    eventually(lambda: os.path.isdir(m.path / "big"), "a folder another client made")


def test_a_stalled_server_is_etimedout_within_the_timeout_and_the_mount_recovers(tmp_path, mount_factory):
    server = start_redis(str(tmp_path))
    try:
        # Names cached by the kernel: a stat's one request is the lookup of the missing name (a
        # failed lookup revalidating a cached folder would be retried by the kernel at once).
        m = mount_factory(server.url(0, prefix="stall"), ["create", "cache_timeout=60", f"timeout={TIMEOUT}"])
        write(m.path / "before", b"1")
        large_folder(m)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            for name in ("missing-1", "missing-2"):  # the first wait, then one on a new connection
                what, seconds = timed_stat(m.path / "big" / name, limit=10 * TIMEOUT)
                assert what == str(errno.ETIMEDOUT), (name, what)
                assert seconds < 5 * TIMEOUT, seconds  # one timeout, not a wait retried
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert (m.path / "before").read_bytes() == b"1"  # no remount
        write(m.path / "after", b"2")
        assert (m.path / "after").read_bytes() == b"2"
        assert "ETIMEDOUT" in m.log_text()
    finally:
        stop_redis(server)


def test_a_call_waiting_on_a_stalled_server_is_interrupted_with_eintr(tmp_path, mount_factory):
    server = start_redis(str(tmp_path))
    try:
        m = mount_factory(server.url(0, prefix="intr"), ["create", "cache_timeout=60", f"timeout={LONG}"])
        write(m.path / "cached", b"1")
        os.stat(m.path / "cached")
        large_folder(m)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            for name in ("missing-1", "missing-2", "cached-later"):  # the daemon goes on serving
                what, seconds = timed_stat(m.path / "big" / name, alarm=0.5, limit=LONG / 2)
                assert what == "alarm", (name, what)  # EINTR: the signal handler ran
                assert seconds < LONG / 4, seconds  # at the signal, not at the timeout
                assert os.stat(m.path / "cached").st_size == 1  # cached answers meanwhile
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        what, _ = timed_stat(m.path / "big" / "cached-later")
        assert what == str(errno.ENOENT)  # served again, without a remount
        write(m.path / "big" / "cached-later", b"22")
        assert (m.path / "big" / "cached-later").read_bytes() == b"22"
        assert (m.path / "cached").read_bytes() == b"1"
    finally:
        stop_redis(server)


def test_timeout_option():
    from zarrfs.backends.base import DEFAULT_TIMEOUT
    from zarrfs.options import UsageError, parse_options

    assert parse_options([]).timeout == DEFAULT_TIMEOUT
    assert parse_options(["timeout=2.5"]).timeout == 2.5
    for bad in ("timeout=0", "timeout=-1", "timeout=soon"):
        try:
            parse_options([bad])
        except UsageError:
            continue
        raise AssertionError(f"{bad} accepted")

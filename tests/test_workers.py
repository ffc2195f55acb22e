"""Requests served concurrently (``zarrfs.fuse.workers``), seen through a delaying proxy of
the server (``zarrfs.testing.proxy.DelayProxy``, 20 ms round trips) on Redis and PostgreSQL:

* readers of different files overlap their round trips (the proxy counts the connections that
  wait at once); with ``-o workers=1`` they never do, which shows the count can fail;
* a request whose server never answers holds up neither a read of another file nor a write
  in another folder (a create in the same folder waits in the kernel: a lookup holds the
  folder's lock shared, a create wants it whole);
* an interrupt ends only its own request: another request stalled beside it keeps waiting and
  is answered once the server answers.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest
from mounting import read, write

from zarrfs.testing.proxy import DelayProxy

pytestmark = [pytest.mark.mount, pytest.mark.usefixtures("fuse_required")]

DRIVERS = ["redis", "postgres"]


@pytest.fixture
def proxy():
    with DelayProxy(rtt_ms=20) as p:
        yield p


@pytest.fixture
def urls(request, proxy, tmp_path):
    """The database's URL, and the same through the proxy."""
    name = f"w{os.getpid()}_{abs(hash(request.node.name)) % 10**6}"
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        via = proxy.route(server.port)
        return server.url(0, prefix=name), f"redis://127.0.0.1:{via}/0?prefix={name}"
    server = request.getfixturevalue("postgres_server")
    via = proxy.route(server.port)
    direct = server.url(table=name)
    return direct, direct.replace(f":{server.port}/", f":{via}/")


def _fill(mount_factory, url: str, names: list[str], size: int = 4096) -> dict[str, bytes]:
    values = {n: os.urandom(size) for n in names}
    m = mount_factory(url, ["create"])
    (m.path / "a").mkdir()
    for n, v in values.items():
        write(m.path / "a" / n, v)
    m.stop()
    return values


def _read_all(paths, values) -> None:
    errors: list[BaseException] = []

    def one(path) -> None:
        try:
            assert read(path) == values[path.name]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
@pytest.mark.parametrize("workers", ["1", "default"])
def test_readers_of_different_files_overlap_their_round_trips(urls, workers, proxy, mount_factory):
    direct, proxied = urls
    names = [f"0.{i}" for i in range(16)]
    values = _fill(mount_factory, direct, names)
    m = mount_factory(proxied, [] if workers == "default" else [f"workers={workers}"])
    os.stat(m.path / "a")
    proxy.reset()
    _read_all([m.path / "a" / n for n in names], values)
    if workers == "1":
        assert proxy.overlap() == 1
    else:
        assert proxy.overlap() >= 4, proxy.overlap()


_STAT = """
import os, signal, sys
def ring(*_):
    raise InterruptedError
signal.signal(signal.SIGALRM, ring)
if float(sys.argv[2]):
    signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))
try:
    os.stat(sys.argv[1])
    print("0")
except InterruptedError:
    print("alarm")
except OSError as exc:
    print(exc.errno)
"""


def _stat_in_child(path, alarm: float = 0.0) -> subprocess.Popen:
    args = [sys.executable, "-c", _STAT, str(path), str(alarm)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def _wait_held(proxy, count: int) -> None:
    for _ in range(600):
        if proxy.held() >= count:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"{proxy.held()} connections held, {count} expected")


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_a_stalled_request_holds_up_neither_a_read_of_another_file_nor_a_write(urls, proxy, mount_factory):
    direct, proxied = urls
    values = _fill(mount_factory, direct, ["stuckfile", "other"])
    m = mount_factory(proxied, ["timeout=120"])
    proxy.hold(b"stuckfile")
    stuck = _stat_in_child(m.path / "a" / "stuckfile")
    try:
        _wait_held(proxy, 1)
        assert read(m.path / "a" / "other") == values["other"]  # answered while one waits
        assert stuck.poll() is None  # still waiting on its server
        # A writer meanwhile: the stalled reader's wait ends and it runs again after the write
        # (then it may find the name in the folder's snapshot, or wait again).
        (m.path / "b").mkdir()
        write(m.path / "b" / "new", b"new")
        assert read(m.path / "b" / "new") == b"new"
    finally:
        proxy.release()
        out, _ = stuck.communicate(timeout=120)
    assert out.strip() == "0"


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_an_interrupt_ends_only_its_own_request(urls, proxy, mount_factory):
    direct, proxied = urls
    _fill(mount_factory, direct, ["other"])
    m = mount_factory(proxied, ["timeout=120"])
    proxy.hold(b"stuckname")
    waiting = _stat_in_child(m.path / "a" / "stuckname1")
    try:
        _wait_held(proxy, 1)
        interrupted = _stat_in_child(m.path / "a" / "stuckname2", alarm=1.0)
        out, _ = interrupted.communicate(timeout=120)
        assert out.strip() == "alarm"  # EINTR: its signal handler ran
        assert waiting.poll() is None  # the other request is still waiting on its server
        assert os.path.getsize(m.path / "a" / "other") == 4096  # and the mount serves others
    finally:
        proxy.release()
        out, _ = waiting.communicate(timeout=120)
    assert out.strip() == str(errno.ENOENT)  # answered once the server answered

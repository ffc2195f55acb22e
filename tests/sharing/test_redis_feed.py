"""The Redis change feed (``zarrfs.backends.redis.feed``) across a redis-server restart: the feed
comes back, says "something changed" once, has a connection track into it at once (a mount that
makes no request of its own hears the others again), keeps the descriptor the request loop
watches, and retries at a bounded rate while the server is away.

Each test starts a redis-server of its own (it is restarted). Each record is waited for with a
generous deadline, never slept over; the CPU of a loop that should sleep is compared with what a
spinning process gets meanwhile."""

from __future__ import annotations

import gc
import os
import time

import pytest
from conftest import start_redis, stop_redis
from mounting import Spinner, cpu_seconds
from test_coherence import read, seen_after

from zarrfs.backends.base import DATA
from zarrfs.backends.redis import feed as redis_feed
from zarrfs.backends.registry import open_driver

DEADLINE = 60.0  # seconds a wait gives up after: a bound on a lost feed, never on speed


def shut_down(server) -> None:
    """Stop ``server`` with its data saved (``SHUTDOWN SAVE``: kept across the restart)."""
    client = server.client()
    try:
        client.shutdown(save=True)
    finally:
        client.close()
    server.process.wait(timeout=30)


def restart(server):
    """Restart ``server`` on its port, with its data; the new server."""
    shut_down(server)
    return start_redis(server.workdir, port=server.port)


def heard(driver, cursor, record, since: float) -> tuple[int, float]:
    """Look at ``driver``'s feed (no other request of it) until it reports ``record``; the
    cursor and the seconds from ``since``. Fails at the deadline."""
    while True:
        cursor, records = driver.changes(cursor)
        if records and record in records:
            return cursor, time.monotonic() - since
        if time.monotonic() - since > DEADLINE:
            raise AssertionError(f"{record} not heard within {DEADLINE} s")
        time.sleep(0.002)


def test_a_driver_making_no_request_hears_others_after_a_restart(tmp_path):
    server = start_redis(str(tmp_path))
    url = server.url(0, prefix="rs")
    a = b = None
    try:
        a, b = open_driver(url), open_driver(url)
        a.changes(None)
        cb, _ = b.changes(None)
        fd = b.feed_fileno()
        a.put("before", b"1")
        cb, _ = heard(b, cb, (DATA, "before"), time.monotonic())
        server = restart(server)
        # b makes no request from here: it only looks at its feed. It says "something changed"
        # (once lost, once back) and then hears the others again.
        rescans = 0
        start = time.monotonic()
        while b.feed.lost or rescans == 0:
            cb, records = b.changes(cb)
            rescans += records is None
            assert time.monotonic() - start < DEADLINE, "the feed did not come back"
            time.sleep(0.002)
        assert b.feed_fileno() == fd  # the number the request loop registered
        assert 1 <= rescans <= 2
        a.put("after", b"2")
        cb, _ = heard(b, cb, (DATA, "after"), time.monotonic())
        client = server.client()
        client.set(b"rs:theirs", b"3")  # a writer that is not zarrfs (zarr-python's RedisStore)
        client.close()
        cb, _ = heard(b, cb, (DATA, "theirs"), time.monotonic())
    finally:
        for d in (a, b):
            if d is not None:
                d.close()
        stop_redis(server)


def test_a_feed_connection_lost_alone_comes_back_once(tmp_path):
    server = start_redis(str(tmp_path))
    a = b = None
    try:
        url = server.url(0, prefix="rk")
        a, b = open_driver(url), open_driver(url)
        a.changes(None)
        cb, _ = b.changes(None)
        b.put("mine", b"0")  # b's link tracks into the feed
        client = server.client()
        client.client_kill_filter(_id=b.feed.cid)  # the server stays: only the feed is cut
        start = time.monotonic()
        rescans = 0
        while b.feed.lost or rescans == 0:
            cb, records = b.changes(cb)
            rescans += records is None
            assert time.monotonic() - start < DEADLINE, "the feed did not come back"
            time.sleep(0.002)
        # b's link, still tracking into the old connection, tracks into the new one: the feed
        # stays (no "something changed" again) and hears the others.
        b.put("mine", b"1")
        a.put("after", b"2")
        cb, _ = heard(b, cb, (DATA, "after"), time.monotonic())
        start = time.monotonic()
        while time.monotonic() - start < 2 * redis_feed.RETRY:
            cb, records = b.changes(cb)
            assert records is not None and not b.feed.lost
            time.sleep(0.01)
        client.close()
    finally:
        for d in (a, b):
            if d is not None:
                d.close()
        stop_redis(server)


def test_a_lost_feed_retries_at_a_bounded_rate(tmp_path):
    server = start_redis(str(tmp_path))
    b = None
    try:
        b = open_driver(server.url(0, prefix="rr"))
        cb, _ = b.changes(None)
        fd = b.feed_fileno()
        shut_down(server)
        attempts = []
        connect = b.feed._connect

        def counted() -> None:
            attempts.append(time.monotonic())
            connect()

        b.feed._connect = counted
        seen = []
        start = time.monotonic()
        while time.monotonic() - start < 1.2:  # the server stays away this long
            cb, records = b.changes(cb)
            seen.append(records)
        assert seen.count(None) == 1, seen[:5]  # "something changed", once
        assert 1 <= len(attempts) <= 1.2 / redis_feed.RETRY + 1, attempts
        assert b.feed_fileno() == fd
        server = start_redis(server.workdir, port=server.port)
        start = time.monotonic()
        while True:
            cb, records = b.changes(cb)
            if records is None:
                break
            assert time.monotonic() - start < DEADLINE
            time.sleep(0.002)
        assert not b.feed.lost and b.feed_fileno() == fd
    finally:
        if b is not None:
            b.close()
        stop_redis(server)


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_an_idle_mount_stays_coherent_across_a_restart(tmp_path, mount_factory):
    from zarrfs.daemon.control import query

    server = start_redis(str(tmp_path))
    try:
        url = server.url(0, prefix="rm")
        a = mount_factory(url, ["create"], name="a")
        b = mount_factory(url, [], name="b")
        (a.path / "f").write_bytes(b"before")
        seen_after(lambda: read(b.path / "f") == b"before", time.monotonic())
        assert not (b.path / "g").exists()  # cached: no such file
        pid = query(str(b.path))["pid"]
        shut_down(server)
        # While the server is away, b's loop sleeps: it looks at the feed (and retries) at a
        # bounded rate, not on a closed descriptor over and over.
        spinner = Spinner()
        used = cpu_seconds(pid, pid)  # the main thread: the request loop, which looks at the feed
        start = time.monotonic()
        while time.monotonic() - start < 1.0:  # the server stays away this long
            time.sleep(0.05)
        used = cpu_seconds(pid, pid) - used
        spun = spinner.stop()
        assert used < spun / 4, f"the loop used {used:.2f} s of CPU, a spinning process {spun:.2f} s"
        server = start_redis(server.workdir, port=server.port)
        # b is left idle: its feed comes back, and a connection of b's tracks into it at once
        # (the server shows each feed as the target of a redirect), so b hears the others
        # without a request of its own.
        client = server.client()
        start = time.monotonic()
        while True:
            clients = client.client_list()
            feeds = [c["id"] for c in clients if int(c.get("sub", 0))]
            targets = {c.get("redir") for c in clients}
            if len(feeds) == 2 and all(f in targets for f in feeds):
                break
            assert time.monotonic() - start < DEADLINE, (feeds, targets)
            time.sleep(0.01)
        for attempt in range(100):  # a's first request may meet a connection the restart closed
            try:
                (a.path / "g").mkdir()
                break
            except OSError:
                if (a.path / "g").is_dir():  # made, its answer lost
                    break
                assert attempt < 99
                time.sleep(0.01)
        t = time.monotonic()
        seen_after(lambda: (b.path / "g").is_dir(), t)
        assert not (b.path / "h").exists()  # cached again
        client.set(b"rm:h", b"theirs")
        t = time.monotonic()
        seen_after(lambda: read(b.path / "h") == b"theirs", t)
        (a.path / "f").write_bytes(b"after")
        t = time.monotonic()
        seen_after(lambda: read(b.path / "f") == b"after", t)
        client.close()
        assert "change feed lost" in b.log_text() and "change feed back" in b.log_text()
    finally:
        stop_redis(server)


def test_a_feed_whose_first_connection_fails_releases_its_descriptors(tmp_path):
    """A feed that cannot make its first connection is not made, and leaves no descriptor
    behind (``FeedFd.first``, shared by the Redis and PostgreSQL feeds)."""
    from zarrfs.backends.base import UnavailableError
    from zarrfs.backends.feed_fd import FeedFd

    server = start_redis(str(tmp_path))
    driver = open_driver(server.url(0, prefix="gone"))
    try:
        shut_down(server)
        gc.collect()  # descriptors earlier tests left to the collector close now, not meanwhile
        before = set(os.listdir("/proc/self/fd"))
        for _ in range(3):
            with pytest.raises(UnavailableError):
                redis_feed.RedisFeed(driver)
        assert set(os.listdir("/proc/self/fd")) - before == set()
    finally:
        driver.close()
    fd = FeedFd()
    fd.first(lambda: None)  # a first connection that succeeds keeps the number
    assert fd.fd is not None and os.fstat(fd.fd)
    fd.close()

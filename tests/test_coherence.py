"""Several mounts (and other writers) on one database: each change shows on the others within
the feed's bound, measured, never slept over; and the kernel's caches stay warm in between.

Every wait here polls with a deadline and asserts the latency it measured.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path

import pytest
from mounting import make_url, needs_fuse

pytestmark = needs_fuse

FEED_DRIVERS = ["lmdb", "sqlite", "redis"]
BOUND = 0.05  # seconds: a change anywhere shows on every mount of the machine within this
DEADLINE = 5.0  # seconds before a wait gives up (the assertion on the latency says the rest)


@pytest.fixture(params=FEED_DRIVERS)
def feed_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each driver with a change feed."""
    return make_url(request.param, tmp_path, request)


def seen_after(check, since: float) -> float:
    """Seconds from ``since`` until ``check()`` holds (polled); fails at the deadline."""
    while True:
        try:
            if check():
                return time.monotonic() - since
        except OSError:
            pass
        if time.monotonic() - since > DEADLINE:
            raise AssertionError(f"not seen within {DEADLINE} s")
        time.sleep(0.001)


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def test_writes_through_one_mount_show_on_two_others(feed_url, mount_factory):
    a = mount_factory(feed_url, ["create"], name="a")
    b = mount_factory(feed_url, [], name="b")
    c = mount_factory(feed_url, [], name="c")
    # The kernel caches on b and c: a cached "no such file", a listing's names, attributes.
    assert not (b.path / "g").exists() and not (c.path / "g").exists()
    latencies = []
    (a.path / "g").mkdir()
    t = time.monotonic()
    latencies += [seen_after(lambda m=m: (m.path / "g").is_dir(), t) for m in (b, c)]
    for i in range(5):
        data = f"v{i}".encode() * (i + 1)
        (a.path / "g" / "f").write_bytes(data)  # closed: committed
        t = time.monotonic()
        for m in (b, c):
            latencies.append(seen_after(lambda m=m, d=data: read(m.path / "g" / "f") == d, t))
            assert (m.path / "g" / "f").stat().st_size == len(data)
            assert sorted(os.listdir(m.path / "g")) == ["f"]
    (a.path / "g" / "f").unlink()
    t = time.monotonic()
    latencies += [seen_after(lambda m=m: not (m.path / "g" / "f").exists(), t) for m in (b, c)]
    assert statistics.median(latencies) < BOUND, latencies
    assert max(latencies) < 4 * BOUND, latencies


def test_close_to_open(feed_url, mount_factory):
    """A file closed on one mount, then opened on another, shows the new content at once."""
    a = mount_factory(feed_url, ["create"], name="a")
    b = mount_factory(feed_url, [], name="b")
    (a.path / "f").write_bytes(b"old")
    seen_after(lambda: read(b.path / "f") == b"old", time.monotonic())
    for i in range(20):
        data = b"new%d" % i * (i % 3 + 1)
        (a.path / "f").write_bytes(data)
        assert (b.path / "f").read_bytes() == data  # no wait at all


def test_warm_caches_cost_no_requests(feed_url, mount_factory):
    """With a feed the kernel keeps names and attributes: a second stat pass sends nothing."""
    a = mount_factory(feed_url, ["create"], name="a")
    for i in range(50):
        (a.path / f"f{i}").write_bytes(b"x")
    b = mount_factory(feed_url, [], name="b")
    names = [b.path / f"f{i}" for i in range(50)]
    for p in names:
        p.stat()
    before = requests_of(b)
    for p in names:
        p.stat()
    assert requests_of(b) == before


def requests_of(m) -> int:
    """Requests the daemon answered so far (its status socket)."""
    from zarrfs.control import query

    return sum(query(str(m.path))["requests"].values())

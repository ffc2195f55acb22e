"""The Redis Cluster change feed (``zarrfs.backends.redis_cluster_feed``): the coherence tests of
``test_coherence.py`` on one cluster prefix, a writer that is not zarrfs, and the feed
following a failover to the promoted replica. Latencies are measured, never slept over."""

from __future__ import annotations

import time

import pytest
from mounting import make_url
from test_coherence import (  # noqa: F401 - collected here, on the cluster
    test_close_to_open,
    test_mount_stays_up_when_its_peer_is_killed,
    test_warm_caches_cost_no_requests,
    test_writes_through_one_mount_show_on_two_others,
)

from zarrfs.backends.base import DATA
from zarrfs.backends.registry import open_driver


@pytest.fixture
def feed_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh prefix on the session's cluster (the coherence tests' database here)."""
    return make_url("cluster", tmp_path, request)


def drained(driver, cursor, want, deadline: float = 5.0):
    """Look at ``driver``'s feed until it holds ``want`` records (or None); what it got."""
    got: list = []
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        cursor, records = driver.changes(cursor)
        if records is None:
            return None
        got += records
        if len(got) >= want:
            return got
        time.sleep(0.001)
    return got


def test_the_feed_hears_other_drivers_and_plain_cluster_clients(redis_cluster, feed_url):
    a, b = open_driver(feed_url), open_driver(feed_url)
    try:
        ca, _ = a.changes(None)
        cb, _ = b.changes(None)
        a.put("x/1", b"1")
        b.put("mine", b"2")
        assert (DATA, "x/1") in drained(b, cb, 1)
        assert (DATA, "mine") not in drained(b, cb + 1, 0, deadline=0.05)
        assert (DATA, "mine") in drained(a, ca, 1)
        client = redis_cluster.client()
        client.set(f"{b.prefix}:theirs", b"3")  # a RedisStore on a cluster client does this
        assert (DATA, "theirs") in drained(b, cb + 2, 1)
        assert b.get("theirs") == b"3"
        assert [k for k, _ in b.scan("t", "u")] == ["theirs"]  # put in the listing index
        client.close()
    finally:
        a.close()
        b.close()

"""The Redis Cluster change feed (``zarrfs.backends.redis_cluster.feed``): the coherence tests of
``test_coherence.py`` on one cluster prefix, a writer that is not zarrfs, and the feed
following a failover to the promoted replica. Each record is waited for with a generous
deadline (a feed that does not follow the slot never reports it); how soon it comes is a figure
of the benchmarks, not a bound a busy machine could break here."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from mounting import drained, make_url
from test_coherence import (  # noqa: F401 - collected here, on the cluster
    test_close_to_open,
    test_mount_stays_up_when_its_peer_is_killed,
    test_warm_caches_cost_no_requests,
    test_writes_through_one_mount_show_on_two_others,
)

from zarrfs.backends.base import DATA, BackendError
from zarrfs.backends.registry import open_driver


@pytest.fixture
def feed_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh prefix on the session's cluster (the coherence tests' database here)."""
    return make_url("cluster", tmp_path, request)


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


def seen(driver, cursor, record, deadline: float = 60.0) -> float:
    """Seconds until ``driver``'s feed reports ``record``, or "rescan" (None), which covers it;
    fails at the deadline."""
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        cursor, records = driver.changes(cursor)
        if records is None or record in records:
            return time.monotonic() - start
        time.sleep(0.002)
    raise AssertionError(f"{record} not reported within {deadline} s")


def test_the_feed_follows_a_moved_slot(redis_cluster):
    from test_cluster import move_slot

    url = redis_cluster.url(prefix=f"fmv{uuid.uuid4().hex[:8]}")
    a, b = open_driver(url), open_driver(url)
    try:
        cb, _ = b.changes(None)
        a.put("before", b"1")
        seen(b, cb, (DATA, "before"))
        src = int(a.node.rsplit(":", 1)[1])
        dst = next(p for p in redis_cluster.ports if p != src)
        move_slot(a.slot, src, dst, redis_cluster.ports)
        a.put("after", b"2")  # on the new master; b makes no request of its own
        assert a.node == f"127.0.0.1:{dst}"
        seen(b, cb, (DATA, "after"))  # the feed's route check followed the slot
        assert b.feed.pool is b.pool and b.node == a.node
        a.put("later", b"3")
        seen(b, cb, (DATA, "later"))
        assert b.feed.cid is not None
    finally:
        a.close()
        b.close()


def test_the_feed_follows_a_failover_to_the_replica(tmp_path):
    from servers import start_redis_cluster, stop_redis_cluster
    from test_cluster import _node, _replica_of

    c = start_redis_cluster(str(tmp_path), replicas=1, node_timeout_ms=1000)
    try:
        url = c.url(prefix=f"ffo{uuid.uuid4().hex[:8]}")
        deadline = time.monotonic() + 30
        while True:  # every node agrees that the cluster is up
            try:
                a, b = open_driver(url), open_driver(url)
                break
            except BackendError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        cb, _ = b.changes(None)
        master = int(a.node.rsplit(":", 1)[1])
        replica = _replica_of(c, master)
        a.put("before", b"1")
        seen(b, cb, (DATA, "before"))
        _node(master).execute_command("WAIT", 1, 5000)
        process = c.processes[c.ports.index(master)]
        process.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 60
        while True:  # the writer's calls fail until the replica is promoted
            try:
                a.put("after", b"2")
                break
            except BackendError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert a.node == f"127.0.0.1:{replica}"
        seen(b, cb, (DATA, "after"))  # a rescan at least: the feed was lost
        start = time.monotonic()
        while b.feed.lost or b.node != a.node:  # b makes no request: its feed finds the replica
            assert time.monotonic() - start < 60, "the feed never found the promoted replica"
            cb, _ = b.changes(cb)
            time.sleep(0.01)
        a.put("later", b"3")
        assert (DATA, "later") in drained(b, cb, 1)
        a.close()
        b.close()
    finally:
        stop_redis_cluster(c)

"""The Redis Cluster driver while the cluster changes under it: a hierarchy's slot moved to
another master (``MOVED``/``ASK``/``TRYAGAIN`` while it moves), a manual failover, and a master
killed and replaced by its replica. A writer thread runs transactions throughout; each one
increments a counter and adds a key in one commit, so the counter must always equal the number
of keys (no commit half applied), and every commit reported done must be there afterwards (when
Redis kept it: after a master is killed, only what reached its replica)."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from contextlib import contextmanager

import pytest
import redis
from conftest import session_server
from servers import start_redis_cluster, stop_redis_cluster

from zarrfs.backends.base import BackendError
from zarrfs.backends.registry import open_driver


def _step(t) -> int:
    n = int(t.get("count") or b"0")
    t.put(f"k/{n:06d}", b"x")
    t.put("count", str(n + 1).encode())
    return n


class Writer(threading.Thread):
    """Commits :func:`_step` until stopped; records what committed and what failed."""

    def __init__(self, driver) -> None:
        super().__init__(daemon=True)
        self.driver = driver
        self.done: list[int] = []
        self.errors: list[tuple[float, BackendError]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.done.append(self.driver.transact(_step))
            except BackendError as exc:
                self.errors.append((time.monotonic(), exc))
                time.sleep(0.05)

    def wait_for(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.done) < count:
            assert time.monotonic() < deadline, f"only {len(self.done)} commits; errors {self.errors[-3:]}"
            time.sleep(0.01)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


@contextmanager
def writing(cluster, name: str):
    """A driver on a fresh prefix ``name…`` of ``cluster``, a :class:`Writer` on it (not started)
    and the port of the master holding the prefix; the writer is stopped and the driver closed
    at the end."""
    d = open_driver(cluster.url(prefix=f"{name}{uuid.uuid4().hex[:8]}"))
    writer = Writer(d)
    try:
        yield d, writer, int(d.node.rsplit(":", 1)[1])
    finally:
        writer.stop()
        d.close()


def _consistent(driver, done: list[int]) -> int:
    keys = [k for k, _ in driver.scan("k/", "k0")]
    count = int(driver.get("count") or b"0")
    assert count == len(keys) and keys == [f"k/{n:06d}" for n in range(count)]
    return count


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port)


def _myid(port: int) -> str:
    return _node(port).execute_command("CLUSTER", "MYID").decode()


def move_slot(slot: int, src: int, dst: int, ports: list[int], pause: float = 0.02) -> int:
    """Move ``slot`` from the master on port ``src`` to the one on ``dst`` as ``redis-cli
    --cluster reshard`` does (IMPORTING, MIGRATING, MIGRATE in batches, SETSLOT NODE
    everywhere), pausing between batches so that a writer works while the slot is half moved."""
    src_id, dst_id = _myid(src), _myid(dst)
    _node(dst).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    _node(src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    moved = 0
    while keys := _node(src).execute_command("CLUSTER", "GETKEYSINSLOT", slot, 5):
        _node(src).execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
        moved += len(keys)
        time.sleep(pause)
    for port in ports:
        _node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return moved


def test_a_moved_slot_is_followed(redis_cluster):
    with writing(redis_cluster, "mv") as (d, writer, src):
        dst = next(p for p in redis_cluster.ports if p != src)
        writer.start()
        writer.wait_for(50)
        moved = move_slot(d.slot, src, dst, redis_cluster.ports)
        before = len(writer.done)
        writer.wait_for(before + 50)
        writer.stop()
        assert moved >= 50
        assert d.node == f"127.0.0.1:{dst}"
        assert writer.errors == []  # MOVED, ASK and TRYAGAIN are retried, not failed
        assert d.guesses.holds > 0  # commits of guessed reads among them (redis.guesses)
        assert _consistent(d, writer.done) == len(writer.done)
        assert _node(dst).get(f"{d.prefix}:count") == str(len(writer.done)).encode()
        assert _node(src).dbsize() == 0 or not _node(src).keys(f"*{d.prefix}*")


def test_an_open_waits_while_the_cluster_is_down(redis_cluster, caplog):
    """An open while the home master answers ``CLUSTERDOWN`` (a cluster just made, or failing a
    master over, till its nodes agree) reads the slot map again and retries for the timeout,
    as a transaction does; it failed at once with "The cluster is down". A wait past
    ``TELL_AFTER`` says so in one log line (a mount's open waited a minute saying nothing)."""
    from redis.cluster import key_slot

    prefix = f"cd{uuid.uuid4().hex[:8]}"
    home = key_slot(f"zarrfs.index.{{{prefix}}}".encode())
    owner, other = next(
        (int(node[1]), start if start != home else start + 1)
        for start, end, *nodes in _node(redis_cluster.ports[0]).execute_command("CLUSTER", "SLOTS")
        for node in nodes[:1]
        if start <= home <= end
    )
    master = _node(owner)
    master.execute_command("CLUSTER", "DELSLOTS", other)  # not every slot served: down
    try:
        deadline = time.monotonic() + 30
        while b"cluster_state:fail" not in master.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        back = threading.Timer(1.0, master.execute_command, ("CLUSTER", "ADDSLOTS", other))
        back.start()
        start = time.monotonic()
        with open_driver(redis_cluster.url(prefix=prefix)) as d:
            d.put("a", b"1")
            assert d.get("a") == b"1"
        assert time.monotonic() - start >= 0.9  # it did wait for the slot to come back
        back.join()
        # The open's line (a transaction retrying past RETRY_TELL after it has a line of its own).
        told = [r for r in caplog.records if "the cluster answers that it is down" in r.getMessage()]
        assert len(told) == 1 and told[0].levelname == "WARNING", caplog.text
    finally:
        if b"cluster_state:ok" not in master.execute_command("CLUSTER", "INFO"):
            try:
                master.execute_command("CLUSTER", "ADDSLOTS", other)
            except redis.ResponseError:
                pass  # added back by the timer
        # The cluster is shared by this worker's tests: left only once every node agrees.
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in _node(p).execute_command("CLUSTER", "INFO")
                      for p in redis_cluster.ports):
            assert time.monotonic() < deadline, "the cluster did not come back"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def replicated_cluster():
    """Three masters with a replica each; a silent master is failed over after 1 s."""
    def start(workdir: str):
        return start_redis_cluster(workdir, replicas=1, node_timeout_ms=1000)

    yield from session_server("zarrfs-cluster-r-", start, stop_redis_cluster)


def _replica_of(cluster, master_port: int) -> int:
    master_id = _myid(master_port)
    deadline = time.monotonic() + 30
    while True:
        for port in cluster.ports:
            info = _node(port).info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") == "up":
                if _node(port).execute_command("CLUSTER", "MYID").decode() != master_id and int(
                    info["master_port"]
                ) == master_port:
                    return port
        assert time.monotonic() < deadline, "no replica in sync"
        time.sleep(0.1)


def test_manual_failover(replicated_cluster):
    c = replicated_cluster
    with writing(c, "fo") as (d, writer, master):
        replica = _replica_of(c, master)
        writer.start()
        writer.wait_for(50)
        _node(replica).execute_command("CLUSTER", "FAILOVER")  # waits for the replica to catch up
        deadline = time.monotonic() + 30
        while _node(replica).info("replication")["role"] != "master":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        writer.wait_for(len(writer.done) + 50)
        writer.stop()
        assert d.node == f"127.0.0.1:{replica}"
        assert _consistent(d, writer.done) == len(writer.done)  # nothing lost


def test_killed_master_is_replaced(replicated_cluster):
    c = replicated_cluster
    with writing(c, "kill") as (d, writer, master):
        replica = _replica_of(c, master)
        writer.start()
        writer.wait_for(50)
        kept = len(writer.done)
        # What the replica has acknowledged is what a failover keeps.
        _node(master).execute_command("WAIT", 1, 5000)
        process = c.processes[c.ports.index(master)]
        process.send_signal(signal.SIGKILL)
        process.wait()
        writer.wait_for(len(writer.done) + 50, timeout=120)  # a generous deadline: writes resume
        writer.stop()
        assert d.node == f"127.0.0.1:{replica}"
        assert writer.errors, "a dead master fails the calls that reach it"
        assert all(isinstance(e, BackendError) for _, e in writer.errors)
        count = _consistent(d, writer.done)
        assert count >= kept


# --- mounts of the cluster (the whole mount suite runs on it too: DRIVERS in mounting.py) -------


@pytest.fixture
def cluster_mount(redis_cluster, mount_factory):
    return mount_factory(redis_cluster.url(prefix=f"m{uuid.uuid4().hex[:8]}"), ["create"])


def test_mount_posix_basics(cluster_mount):
    import os

    root = cluster_mount.path
    (root / "g" / "sub").mkdir(parents=True)
    (root / "g" / "a.txt").write_bytes(b"hello")
    os.rename(root / "g" / "a.txt", root / "g" / "sub" / "b.txt")
    os.symlink("sub/b.txt", root / "g" / "link")
    assert sorted(os.listdir(root / "g")) == ["link", "sub"]
    assert (root / "g" / "link").read_bytes() == b"hello"
    os.rename(root / "g", root / "h")  # a whole folder: one transaction on the slot
    assert (root / "h" / "sub" / "b.txt").read_bytes() == b"hello"
    os.unlink(root / "h" / "sub" / "b.txt")
    assert os.listdir(root / "h" / "sub") == []


def test_mount_zarr3_and_xarray(cluster_mount, redis_cluster):
    import numpy as np
    import xarray as xr
    import zarr

    root = cluster_mount.path
    z = zarr.open_array(root / "a", mode="w", shape=(64, 64), chunks=(16, 16), dtype="f4")
    z[:] = np.arange(64 * 64, dtype="f4").reshape(64, 64)
    assert (zarr.open_array(root / "a", mode="r")[:] == z[:]).all()
    ds = xr.Dataset({"t": (("y", "x"), np.ones((8, 4)))}, coords={"x": np.arange(4)})
    ds.to_zarr(root / "ds", mode="w", consolidated=True)
    assert xr.open_zarr(root / "ds", consolidated=True).load().identical(ds)
    # every key of the hierarchy is on the master owning the prefix's slot
    prefix = cluster_mount.url.split("prefix=")[1]
    assert redis_cluster.client().exists(f"{{{prefix}}}:a/zarr.json")

"""One hierarchy spread over every master of a Redis Cluster (``?spread=1``): chunks stored as
parts on their own slots, committed by one transaction on the hierarchy's slot."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid

import pytest
import redis
from conftest import session_server
from mounting import Mount, needs_fuse, read, write, zarrfs
from servers import start_redis_cluster, stop_redis_cluster

from zarrfs.backends.base import BackendError
from zarrfs.backends.registry import open_driver
from zarrfs.fs import parts, records
from zarrfs.fs.manifest import MANIFEST_SIZE

pytestmark = needs_fuse


def _bytes_per_master(cluster, prefix: str) -> list[int]:
    """Bytes of this hierarchy's part keys held by each master."""
    out = []
    for port in cluster.ports:
        c = redis.Redis(port=port)
        try:
            if c.info("replication")["role"] != "master":
                continue
            total = 0
            for name in c.scan_iter(match=f"zarrfs.part.{prefix}:*", count=1000):
                total += c.strlen(name)
            out.append(total)
        finally:
            c.close()
    return out


def test_chunks_spread_over_every_master_and_read_back(redis_cluster, tmp_path):
    prefix = f"s{os.getpid()}{time.monotonic_ns() % 10**9}"
    url = redis_cluster.url(prefix=prefix, spread="1")
    # 180 chunks: with 60, one master held over 45% of the bytes about one run in twelve
    blobs = {f"arr/{i}.0": os.urandom(4096 + i) for i in range(180)}
    with Mount(url, tmp_path / "m", ["create"]) as m:
        (m.path / "arr").mkdir()
        write(m.path / "arr" / ".zattrs", b'{"a": 1}')
        for key, value in blobs.items():
            write(m.path / key, value)
        for key, value in blobs.items():
            assert read(m.path / key) == value
        assert os.stat(m.path / "arr" / "7.0").st_size == len(blobs["arr/7.0"])
        m.assert_clean_log()
    # A fresh mount reads them back; the metadata document stays whole on the home slot.
    with Mount(url, tmp_path / "m2") as m:
        for key, value in blobs.items():
            assert read(m.path / key) == value
    with open_driver(url, readonly=True) as d:
        assert d.get("arr/.zattrs") == b'{"a": 1}'
        assert len(d.get("arr/3.0")) == MANIFEST_SIZE  # the data key holds the manifest
    spread = _bytes_per_master(redis_cluster, prefix)
    total = sum(spread)
    assert total >= sum(len(v) for v in blobs.values())
    assert len(spread) == 3 and max(spread) <= 0.45 * total, spread


def test_spread_needs_a_cluster(redis_url, tmp_path):
    with pytest.raises(BackendError, match="Redis Cluster"):
        open_driver(redis_url + ("&" if "?" in redis_url else "?") + "spread=1")
    (tmp_path / "m").mkdir()
    out = zarrfs("mount", redis_url + ("&" if "?" in redis_url else "?") + "spread=1", str(tmp_path / "m"),
                 check=False)
    assert out.returncode != 0 and "spread" in out.stderr and "Traceback" not in out.stderr


def _prefix(name: str) -> str:
    return f"{name}{uuid.uuid4().hex[:10]}"


def test_a_hierarchy_larger_than_any_master_is_stored_whole(tmp_path):
    """Each master may hold 14 MiB; 20 MiB of chunks go in through a mount and come back.

    A chunk is 256 bytes short of 64 KiB so that its part fits the allocator's 64 KiB class: a
    64 KiB part takes an 80 KiB one, and 24 MiB of such chunks filled the fullest master.
    """

    def start(workdir: str):
        return start_redis_cluster(workdir)

    gen = session_server("zarrfs-cluster-small-", start, stop_redis_cluster)
    cluster = next(gen)
    try:
        for port in cluster.ports:
            redis.Redis(port=port).config_set("maxmemory", str(14 << 20))
        url = cluster.url(prefix=_prefix("big"), spread="1")
        chunk = (64 << 10) - 256
        blobs = {f"a/{i}": os.urandom(chunk) for i in range(320)}  # 20 MiB
        with Mount(url, tmp_path / "m", ["create"]) as m:
            (m.path / "a").mkdir()
            for key, value in blobs.items():
                write(m.path / key, value)
        with Mount(url, tmp_path / "m2") as m:
            for key, value in blobs.items():
                assert read(m.path / key) == value
        for port in cluster.ports:
            used = redis.Redis(port=port).info("memory")["used_memory"]
            assert used <= 14 << 20
    finally:
        next(gen, None)


def test_a_full_master_fails_one_commit_with_enospc_and_stores_nothing_of_it(redis_cluster, tmp_path):
    url = redis_cluster.url(prefix=_prefix("full"), spread="1")
    masters = [redis.Redis(port=p) for p in redis_cluster.ports]
    with Mount(url, tmp_path / "m", ["create"]) as m:
        write(m.path / "kept", b"k" * 5000)
        for c in masters:
            c.config_set("maxmemory", "1")
        try:
            with pytest.raises(OSError) as err:
                write(m.path / "refused", os.urandom(50_000))
            assert err.value.errno == errno.ENOSPC
        finally:
            for c in masters:
                c.config_set("maxmemory", "0")
        assert not (m.path / "refused").exists() or read(m.path / "refused") == b""
        assert read(m.path / "kept") == b"k" * 5000
        write(m.path / "after", b"a" * 5000)  # the mount goes on
        assert read(m.path / "after") == b"a" * 5000
    with open_driver(url, readonly=True) as d:
        assert d.get("refused") in (None, b"")


def test_a_kill_between_the_parts_and_the_commit_leaves_only_orphans(redis_cluster, tmp_path):
    """The daemon is killed while it writes the parts of a large file: the file is not there
    (nor half of it), ``zarrfs check`` reports the orphan parts and ``--repair`` deletes them."""
    prefix = _prefix("kill")
    url = redis_cluster.url(prefix=prefix, spread="1")
    m = Mount(url, tmp_path / "m", ["create", "parts_above=4096"]).start()
    write(m.path / "before", b"b" * 10_000)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(24 << 20))  # 6,144 parts of 4 KiB: seconds of part writes
    pid = int(subprocess.run(["pgrep", "-f", f"zarrfs mount .* {m.path} "], capture_output=True,
                             text=True).stdout.split()[0])
    copier = subprocess.Popen(["cp", str(big), str(m.path / "big")])
    deadline = time.monotonic() + 120
    while sum(_bytes_per_master(redis_cluster, prefix)) <= 10_000:
        assert time.monotonic() < deadline, "no part of the large file was written"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    copier.wait(60)
    subprocess.run(["fusermount3", "-u", "-z", str(m.path)], check=False)
    with Mount(url, tmp_path / "m2") as m2:
        assert sorted(os.listdir(m2.path)) == ["before"]
        assert read(m2.path / "before") == b"b" * 10_000
    check = zarrfs("check", url, check=False)
    assert check.returncode == 1 and "no file references" in check.stdout + check.stderr, check
    repaired = zarrfs("check", "--repair", url, check=False)
    assert repaired.returncode == 0, repaired
    again = zarrfs("check", url, check=False)
    assert again.returncode == 0, again
    left = _bytes_per_master(redis_cluster, prefix)
    assert sum(left) == 10_000  # the parts of "before" only


def test_slots_moved_during_spread_writes_lose_nothing(redis_cluster):
    from test_cluster import move_slot

    d = open_driver(redis_cluster.url(prefix=_prefix("mv"), spread="1"))
    done: dict[str, bytes] = {}
    errors: list[Exception] = []
    halt = threading.Event()

    def writer() -> None:
        i = 0
        while not halt.is_set():
            key, value = f"c/{i}", os.urandom(8192 + i % 7)
            try:
                records.put_value(d, key, value, 4096)
                done[key] = value
            except Exception as exc:  # recorded: a commit may fail, but never half
                errors.append(exc)
            i += 1

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while len(done) < 20:
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
        # Move the slots of parts already written, and of parts being written now, to another master.
        moved = 0
        first = redis.Redis(port=redis_cluster.ports[0])
        for name in list(first.scan_iter(match="zarrfs.part.*", count=100))[:3]:
            slot = d.cluster.keyslot(name)
            owner = d.cluster.nodes_manager.get_node_from_slot(slot).port
            dst = next(p for p in redis_cluster.ports if p != owner)
            moved += move_slot(slot, owner, dst, redis_cluster.ports)
            d.cluster.nodes_manager.initialize()
        count = len(done)
        while len(done) < count + 20:
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
    finally:
        halt.set()
        t.join(60)
    assert moved >= 1
    assert len(errors) <= 2, errors
    with open_driver(redis_cluster.url(prefix=d.prefix.strip("{}"), spread="1"), readonly=True) as r:
        for key, value in done.items():
            assert r.transact(lambda t, k=key: parts.whole(t, k, t.get(k)), write=False) == value
    d.close()


@pytest.fixture(scope="module")
def replicated():
    """Three masters with a replica each; a silent master is failed over after 1 s."""

    def start(workdir: str):
        return start_redis_cluster(workdir, replicas=1, node_timeout_ms=1000)

    yield from session_server("zarrfs-cluster-sr-", start, stop_redis_cluster)


def test_a_master_failed_over_during_reads_loses_nothing(replicated):
    from test_cluster import _node, _replica_of

    url = replicated.url(prefix=_prefix("fo"), spread="1")
    d = open_driver(url)
    values = {f"c/{i}": os.urandom(6000 + i) for i in range(60)}
    for key, value in values.items():
        records.put_value(d, key, value, 4096)
    for port in replicated.ports:  # every write reached the replicas before the failover
        if _node(port).info("replication")["role"] == "master":
            _node(port).execute_command("WAIT", 1, 5000)
    wrong: list[str] = []
    errors: list[Exception] = []
    rounds = [0]
    halt = threading.Event()

    def reader() -> None:
        while not halt.is_set():
            for key, value in values.items():
                try:
                    got = d.transact(lambda t, k=key: parts.whole(t, k, t.get(k)), write=False)
                except BackendError as exc:  # a call may fail while the master changes, never lie
                    errors.append(exc)
                    continue
                if got != value:
                    wrong.append(key)
            rounds[0] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        victim = next(p for p in replicated.ports if _node(p).info("replication")["role"] == "master"
                      and _node(p).info("replication").get("connected_slaves", 0))
        replica = _replica_of(replicated, victim)
        seen = rounds[0]
        deadline = time.monotonic() + 60
        while rounds[0] < seen + 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _node(replica).execute_command("CLUSTER", "FAILOVER")
        while _node(replica).info("replication")["role"] != "master":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        seen = rounds[0]
        while rounds[0] < seen + 2:
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
    finally:
        halt.set()
        t.join(60)
    assert wrong == []
    with open_driver(url, readonly=True) as r:
        for key, value in values.items():
            assert r.transact(lambda t, k=key: parts.whole(t, k, t.get(k)), write=False) == value
    d.close()


# --- round trips, counted by a proxy in front of every node -------------------------------------
@pytest.fixture(scope="module")
def proxied_cluster():
    """Three masters behind ``DelayProxy`` (20 ms round trips): every node announces a proxy
    port, so every client's connection to any master is counted."""
    from zarrfs.testing.proxy import DelayProxy

    with DelayProxy(rtt_ms=20) as proxy:
        gen = session_server("zarrfs-cluster-px-", lambda w: start_redis_cluster(w, announce=proxy.route),
                             stop_redis_cluster)
        cluster = next(gen)
        try:
            first = cluster.client().cluster_nodes()
            via = int(next(iter(first)).split(":")[1].split("@")[0])
            yield cluster, proxy, via
        finally:
            next(gen, None)


def _zarr_v2(path, names: list[str], size: int) -> dict[str, bytes]:
    meta = {"zarr_format": 2, "shape": [1, size * len(names)], "chunks": [1, size], "dtype": "|u1",
            "compressor": None, "fill_value": 0, "order": "C", "filters": None}
    path.mkdir()
    write(path / ".zarray", json.dumps(meta).encode())
    values = {n: os.urandom(size) for n in names}
    for n, v in values.items():
        write(path / n, v)
    return values


@pytest.mark.parametrize("workers", [1, 16])
@pytest.mark.parametrize("layout", ["spread", "one-slot"])
def test_a_chunk_read_after_a_listing_costs_its_open_and_its_part(proxied_cluster, tmp_path, layout, workers):
    """After ``ls`` of a folder, a chunk read through a fresh mount costs one round trip to
    the home slot (the open: its probe and its content, the listing told the size) and, on a
    spread hierarchy, one to the master holding its part, asked at the same time (the
    listing told which part the chunk was; the open's probe confirms it): one wait, not two.
    It was 2 and 4.6 round trips. With request threads, each thread's first connection costs
    nothing more (redis-py's ``CLIENT SETINFO`` cost two)."""
    cluster, proxy, via = proxied_cluster
    query = {"spread": "1"} if layout == "spread" else {}
    url = f"redis+cluster://127.0.0.1:{via}/?prefix={_prefix('rt')}" + "".join(
        f"&{k}={v}" for k, v in query.items())
    names = [f"0.{i}" for i in range(24)]
    with Mount(url, tmp_path / "w", ["create"]) as m:
        values = _zarr_v2(m.path / "a", names, 20_000)
    # Shuffled, so that no chunk is read ahead: each is a fresh open.
    order = names[:]
    random.Random(3).shuffle(order)
    with Mount(url, tmp_path / "r", [f"workers={workers}"]) as m:
        assert sorted(os.listdir(m.path / "a")) == sorted([*names, ".zarray"])
        for n in order[:2]:  # what happens once per folder (the look for an array's metadata)
            assert read(m.path / "a" / n) == values[n]
        proxy.reset()
        seen = [0]
        waves = [0]
        for n in order[2:]:
            assert read(m.path / "a" / n) == values[n]
            seen.append(proxy.round_trips())
            waves.append(proxy.waves())
    each = sorted(b - a for a, b in zip(seen, seen[1:], strict=False))
    # Waited one after the other: the part's master is asked while the home slot answers.
    waited = sorted(b - a for a, b in zip(waves, waves[1:], strict=False))
    assert waited[len(waited) // 2] == 1, waited
    # Per chunk, the median; in all, a little more (a connection opened to a master, the
    # change feed's own traffic).
    want = 2 if layout == "spread" else 1
    assert each[len(each) // 2] == want, each
    assert seen[-1] / len(each) <= want + 0.5, each


def _proxied_url(via: int, name: str, **query: str) -> str:
    return f"redis+cluster://127.0.0.1:{via}/?prefix={_prefix(name)}&spread=1" + "".join(
        f"&{k}={v}" for k, v in query.items())


def test_chunks_read_ahead_have_their_parts_read_in_one_batch(proxied_cluster, tmp_path):
    """A reader of a spread array in grid order gets the next chunks read with its open, and
    their parts in one pipeline to every master (not one round trip per part)."""
    _cluster, proxy, via = proxied_cluster
    url = _proxied_url(via, "ra")
    names = [f"0.{i}" for i in range(27)]
    with Mount(url, tmp_path / "w", ["create"]) as m:
        values = _zarr_v2(m.path / "a", names, 20_000)
    with Mount(url, tmp_path / "r") as m:
        os.stat(m.path / "a")
        for n in names[:3]:  # the array's metadata looked up, a connection to every master
            assert read(m.path / "a" / n) == values[n]
        proxy.reset()
        for n in names[3:]:
            assert read(m.path / "a" / n) == values[n]
        trips = proxy.round_trips() / len(names[3:])
    # Per nine chunks: the open with the next eight (home), their parts (at most 3 masters).
    assert trips <= 0.6, trips


def test_chunks_closed_together_go_to_their_masters_together(proxied_cluster, tmp_path):
    """Sixteen programs each write a new chunk of a spread array at once: the closes waiting
    together are served in one commit, their parts written first in one pipeline to every
    master (alone, each close costs about four round trips: its part, the check, the probe,
    the commit); a fresh mount reads every chunk back."""
    _cluster, proxy, via = proxied_cluster
    url = _proxied_url(via, "tg")
    names = [f"0.{i}" for i in range(16)]
    values = {n: os.urandom(20_000) for n in names}
    with Mount(url, tmp_path / "m", ["create"]) as m:
        meta = {"zarr_format": 2, "shape": [1, 20_000 * 17], "chunks": [1, 20_000], "dtype": "|u1",
                "compressor": None, "fill_value": 0, "order": "C", "filters": None}
        (m.path / "a").mkdir()
        write(m.path / "a" / ".zarray", json.dumps(meta).encode())
        write(m.path / "a" / "0.16", os.urandom(20_000))  # connections to every master made
        os.listdir(m.path / "a")
        start = threading.Barrier(len(names))
        errors: list[BaseException] = []

        def one(n: str) -> None:
            try:
                start.wait(60)
                write(m.path / "a" / n, values[n])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        proxy.reset()
        threads = [threading.Thread(target=one, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        trips = proxy.round_trips()
        assert not errors, errors
    assert trips <= 32, f"{trips} round trips for 16 chunks written at once"
    with Mount(url, tmp_path / "r") as m:
        for n, v in values.items():
            assert read(m.path / "a" / n) == v
    check = zarrfs("check", url, check=False)  # no part left that no file references
    assert check.returncode == 0, check


def test_a_commit_asks_for_its_parts_in_one_batch(proxied_cluster, tmp_path):
    """A commit checks that every part it names is stored: one pipeline to the masters, not
    one round trip a part."""
    _cluster, proxy, via = proxied_cluster
    url = _proxied_url(via, "ck")
    value = os.urandom(40 * 4096)  # 40 parts of 4 KiB
    with Mount(url, tmp_path / "m", ["create", "parts_above=4096"]) as m:
        write(m.path / "warm", b"w" * 10_000)  # connections to every master made
        proxy.reset()
        write(m.path / "big", value)
        trips = proxy.round_trips()
        assert read(m.path / "big") == value
    # 40 part writes, the check (3 masters at most), the home slot's probes and commit.
    assert trips <= 40 + 15, trips  # one size a part: 90


def test_a_part_call_waits_no_longer_than_the_timeout(proxied_cluster):
    """``-o timeout=`` bounds the waits on the masters holding parts, as on the home slot's."""
    from zarrfs.backends.base import StalledError

    _cluster, proxy, via = proxied_cluster
    d = open_driver(_proxied_url(via, "to"))
    try:
        records.put_value(d, "c", os.urandom(8192), 4096)
        d.set_timeout(2)
        for node in d.cluster.get_nodes():
            pool = node.redis_connection.connection_pool
            assert pool.connection_kwargs["socket_timeout"] == 2
        got: list[BaseException | bytes] = []

        def reader() -> None:
            try:
                got.append(d.transact(lambda t: parts.whole(t, "c", t.get("c")), write=False))
            except BaseException as exc:  # noqa: BLE001 - what the call ended with, for the test
                got.append(exc)

        proxy.hold(b"zarrfs.part")
        try:
            t = threading.Thread(target=reader, daemon=True)
            t.start()
            t.join(60)  # the default 120 s of redis-py's cluster client would still be waiting
            assert not t.is_alive(), "a part read waited past the timeout"
        finally:
            proxy.release()
        assert len(got) == 1 and isinstance(got[0], StalledError), got
    finally:
        d.close()

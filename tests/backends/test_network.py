"""A database across a network: mounts and drivers talking to their server through
``zarrfs.testing.proxy.DelayProxy``, which counts round trips (request bursts) and can stop
forwarding (a server that stops answering, made without a clock).

* a fresh chunk read through a mount of Redis costs at most two round trips (lookup; open and
  content in one pipeline), counted at the proxy; lookups side by side in a folder the mount
  has not seen read its names once, not once each;
* a PostgreSQL transaction sends its BEGIN with its first reads and its writes with its COMMIT,
  and with the change feed a reading transaction's COMMIT goes with the next transaction;
* a server that stops answering in the middle of a commit gives ETIMEDOUT after ``-o timeout=``,
  and the file is afterwards either what it was or what was written, never a mix;
* issue #26's counts, on Redis and PostgreSQL: a chunk read after its folder was listed costs
  about one round trip; a create + write + close in a folder the mount made or listed, a mkdir
  there, an rmdir and an unlink cost two each (checks, then the commit), the checks still
  refusing what they refused.
"""

from __future__ import annotations

import errno
import json
import os
import random
import select
import stat
import threading
import time

import pytest
import redis
from conftest import start_redis, stop_redis
from mounting import eventually, read, write
from psycopg.pq import TransactionStatus

from zarrfs.backends import open_driver
from zarrfs.backends.base import KEYS, SIDE, SIZES, VALUES, Get, HasPrefix, Size
from zarrfs.cli.main import daemon_pids
from zarrfs.fs.sidedata import Attrs, attr_key, pack_xattrs, xattr_key
from zarrfs.testing.proxy import POSTGRES_IDLE_COMMITS, DelayProxy

CHUNK = 64 << 10


@pytest.fixture
def proxy():
    """A proxy with a round trip of 20 ms: long enough that a client writes a whole pipeline
    before any of its replies is back, so that a pipeline counts as one round trip however
    busy the machine is."""
    with DelayProxy(rtt_ms=20) as p:
        yield p


def _proxied_redis(redis_server, proxy, prefix: str) -> tuple[str, str]:
    via = proxy.route(redis_server.port)
    return redis_server.url(0, prefix=prefix), f"redis://127.0.0.1:{via}/0?prefix={prefix}"


def _proxied_postgres(postgres_server, proxy, table: str) -> tuple[str, str]:
    via = proxy.route(postgres_server.port)
    direct = postgres_server.url(table=table)
    return direct, direct.replace(f":{postgres_server.port}/", f":{via}/")


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_fresh_chunk_read_costs_at_most_two_round_trips(redis_server, proxy, mount_factory):
    direct, proxied = _proxied_redis(redis_server, proxy, f"rt{os.getpid()}")
    names = [f"0.{i}" for i in range(24)]
    values = {n: os.urandom(CHUNK) for n in names}
    m = mount_factory(direct, ["create"])
    (m.path / "a").mkdir()
    for n in names:
        write(m.path / "a" / n, values[n])
    m.stop()
    m2 = mount_factory(proxied, [])
    # What happens once per folder (its lookup, the look for an array's metadata at the second
    # open, for reading ahead) is not a chunk read's.
    for n in names[:2]:
        assert read(m2.path / "a" / n) == values[n]
    proxy.reset()
    for n in names[2:]:
        assert read(m2.path / "a" / n) == values[n]
    trips = proxy.round_trips() / (len(names) - 2)
    assert trips <= 2.0, trips


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_lookups_side_by_side_in_a_new_folder_read_its_names_once(tmp_path, proxy, mount_factory):
    """16 programs look names up at once in a folder the mount has not seen: the request
    threads wait for the server side by side, and one lookup reads the folder's names (a
    script scanning the whole folder on the server) while the others only probe their own.
    A private server: its count of scripts run is this test's alone."""
    server = start_redis(str(tmp_path))
    try:
        via = proxy.route(server.port)
        names = [str(i) for i in range(64)]
        m = mount_factory(server.url(0, prefix="ls"), ["create"])
        (m.path / "a").mkdir()
        for n in names:
            write(m.path / "a" / n, b"x")
        m.stop()
        m2 = mount_factory(f"redis://127.0.0.1:{via}/0?prefix=ls", [])
        os.stat(m2.path / "a")  # the folder's own lookup, and the root's names, first
        client = redis.Redis(port=server.port)

        def scripts() -> int:
            stats = client.info("commandstats")
            return sum(stats.get(c, {}).get("calls", 0) for c in ("cmdstat_eval", "cmdstat_evalsha"))

        before = scripts()
        start = threading.Barrier(16)
        found: list[bool] = []

        def look(name: str) -> None:
            start.wait()
            found.append((m2.path / "a" / name).exists())

        threads = [threading.Thread(target=look, args=(n,)) for n in names[:16]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert found == [True] * 16
        # The folder's names are one script a space (names and side records): two.
        assert scripts() - before <= 2, scripts() - before
    finally:
        stop_redis(server)


def test_a_redis_listing_batch_is_one_round_trip_and_needs_no_script(redis_server, proxy):
    """A scan of the Redis index reads a batch of members and their keys (names, sizes, side
    records) in one script: one round trip, where a range and then its keys took two. A server
    that runs no script for this client (an ACL without ``@scripting``) is listed the old way,
    just as exactly. A stale member (its key deleted by a client that keeps no index) is left
    out either way."""
    prefix = f"ls{os.getpid()}"
    direct = redis_server.url(0, prefix=prefix)
    with open_driver(direct) as d:
        for i in range(30):
            d.put(f"a/{i:02d}", b"x" * i)
        d.put("e:a/link", b"mark", SIDE)
    client = redis_server.client()
    client.delete(f"{prefix}:a/07".encode())  # the index still lists it
    client.execute_command("ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
    want_keys = [f"a/{i:02d}" for i in range(30) if i != 7]
    want_sizes = [(k, int(k[2:])) for k in want_keys]
    via = proxy.route(redis_server.port)
    for url, scripted in (
        (f"redis://127.0.0.1:{via}/0?prefix={prefix}", True),
        (f"redis://noscripts:pw@127.0.0.1:{via}/0?prefix={prefix}", False),
    ):
        with open_driver(url) as driver:
            for fetch, want in ((KEYS, [(k, None) for k in want_keys]), (SIZES, want_sizes)):
                proxy.reset()
                got = driver.transact(lambda t, f=fetch: list(t.scan("a/", "a0", fetch=f)), write=False)
                assert got == want
                if scripted:
                    assert proxy.round_trips() == 1, fetch
            proxy.reset()
            entries = lambda t: list(t.scan("e:a/", "e:a0", space=SIDE, fetch=VALUES))  # noqa: E731
            side = driver.transact(entries, write=False)
            assert side == [("e:a/link", b"mark")]
            if scripted:
                assert proxy.round_trips() == 1
            assert driver.scripts == [scripted]


class _CountedWaits:
    """The request threads' side of a driver's wait (``fuse.workers.Waits``): each wait that
    went through it, with what its poll found."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.found: list[list[tuple[int, int]]] = []

    def fileno(self) -> int:
        return self.r

    def poll(self, poller, ms: float) -> list[tuple[int, int]]:
        got = poller.poll(ms)
        self.found.append(got)
        return got

    def check(self) -> None:
        pass

    restart = before_write = check

    def serve_waiting(self) -> None:
        pass

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


def test_a_postgres_exchange_waits_through_the_request_threads_only_for_what_is_not_ready(
    postgres_server, proxy
):
    """psycopg's pipeline asks first for room to send, which the socket nearly always has: a
    wait through the request threads for it let go of the filesystem lock and woke another
    thread for nothing. The room is polled for without waiting; a wait goes through the
    threads only when the socket is not ready (an answer still to come: the proxy's delay
    makes sure of it, where a local server's answer can be in before the first look). The
    reads and writes go through libpq (``rawpipe``), a scan announced ahead through psycopg's
    pipeline."""
    waits = _CountedWaits()
    _direct, proxied = _proxied_postgres(postgres_server, proxy, f"ex{os.getpid()}")

    def listed(t, i):
        t.scan_ahead("k", "l")
        return t.get(f"k{i}"), [k for k, _ in t.scan("k", "l")]

    try:
        with open_driver(proxied) as driver:
            driver.watch = waits
            for i in range(10):
                driver.put(f"k{i}", b"v" * i)
                assert driver.get(f"k{i}") == b"v" * i
                got = driver.transact(lambda t, i=i: listed(t, i), write=False)
                assert got == (b"v" * i, sorted(f"k{j}" for j in range(i + 1)))
            assert waits.found  # the answers were waited for through it
            for got in waits.found:
                assert not any(events == select.POLLOUT for _fd, events in got), waits.found
    finally:
        waits.close()


def test_a_postgres_transaction_sends_begin_with_its_reads_and_writes_with_its_commit(postgres_server, proxy):
    direct, proxied = _proxied_postgres(postgres_server, proxy, f"rt{os.getpid()}")
    with open_driver(direct) as d:
        d.put("a", b"1")
    with open_driver(proxied) as driver:
        proxy.reset()
        got = driver.transact(
            lambda t: t.read_many([Get("a"), Size("a"), HasPrefix("b/"), Get("zz", SIDE)]), write=False
        )
        assert got == [b"1", 1, False, None]
        assert proxy.round_trips() == 2  # BEGIN + the reads, COMMIT

        def update(t):
            old = t.get("a")
            t.put("a", old + b"2")
            t.put("b/c", b"3")
            t.delete("zz", SIDE)

        proxy.reset()
        driver.transact(update)
        # BEGIN + the check of the read (answered from the read before, postgres.guesses), the
        # writes + NOTIFY + COMMIT; reading first (no guesses), the read and then the rest
        assert proxy.round_trips() == 1 and driver.guesses.holds == 1
        driver.guesses, guesses = None, driver.guesses
        proxy.reset()
        driver.transact(lambda t: t.put("a", t.get("a")))
        assert proxy.round_trips() == 2
        driver.guesses = guesses
        proxy.reset()
        driver.transact(lambda t: None, write=False)
        assert proxy.round_trips() == 0
        # With the change feed running, a reading transaction's COMMIT goes with the next one.
        driver.changes(None)
        read = lambda: driver.transact(lambda t: t.read_many([Get("a"), Size("b/c")]), write=False)  # noqa: E731
        proxy.reset()
        assert read() == [b"12", 1] and read() == [b"12", 1]
        assert proxy.round_trips() == 2
        assert driver.conn.info.transaction_status == TransactionStatus.INTRANS
        deadline = time.monotonic() + 30
        while driver.conn.info.transaction_status != TransactionStatus.IDLE:  # the feed's poll ends it
            assert time.monotonic() < deadline, "the last reading transaction was never ended"
            driver.changes(0)
            time.sleep(0.05)
        # Read-your-writes: a read after a write in the same transaction sees it.
        assert driver.transact(lambda t: (t.put("d", b"4"), t.get("d"))[1]) == b"4"
    with open_driver(direct) as d:
        assert d.get("a") == b"12" and d.get("b/c") == b"3" and d.get("d") == b"4"


def _commit_stalls(m, proxy, old: bytes, new: bytes) -> None:
    """Write ``new`` over ``old`` while the proxy holds what carries ``new`` (the commit): the
    close fails with ETIMEDOUT; once the proxy forwards again, the file is ``old`` or ``new``,
    whole."""
    write(m.path / "f", old)
    errors: list[int] = []

    def writer() -> None:
        try:
            write(m.path / "f", new)
        except OSError as exc:
            errors.append(exc.errno)

    proxy.hold(new[:64])
    try:
        t = threading.Thread(target=writer)
        t.start()
        t.join(60)
        assert not t.is_alive(), "the close did not end within a minute (-o timeout=2)"
        assert errors == [errno.ETIMEDOUT], errors
    finally:
        proxy.release()
    assert read(m.path / "f") in (old, new)


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_redis_that_stops_answering_mid_commit_times_out_with_nothing_half_done(
    redis_server, proxy, mount_factory
):
    _, proxied = _proxied_redis(redis_server, proxy, f"st{os.getpid()}")
    m = mount_factory(proxied, ["create", "timeout=2", "cache_timeout=0"])
    _commit_stalls(m, proxy, b"old" * 1000, b"new" * 3000)
    write(m.path / "after", b"1")  # the mount works on, without a remount
    assert read(m.path / "after") == b"1"


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_postgres_that_stops_answering_mid_commit_times_out_with_nothing_half_done(
    postgres_server, proxy, mount_factory
):
    _, proxied = _proxied_postgres(postgres_server, proxy, f"st{os.getpid()}")
    m = mount_factory(proxied, ["create", "timeout=2", "cache_timeout=0"])
    _commit_stalls(m, proxy, b"old" * 1000, b"new" * 3000)
    write(m.path / "after", b"1")
    assert read(m.path / "after") == b"1"


def _array(m, names: list[str], size: int) -> dict[str, bytes]:
    """A Zarr v2 array ``a`` of one row of ``len(names)`` chunks of ``size`` bytes."""
    (m.path / "a").mkdir()
    meta = {
        "zarr_format": 2, "shape": [1, size * len(names)], "chunks": [1, size], "dtype": "|u1",
        "compressor": None, "fill_value": 0, "order": "C", "filters": None,
    }
    write(m.path / "a" / ".zarray", json.dumps(meta).encode())
    values = {n: os.urandom(size) for n in names}
    for n, v in values.items():
        write(m.path / "a" / n, v)
    return values


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_chunks_read_in_grid_order_are_read_ahead(redis_server, proxy, mount_factory):
    direct, proxied = _proxied_redis(redis_server, proxy, f"ra{os.getpid()}")
    names = [f"0.{i}" for i in range(27)]
    values = _array(mount_factory(direct, ["create"]), names, CHUNK)
    m = mount_factory(proxied, [])
    os.stat(m.path / "a")
    proxy.reset()
    for n in names:
        assert read(m.path / "a" / n) == values[n]
    trips = proxy.round_trips() / len(names)
    assert trips <= 0.6, trips  # about one round trip for every nine chunks
    # The array's grid was read without its codecs: numpy and numcodecs, a fifth of a second
    # (a second on a busy machine) at the second read of a fresh mount, were never loaded.
    (pid,) = daemon_pids(str(m.path))
    with open(f"/proc/{pid}/maps") as fh:
        loaded = fh.read()
    assert "/numpy/" not in loaded and "/numcodecs/" not in loaded


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_chunk_read_ahead_is_never_older_than_what_the_mount_shows(redis_server, proxy, mount_factory):
    direct, proxied = _proxied_redis(redis_server, proxy, f"rs{os.getpid()}")
    names = [f"0.{i}" for i in range(12)]
    writer = mount_factory(direct, ["create"])
    values = _array(writer, names, 1000)
    reader = mount_factory(proxied, [])
    for n in names[:3]:  # the third is read with the next eight
        assert read(reader.path / "a" / n) == values[n]
    new = b"new" * 700
    write(writer.path / "a" / "0.6", new)  # another mount changes a chunk read ahead
    deadline = time.monotonic() + 30
    while os.stat(reader.path / "a" / "0.6").st_size != len(new):
        assert time.monotonic() < deadline, "the change never showed through the reader"
        time.sleep(0.02)
    assert read(reader.path / "a" / "0.6") == new
    for n in names[3:6] + names[7:]:
        assert read(reader.path / "a" / n) == values[n]


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_postgres_reads_names_ahead_and_each_open_reads_its_chunk(postgres_server, proxy, mount_factory):
    """PostgreSQL's notifications come after the commit, so only an open's own read is as new
    as close-to-open asks: by default a reader in grid order gets the next chunks' names and
    sizes with each open (their lookups need no round trip) and each open still reads its
    chunk, one round trip a chunk against about two in no order; values are read ahead only
    when ``-o chunks_ahead=`` asks."""
    proxy.idle(*POSTGRES_IDLE_COMMITS)
    direct, proxied = _proxied_postgres(postgres_server, proxy, f"pa{os.getpid()}")
    names = [f"0.{i}" for i in range(27)]
    values = _array(mount_factory(direct, ["create"]), names, CHUNK)
    shuffled = names[:]
    random.Random(3).shuffle(shuffled)
    per_chunk = {}
    for label, options, order in (
        ("grid", [], names),
        ("shuffled", [], shuffled),
        ("asked", ["chunks_ahead=8"], names),
    ):
        m = mount_factory(proxied, options, name=f"m-{label}")
        os.stat(m.path / "a")
        proxy.reset()
        for n in order:
            assert read(m.path / "a" / n) == values[n]
        per_chunk[label] = proxy.round_trips() / len(names)
    assert per_chunk["grid"] <= 1.25, per_chunk
    assert per_chunk["shuffled"] >= 1.6, per_chunk
    assert per_chunk["asked"] <= 0.6, per_chunk


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_postgres_chunk_looked_up_from_a_read_ahead_opens_at_its_newest_version(
    postgres_server, proxy, mount_factory
):
    """Another mount rewrites a chunk whose name and size a reader read ahead; the reader opens
    it before the change feed tells (a round trip of 200 ms delays the notification): the
    open reads the new content, whole, though the lookup showed the old size."""
    direct, proxied = _proxied_postgres(postgres_server, proxy, f"pn{os.getpid()}")
    names = [f"0.{i}" for i in range(12)]
    writer = mount_factory(direct, ["create"])
    values = _array(writer, names, 1000)
    reader = mount_factory(proxied, [])
    for n in names[:3]:  # the third open probes the next eight
        assert read(reader.path / "a" / n) == values[n]
    proxy.set_rtt(200)
    new = b"new" * 700
    write(writer.path / "a" / "0.6", new)
    assert read(reader.path / "a" / "0.6") == new
    for n in names[3:6] + names[7:]:
        assert read(reader.path / "a" / n) == values[n]


# -- round trips of a zarr-like workload (issue #26's targets) -----------------------------------

SERVERS = ["redis", "postgres"]


def _proxied(kind: str, request, proxy, name: str) -> tuple[str, str]:
    if kind == "redis":
        return _proxied_redis(request.getfixturevalue("redis_server"), proxy, name)
    proxy.idle(*POSTGRES_IDLE_COMMITS)
    return _proxied_postgres(request.getfixturevalue("postgres_server"), proxy, name)


def _trips(proxy, calls) -> float:
    """Round trips per call of ``calls`` (callables), counted at the proxy."""
    proxy.reset()
    for call in calls:
        call()
    return proxy.round_trips() / len(calls)


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_chunk_read_after_its_folder_was_listed_costs_about_one_round_trip(
    kind, request, proxy, mount_factory
):
    """A listing's sizes are hints for the opens after it: each open reads the value with its
    probe (no lookup: the listing gave the kernel every name)."""
    direct, proxied = _proxied(kind, request, proxy, f"rl{os.getpid()}")
    names = [f"0.{i}" for i in range(10)]
    values = {n: os.urandom(CHUNK) for n in names}
    m = mount_factory(direct, ["create"])
    (m.path / "a").mkdir()
    for n in names:
        write(m.path / "a" / n, values[n])
    m2 = mount_factory(proxied, [])
    assert sorted(os.listdir(m2.path / "a")) == sorted(names)
    got: dict[str, bytes] = {}
    trips = _trips(proxy, [lambda n=n: got.setdefault(n, read(m2.path / "a" / n)) for n in names])
    assert trips <= 1.2, trips
    assert got == values


def _long_listing(folder) -> dict[str, tuple[int, list[str]]]:
    """What ``ls -l`` asks of each name of ``folder``: its attributes (the listing's, by
    READDIRPLUS) and its extended attributes (``llistxattr``, which the kernel never caches)."""
    return {
        e.name: (e.stat(follow_symlinks=False).st_size, sorted(os.listxattr(e.path, follow_symlinks=False)))
        for e in os.scandir(folder)
    }


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_long_listing_costs_one_round_trip_for_ten_names_or_sixty(kind, request, proxy, mount_factory):
    """``ls -l``: the folder's probe with the first batch of its scans and the ranges of the
    window's attributes, link-group pointers and extended attributes, all in one round trip;
    nothing a name (each name's ``llistxattr`` cost two round trips, the probe and scans four,
    and the window's records one more)."""
    direct, proxied = _proxied(kind, request, proxy, f"ll{os.getpid()}")
    m = mount_factory(direct, ["create"])
    want = {}
    for folder, count in (("ten", 10), ("sixty", 60)):
        (m.path / folder).mkdir()
        for i in range(count):
            name = f"0.{i}"
            write(m.path / folder / name, b"x" * i)
            if i % 3 == 0:
                os.setxattr(m.path / folder / name, "user.n", b"%d" % i)
            want[folder, name] = (i, ["user.n"] if i % 3 == 0 else [])
    m2 = mount_factory(proxied, [])
    trips = {}
    for folder in ("ten", "sixty"):
        os.stat(m2.path / folder)
        got: dict = {}
        trips[folder] = _trips(proxy, [lambda f=folder, g=got: g.update(_long_listing(m2.path / f))])
        assert got == {name: v for (f, name), v in want.items() if f == folder}
    assert trips["sixty"] == trips["ten"] <= 1, trips


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_new_file_costs_two_round_trips_in_a_folder_the_mount_knows(kind, request, proxy, mount_factory):
    """In a folder this mount made or listed, the kernel's lookup of a new name is answered
    from the names the mount knows (kept true by the change feed), the folder's record (the
    new file's group) from what the mount last read or wrote of it: a create, write and close
    is the commit's checks and its write. In a folder only looked up, the first lookup the
    mount asks the database for reads a small folder's names in the same round trip: one
    round trip more for the first new file, none for the next. What another mount adds shows
    all the same."""
    direct, proxied = _proxied(kind, request, proxy, f"rc{os.getpid()}")
    other = mount_factory(direct, ["create"])
    for folder in ("listed", "looked"):
        (other.path / folder).mkdir()
        write(other.path / folder / "old", b"old")
    m = mount_factory(proxied, [])
    os.mkdir(m.path / "made")
    assert os.listdir(m.path / "listed") == ["old"]
    os.stat(m.path / "looked")
    for folder, first in (("made", 0), ("listed", 0), ("looked", 1)):
        # Counted at the proxy, a pipeline whose sender was descheduled longer than the
        # proxy's round trip half way through it (a machine under heavy load) is two bursts:
        # a batch over the bound is measured again with new names (the folder's names are
        # known by then), and one such split is allowed a batch (seen on both trees under two
        # busy loops beside the test: 2.05 in the first and second batches); a third round
        # trip a file would be 3.0.
        for batch in range(3):
            names = [f"{batch}.{i}" for i in range(20)]
            trips = _trips(proxy, [lambda n=n, f=folder: write(m.path / f / n, n.encode()) for n in names])
            if trips <= 2.0 + (first if batch == 0 else 0) / len(names):
                break
        assert trips <= 2.0 + ((first if batch == 0 else 0) + 1) / len(names), (folder, batch, trips)
        for n in names:
            assert read(other.path / folder / n) == n.encode()
    # A folder larger than a batch of its scans is not read by a lookup (one round trip, not
    # one a batch); each new name's lookup there is one round trip.
    with open_driver(direct) as d:
        d.transact(lambda t: [t.put(f"big/{i:04d}", b"x") for i in range(400)])
    eventually(lambda: os.path.exists(m.path / "big"), "a folder another writer made")
    assert _trips(proxy, [lambda: os.stat(m.path / "big" / "0001")]) == 1
    names = [f"new.{i}" for i in range(10)]
    trips = _trips(proxy, [lambda n=n: write(m.path / "big" / n, n.encode()) for n in names])
    assert trips <= 3.0, trips
    assert len(os.listdir(m.path / "big")) == 410
    with pytest.raises(FileExistsError):  # the checks stand: an existing name is refused
        os.open(m.path / "made" / "0.1", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    write(other.path / "made" / "theirs", b"theirs")  # another mount adds a name
    eventually(lambda: os.path.exists(m.path / "made" / "theirs"), "a file another mount made")
    assert read(m.path / "made" / "theirs") == b"theirs"


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_chmod_and_a_link_read_what_they_change_with_their_checks(kind, request, proxy, mount_factory):
    """A chmod reads the file's extended attributes (its access ACL changes with the mode) and
    a link the file's value and extended attributes (stored under the new name) in the
    checks' round trip, not one by one after it; the reply to a chmod or a utime shows the
    node its commit left, without reading it again. A chmod or utime is the checks and the
    commit; a link the checks, the commit, and the kernel's lookup of the new name (a name of
    a linked file reads its link group: up to four). Before, four, three and eight."""
    direct, proxied = _proxied(kind, request, proxy, f"ch{os.getpid()}")
    m = mount_factory(proxied, ["create"])
    top = m.path / "top"
    top.mkdir()
    files = [f"f{i}" for i in range(4)]
    for n in files:
        write(top / n, n.encode() * 100)
        os.setxattr(top / n, "user.k", n.encode())
    for n in files:
        os.stat(top / n)
    trips = _trips(proxy, [lambda n=n: os.chmod(top / n, 0o600) for n in files])
    assert trips <= 2.0, trips
    trips = _trips(proxy, [lambda n=n: os.utime(top / n, ns=(10**9, 2 * 10**9)) for n in files])
    assert trips <= 2.0, trips
    for n in files:  # what the replies showed, and what is stored
        shown = os.stat(top / n)
        assert (stat.S_IMODE(shown.st_mode), shown.st_size) == (0o600, 2 * 100)
        assert (shown.st_atime_ns, shown.st_mtime_ns) == (10**9, 2 * 10**9)
    with open_driver(direct) as d:
        assert all(Attrs.unpack(d.get(attr_key(f"top/{n}"), SIDE)).mtime == 2 * 10**9 for n in files)
    trips = _trips(proxy, [lambda n=n: os.link(top / n, top / f"h{n}") for n in files])
    assert trips <= 6.0 + 1 / 4, trips  # the format layer's check of a new name, once a second
    for n in files:
        assert stat.S_IMODE(os.stat(top / f"h{n}").st_mode) == 0o600
        assert read(top / f"h{n}") == n.encode() * 100
        assert os.getxattr(top / f"h{n}", "user.k") == n.encode()
        assert os.stat(top / n).st_nlink == 2


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_rename_of_a_stored_file_costs_two_round_trips(kind, request, proxy, mount_factory):
    """The checks (both names, both folders, the records of each name and whether any lie
    below it, what keeps the source's folder) in one round trip, then the commit: onto a new
    name, onto an existing file (and the kernel's lookup of it), and into another folder. It
    read the source's records one by one before, nine round trips a rename (rsync renames
    every file it writes). A new name is
    also checked against the Zarr metadata of the folders above it, a round trip once a second
    a folder (the format layer's, as for a new file): one more in each batch at most."""
    direct, proxied = _proxied(kind, request, proxy, f"mv{os.getpid()}")
    m = mount_factory(proxied, ["create"])
    top = m.path / "top"
    top.mkdir()
    (top / "sub").mkdir()
    files = [f"f{i}" for i in range(8)]
    for n in files:
        write(top / n, n.encode())
        os.setxattr(top / n, "user.k", n.encode())
    for n in files:  # the kernel's entries of every name first: its lookups are not the rename's
        os.stat(top / n)
        with pytest.raises(FileNotFoundError):
            os.stat(top / f"g{n}")
        with pytest.raises(FileNotFoundError):
            os.stat(top / "sub" / n)
    trips = _trips(proxy, [lambda n=n: os.rename(top / n, top / f"g{n}") for n in files[:4]])
    assert trips <= 2.0 + 1 / 4, trips
    onto = [lambda i=i: os.rename(top / f"g{files[i]}", top / files[4 + i]) for i in range(4)]
    trips = _trips(proxy, onto)
    # Onto an existing file, one more: the kernel looks the target up anew before every
    # rename (LOOKUP_RENAME_TARGET), and an existing name's lookup asks the server.
    assert trips <= 3.0 + 1 / 4, trips
    trips = _trips(proxy, [lambda n=n: os.rename(top / n, top / "sub" / n) for n in files[4:]])
    assert trips <= 2.0 + 1 / 4, trips
    assert os.listdir(top) == ["sub"]  # the emptied folder keeps its subfolder
    assert sorted(os.listdir(top / "sub")) == files[4:]
    for i, n in enumerate(files[4:]):  # each holds what the file renamed onto it held
        assert read(top / "sub" / n) == files[i].encode()
        assert os.getxattr(top / "sub" / n, "user.k") == files[i].encode()
    with open_driver(direct) as d:
        assert sorted(k for k, _ in d.scan("top/")) == [f"top/sub/{n}" for n in files[4:]]


def _fewest_trips(proxy, batch, bound: float, batches: int = 3) -> float:
    """Round trips per call of ``batch(n)`` (a list of calls, new ones for each ``n``): the
    first batch within ``bound``, else the fewest of ``batches`` (counted at the proxy, a
    pipeline whose sender was descheduled half way through it is two bursts: a busy machine
    may split one of a batch)."""
    best = float("inf")
    for n in range(batches):
        best = min(best, _trips(proxy, batch(n)))
        if best <= bound:
            break
    return best


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_file_this_mount_stored_reads_in_one_round_trip_and_changes_in_few(
    kind, request, proxy, mount_factory
):
    """A file this mount stored: its open reads the value in the probe's round trip (the
    commit noted its size), and the fstat after it is answered by what the open read; an
    append takes the attributes the open read (the change feed tells whether they changed
    since), probes the newest version with the format layer's reads, and writes; a truncate
    by name reads the file's names and attributes with its value, and its reply shows what
    the commit left; a rename onto such a file needs no lookup of it (the kernel's of the
    target, before every rename), nor a stat after it; a setxattr reads the record with its
    probe and leaves the node it changed; a symlink's reply shows what was made. Before: 4
    round trips a read, 7 an append, 8 a truncate, 3 a rename onto a file, a setxattr or a
    symlink."""
    direct, proxied = _proxied(kind, request, proxy, f"ra{os.getpid()}")
    m = mount_factory(proxied, ["create"])
    top = m.path / "top"
    top.mkdir()
    files = {f"f{b}.{i}": f"f{b}.{i}".encode() for b in range(3) for i in range(8)}
    for n, v in files.items():
        write(top / n, v)

    def batch(op):
        def calls(b: int):
            names = [f"f{b}.{i}" for i in range(8)]
            return [lambda n=n: op(n) for n in names]

        return calls

    def read_one(n: str) -> None:
        assert read(top / n) == files[n]

    def append(n: str) -> None:
        with open(top / n, "ab") as fh:
            fh.write(b"+")
        files[n] += b"+"

    def truncate(n: str) -> None:
        os.truncate(top / n, 2)
        files[n] = files[n][:2]

    assert _fewest_trips(proxy, batch(read_one), 1 + 1 / 8) <= 1 + 1 / 8
    assert _fewest_trips(proxy, batch(append), 3 + 1 / 8) <= 3 + 1 / 8
    assert _fewest_trips(proxy, batch(truncate), 3 + 1 / 8) <= 3 + 1 / 8
    for b in range(3):
        for i in range(8):
            write(top / f"t{b}.{i}", b"target")
            files[f"t{b}.{i}"] = b"target"

    def replace(n: str) -> None:
        os.replace(top / n, top / f"t{n[1:]}")
        files[f"t{n[1:]}"] = files.pop(n)

    assert _fewest_trips(proxy, batch(replace), 2 + 1 / 8) <= 2 + 1 / 8
    # The kernel asks again for a renamed node's attributes (its ctime changed): the rename
    # left the node it moved (rsync's second run stats every file it wrote).
    renamed = [n for n in files if n.startswith("t") and files[n] != b"target"]
    assert _trips(proxy, [lambda n=n: os.stat(top / n) for n in renamed]) <= 1 / len(renamed)
    setxattr = [lambda n=n: os.setxattr(top / n, "user.k", n.encode()) for n in files]
    assert _trips(proxy, setxattr) <= 2 + 1 / 8
    # ... and the kernel's stat of each after it (its ctime changed) is answered by the node
    # the setxattr left.
    assert _trips(proxy, [lambda n=n: os.stat(top / n) for n in files]) <= 1 / len(files)
    links = [lambda i=i: os.symlink(f"t0.{i}", top / f"s{i}") for i in range(8)]
    assert _trips(proxy, links) <= 2 + 1 / 8
    for i in range(8):
        assert os.readlink(top / f"s{i}") == f"t0.{i}" and read(top / f"s{i}") == files[f"t0.{i}"]
        assert os.lstat(top / f"s{i}").st_size == len(f"t0.{i}")
    for n in files:
        assert os.getxattr(top / n, "user.k") == n.encode()
    with open_driver(direct) as d:
        stored = {k: bytes(v) for k, v in d.scan("top/", fetch=VALUES)}
    assert stored == {f"top/{n}": v for n, v in files.items()}  # the symlinks are side entries
    for n, v in files.items():
        assert read(top / n) == v and os.stat(top / n).st_size == len(v)


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_a_new_files_extended_attributes_set_before_its_close_cost_no_round_trip(
    kind, request, proxy, mount_factory
):
    """``cp -a`` sets a new file's extended attributes through its descriptor before the
    close: they are kept with the file made here and stored with it, two round trips a file
    in all (four before: the file stored first, then the setxattr's checks and commit)."""
    direct, proxied = _proxied(kind, request, proxy, f"nx{os.getpid()}")
    m = mount_factory(proxied, ["create"])
    (m.path / "d").mkdir()

    def copy(n: str) -> None:
        with open(m.path / "d" / n, "wb") as fh:
            fh.write(n.encode())
            os.setxattr(fh.fileno(), "user.k", n.encode())

    def batch(b: int):
        return [lambda n=n: copy(n) for n in (f"c{b}.{i}" for i in range(8))]

    assert _fewest_trips(proxy, batch, 2 + 1 / 8) <= 2 + 1 / 8
    with open_driver(direct) as d:
        keys = [k for k, _ in d.scan("d/")]
        assert len(keys) >= 8, keys
        for k in keys:
            assert d.get(xattr_key(k), SIDE) == pack_xattrs({b"user.k": k.split("/")[1].encode()})


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", SERVERS)
def test_mkdir_rmdir_and_unlink_cost_two_round_trips_each(kind, request, proxy, mount_factory):
    """mkdir: the kernel's lookup of the new name answered from the folder's known names (in
    a folder only looked up, once the first lookup read them), the checks, the write (the
    reply shows the folder made); rmdir and unlink: the checks (the name, its folder, anything
    below it, what keeps the folder) in one round trip, the write."""
    direct, proxied = _proxied(kind, request, proxy, f"rm{os.getpid()}")
    m = mount_factory(proxied, ["create"])
    os.mkdir(m.path / "top")
    names = [f"d{i}" for i in range(10)]
    trips = _trips(proxy, [lambda n=n: os.mkdir(m.path / "top" / n) for n in names])
    assert trips <= 2.0, trips
    write(m.path / "top" / "d0" / "f", b"f")
    with pytest.raises(OSError) as exc:  # a folder not empty stays
        os.rmdir(m.path / "top" / "d0")
    assert exc.value.errno == errno.ENOTEMPTY
    os.unlink(m.path / "top" / "d0" / "f")
    with pytest.raises(FileExistsError):
        os.mkdir(m.path / "top" / "d1")
    # The kernel may have let the folders' entries go meanwhile (memory pressure on a busy
    # machine): its lookups of them again come before the count, not inside rmdir's.
    for n in names:
        os.stat(m.path / "top" / n)
    trips = _trips(proxy, [lambda n=n: os.rmdir(m.path / "top" / n) for n in names])
    assert trips <= 2.0, trips
    assert os.listdir(m.path / "top") == []
    files = [f"f{i}" for i in range(10)]
    for n in files:
        write(m.path / "top" / n, b"x")
        os.stat(m.path / "top" / n)
    trips = _trips(proxy, [lambda n=n: os.unlink(m.path / "top" / n) for n in files])
    assert trips <= 2.0, trips
    assert os.listdir(m.path / "top") == []  # the emptied folder is kept
    with open_driver(direct) as d:
        assert not [k for k, _ in d.scan("top/")]
        d.put("theirs/.zgroup", b"{}")  # a folder another writer made: only looked up here
    eventually(lambda: os.path.exists(m.path / "theirs"), "a folder another writer made")
    trips = _trips(proxy, [lambda n=n: os.mkdir(m.path / "theirs" / n) for n in names])
    assert trips <= 2.0 + 1 / len(names), trips  # the first lookup reads the folder's names
    assert sorted(os.listdir(m.path / "theirs")) == sorted([".zgroup", *names])

#!/usr/bin/env python3
"""Benchmark: a mount of a database across a network, against the database's own Python client.

Each server (redis-server, a three-master Redis Cluster with one hierarchy on one slot and, as
``spread``, over every master, PostgreSQL, all started here on 127.0.0.1) is put behind
``zarrfs.testing.proxy.DelayProxy``, which delays every segment (a round trip of 1 ms and of
5 ms, measured and printed) and counts round trips. For each server
and round trip, in one run:

* fresh chunk reads with 1, 4 and 16 readers (threads reading whole chunk files of a Zarr array,
  in a shuffled order, through a fresh mount), against redis-py / psycopg GETs / SELECTs of
  values of the same size with as many threads, each with its own connection;
* chunk writes (create + write + close of new chunk files) with 1, 4 and 16 writers, against
  SETs / upserts with as many threads;
* one single-threaded reader of an array's chunks in grid order through a fresh mount (the
  readahead row), against one client thread;
* round trips per operation, counted by the proxy.

    python scripts/bench_network.py                       # everything (several minutes)
    python scripts/bench_network.py --drivers redis --rtt 5 --chunks 64   # a quick look

Targets (ratios in one run): 16 readers >= 0.7x the client with 16 threads; one reader >= 0.5x
the client with one thread; 16 writers >= 0.5x the client's sets with 16 threads; the
sequential reader >= 2x the mount's one shuffled reader (fetched before it is asked for). A
round trip of 0 (in the default run) adds no delay: those rows are the mount's floor, printed
beside each target in operations/s (``print_floor``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))
sys.path.insert(0, str(HERE))

from servers import (  # noqa: E402
    start_postgres,
    start_redis_cluster,
    stop_postgres,
    stop_redis_cluster,
)

from zarrfs.testing.proxy import POSTGRES_IDLE_COMMITS, DelayProxy  # noqa: E402

CHUNK_ROWS, CHUNK_COLS = 64, 128  # float64: 64 KiB a chunk


def zarrfs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "zarrfs", *args], check=True, cwd=HERE)


def start_redis(work: Path) -> tuple[subprocess.Popen, int]:
    from servers import free_port

    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--notify-keyspace-events", "KEA", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
    )
    import redis

    deadline = time.monotonic() + 30
    while True:
        try:
            redis.Redis(port=port).ping()
            return proc, port
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)


def run_threads(
    count: int, items: list, work: Callable[[int, list], None], prepare=None, on_start=None
) -> float:
    """Seconds for ``count`` threads to do ``work(thread, share)`` over ``items`` split
    round-robin (each first calls ``prepare()``, untimed: a client connects; then
    ``on_start()`` runs, before any work)."""
    shares = [items[i::count] for i in range(count)]
    ready = threading.Barrier(count + 1)
    start = threading.Barrier(count + 1)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        if prepare is not None:
            prepare()
        ready.wait()
        start.wait()
        try:
            work(i, shares[i])
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    ready.wait()
    if on_start is not None:
        on_start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


class Client:
    """The database's own Python client, one connection per thread, on its own keys."""

    def __init__(self, kind: str, address: str) -> None:
        self.kind = kind
        self.address = address
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "c", None)
        if c is None:
            if self.kind == "redis":
                import redis

                c = redis.Redis.from_url(self.address)
                c.ping()  # connected now, not at the first timed command
            elif self.kind == "cluster":
                from redis.cluster import RedisCluster

                host, port = self.address.split(":")
                c = RedisCluster(host=host, port=int(port))
                c.get("bench:0")  # connected to the node that holds the keys
            else:
                import psycopg

                c = psycopg.connect(self.address, autocommit=True)
            self.local.c = c
        return c

    def setup(self) -> None:
        if self.kind == "postgres":
            self.conn().execute("CREATE TABLE IF NOT EXISTS bench_kv (k text PRIMARY KEY, v bytea)")

    def get(self, key: str) -> bytes:
        if self.kind == "postgres":
            return self.conn().execute("SELECT v FROM bench_kv WHERE k = %s", (key,)).fetchone()[0]
        return self.conn().get(key)

    def set(self, key: str, value: bytes) -> None:
        if self.kind == "postgres":
            sql = "INSERT INTO bench_kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
            self.conn().execute(sql, (key, value))
        else:
            self.conn().set(key, value)

    def close(self) -> None:
        pass  # connections end with their threads' process


def chunk_names(grid: tuple[int, int]) -> list[str]:
    return [f"{i}.{j}" for i in range(grid[0]) for j in range(grid[1])]


def zarray(grid: tuple[int, int]) -> bytes:
    return json.dumps({
        "zarr_format": 2, "shape": [grid[0] * CHUNK_ROWS, grid[1] * CHUNK_COLS],
        "chunks": [CHUNK_ROWS, CHUNK_COLS], "dtype": "<f8", "compressor": None, "fill_value": 0.0,
        "order": "C", "filters": None,
    }).encode()


def measure(kind: str, direct_url: str, proxied_url: str, client: Client, proxy: DelayProxy, rtt: float,
            args, work: Path) -> list[tuple]:
    """The rows of one server at a round trip of ``rtt`` ms. The arrays are written first with
    no delay (a cluster's nodes announce the proxy's ports, so its writes pass the proxy too)."""
    proxy.set_rtt(0)
    grid = (args.chunks // 8, 8)
    names = chunk_names(grid)
    value = os.urandom(CHUNK_ROWS * CHUNK_COLS * 8)
    mnt = work / f"mnt-{kind}"
    mnt.mkdir(exist_ok=True)
    log = str(work / f"{kind}.log")
    # The arrays, written once through a mount without the proxy.
    zarrfs("mount", direct_url, str(mnt), "-o", "create", "--log-file", log)
    try:
        for a in ("a", "seq"):
            (mnt / a).mkdir(exist_ok=True)
            (mnt / a / ".zarray").write_bytes(zarray(grid))
            for n in names:
                (mnt / a / n).write_bytes(value)
    finally:
        zarrfs("umount", str(mnt))
    client.setup()
    for n in names:
        client.set(f"bench:{n}", value)
    proxy.set_rtt(rtt)
    rows = []
    order = names[:]
    random.Random(1).shuffle(order)
    buf_size = len(value) + 1

    def read_files(folder: Path):
        def work_(_i, share):
            for n in share:
                with open(folder / n, "rb", buffering=0) as f:
                    data = f.read(buf_size)
                assert len(data) == len(value), (n, len(data))

        return work_

    def timed_mount(body: Callable[[], float]) -> tuple[float, float]:
        zarrfs("mount", proxied_url, str(mnt), "--log-file", log, *args.mount_options)
        try:
            proxy.reset()
            seconds = body()
            trips = proxy.round_trips()
        finally:
            zarrfs("umount", str(mnt))
        return seconds, trips

    def client_gets(_i, share):
        for n in share:
            client.get(f"bench:{n}")

    def client_sets(_i, share):
        for n in share:
            client.set(f"bench:{n}", value)

    for threads in (1, 4, 16):
        secs, trips = timed_mount(lambda t=threads: run_threads(t, order, read_files(mnt / "a")))
        csecs = run_threads(threads, order, client_gets, client.conn, proxy.reset)
        ctrips = proxy.round_trips()
        rows.append((f"read, {threads} readers", len(names) / secs, len(names) / csecs, trips / len(names),
                     ctrips / len(names)))
    for threads in (1, 4, 16):
        folder = f"w{threads}"
        wnames = [f"{folder}/{n}" for n in names]

        def write_files(_i, share):
            for n in share:
                with open(mnt / n, "wb", buffering=0) as f:
                    f.write(value)

        def body(folder=folder, wnames=wnames, threads=threads):
            (mnt / folder).mkdir()
            (mnt / folder / ".zarray").write_bytes(zarray(grid))
            proxy.reset()
            return run_threads(threads, wnames, write_files)

        secs, trips = timed_mount(body)
        csecs = run_threads(threads, wnames, client_sets, client.conn, proxy.reset)
        ctrips = proxy.round_trips()
        rows.append((f"write, {threads} writers", len(names) / secs, len(names) / csecs, trips / len(names),
                     ctrips / len(names)))
    secs, trips = timed_mount(lambda: run_threads(1, names, read_files(mnt / "seq")))
    csecs = run_threads(1, names, client_gets, client.conn, proxy.reset)
    rows.append(("read in grid order, 1 reader", len(names) / secs, len(names) / csecs, trips / len(names),
                 proxy.round_trips() / len(names)))
    return rows


def print_rows(title: str, rows: list[tuple]) -> None:
    print(f"\n{title}")
    print(f"| {'operation':30} | mount ops/s | client ops/s | ratio | mount round trips/op | client |")
    print("|---|---|---|---|---|---|")
    for what, mount, client, mt, ct in rows:
        ratio = mount / client
        print(f"| {what:30} | {mount:11,.0f} | {client:12,.0f} | {ratio:5.2f} | {mt:20.2f} | {ct:6.2f} |")
    by = {r[0]: r for r in rows}
    one, seq = by.get("read, 1 readers"), by.get("read in grid order, 1 reader")
    if one and seq:
        print(f"grid-order reader / shuffled reader: {seq[1] / one[1]:.2f}x (target >= 2)")
    sys.stdout.flush()


#: The targets of the rows, as a ratio to the client with as many threads.
TARGETS = {"read, 1 readers": 0.5, "read, 16 readers": 0.7, "write, 16 writers": 0.5}


def print_floor(kind: str, by_rtt: dict[float, list[tuple]]) -> None:
    """Beside each target at each round trip, what it asks of the mount in operations/s and
    the mount's floor measured in the same run: the same row with no delay added (the
    daemon's CPU, the proxy's and the server's, no network wait). A target above its floor
    cannot be reached by fewer round trips on this machine, only by less CPU a file."""
    floor = {r[0]: r[1] for r in by_rtt.get(0.0, [])}
    if not floor:
        return
    print(f"\n{kind}: each target in operations/s against the mount's floor (no delay, this run)")
    print("| row | round trip | target | floor | mount |")
    print("|---|---|---|---|---|")
    for rtt, rows in sorted(by_rtt.items()):
        if rtt == 0:
            continue
        for what, mount, client, _mt, _ct in rows:
            if what in TARGETS:
                asked = TARGETS[what] * client
                print(f"| {what} | {rtt:g} ms | {TARGETS[what]:g} x {client:,.0f} = {asked:,.0f} "
                      f"| {floor[what]:,.0f} | {mount:,.0f} |")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drivers", default="redis,cluster,spread,postgres")
    parser.add_argument("--rtt", default="0,1,5",
                        help="round trips in ms, comma-separated (0: the floor, see print_floor)")
    parser.add_argument("--chunks", type=int, default=128, help="chunks per array (a multiple of 16)")
    parser.add_argument("-o", dest="mount_options", action="append", default=[],
                        help="a mount option for the mounts through the proxy (repeatable)")
    args = parser.parse_args()
    args.mount_options = [w for o in args.mount_options for w in ("-o", o)]
    drivers = args.drivers.split(",")
    rtts = [float(r) for r in args.rtt.split(",")]
    work = Path(tempfile.mkdtemp(prefix="zarrfs-net-"))
    os.chmod(work, 0o755)
    stops: list[Callable[[], None]] = []
    try:
        with DelayProxy() as proxy:
            proxy.idle(*POSTGRES_IDLE_COMMITS)  # no call waits for them: not counted
            servers = {}
            if "redis" in drivers:
                proc, port = start_redis(work)
                stops.append(lambda: (proc.terminate(), proc.wait()))
                via = proxy.route(port)
                servers["redis"] = (f"redis://127.0.0.1:{port}/0?prefix=nb", f"redis://127.0.0.1:{via}/0?prefix=nb",
                                    Client("redis", f"redis://127.0.0.1:{via}/1"), via)
            if "cluster" in drivers or "spread" in drivers:
                cdir = work / "cluster"
                cdir.mkdir()
                cluster = start_redis_cluster(str(cdir), announce=proxy.route)
                stops.append(lambda: stop_redis_cluster(cluster))
                # The nodes announce the proxy's ports: every client goes through the proxy.
                first = cluster.client().cluster_nodes()
                via = int(next(iter(first)).split(":")[1].split("@")[0])
                url = f"redis+cluster://127.0.0.1:{via}/?prefix=nb"
                servers["cluster"] = (url, url, Client("cluster", f"127.0.0.1:{via}"), via)
                # The same three masters, one hierarchy's chunks spread over them (?spread=1).
                spread = url + "&spread=1"
                servers["spread"] = (spread, spread, Client("cluster", f"127.0.0.1:{via}"), via)
            if "postgres" in drivers:
                pdir = work / "pg"
                pdir.mkdir()
                pg = start_postgres(str(pdir))
                stops.append(lambda: stop_postgres(pg))
                via = proxy.route(pg.port)
                servers["postgres"] = (
                    pg.url(table="nb"),
                    f"postgresql://{pg.user}@127.0.0.1:{via}/postgres?table=nb",
                    Client("postgres", f"postgresql://{pg.user}@127.0.0.1:{via}/postgres"),
                    via,
                )
            for kind in drivers:
                direct, proxied, client, via = servers[kind]
                by_rtt: dict[float, list[tuple]] = {}
                for rtt in rtts:
                    tables_reset(kind, direct)
                    proxy.set_rtt(rtt)
                    measured = measure_pg(client) if kind == "postgres" else proxy.measure(via)
                    try:
                        rows = measure(kind, direct, proxied, client, proxy, rtt, args, work)
                    except Exception as exc:  # noqa: BLE001 - reported; the other rows still run
                        print(f"\n{kind}, round trip {rtt:g} ms: failed: {exc}")
                        continue
                    print_rows(f"{kind}, round trip {rtt:g} ms asked, {measured:.2f} ms measured, "
                               f"{args.chunks} chunks of 64 KiB", rows)
                    by_rtt[rtt] = rows
                print_floor(kind, by_rtt)
    finally:
        for stop in reversed(stops):
            stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def tables_reset(kind: str, direct: str) -> None:
    """Empty the database between round trips (a fresh prefix or table each time would do too)."""
    if kind == "postgres":
        import psycopg

        url = direct.split("?")[0]
        with psycopg.connect(url, autocommit=True) as c:
            for t in ("nb", "nb_side", "bench_kv"):
                c.execute(f"DROP TABLE IF EXISTS {t} CASCADE")
    elif kind == "redis":
        import redis

        redis.Redis.from_url(direct.split("?")[0]).flushall()
    else:
        from redis.cluster import RedisCluster

        host_port = direct.split("//")[1].split("/")[0]
        host, port = host_port.split(":")
        RedisCluster(host=host, port=int(port)).flushall()


def measure_pg(client: Client) -> float:
    """The median round trip of ``SELECT 1`` through the proxy, in milliseconds."""
    conn = client.conn()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        conn.execute("SELECT 1").fetchone()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[10]


if __name__ == "__main__":
    sys.exit(main())

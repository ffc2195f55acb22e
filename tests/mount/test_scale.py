"""Folders of hundreds of thousands of names through a mount: what listing them costs the
daemon's memory (its node IDs, not the folder's size or the database's), that it goes back
when the kernel forgets the names, and that the listing is exact (every name once, in order)
across the many READDIRPLUS calls that resume it.

The database is written directly with py-lmdb, as zarr-python 2's ``LMDBStore`` would. Two
folders of 100,000 and 300,000 names of 700 bytes each: a value that small lives in its key's
leaf page, so a listing passes over 300 MB of map. Memory is read from the daemon's /proc;
what is compared is what the second, larger listing added, against a bound per node ID the
kernel was given plus a constant, with margins for a busy machine (the figures measured are in
docs/performance.md, "Millions of names")."""

from __future__ import annotations

import os
import time

import pytest
from mounting import needs_fuse

from zarrfs.daemon.control import query

pytestmark = [*needs_fuse, pytest.mark.slow]

SMALL, LARGE = 100_000, 300_000
VALUE = b"v" * 700
PER_NODE = 256  # bytes the daemon may keep per node ID the kernel holds (measured: ~200)
CONSTANT = 48 << 20  # batches, windows, the LMDB map's budget of resident pages, the heap's slack
IDLE = 65536 * 600  # forgotten nodes kept for their inode numbers (fuse/inodes.py IDLE_NODES)


def build(path: str) -> None:
    import lmdb

    env = lmdb.open(path, map_size=1 << 32, subdir=True, sync=False)
    with env.begin(write=True) as txn, txn.cursor() as cur:
        for folder, n in (("large", LARGE), ("small", SMALL)):
            cur.putmulti(((f"{folder}/{i:06d}".encode(), VALUE) for i in range(n)), append=False)
    env.close()


def memory(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return {name: int(fields[name].split()[0]) << 10 for name in ("VmRSS", "RssAnon")}


def nodes(mountpoint) -> int:
    doc = query(str(mountpoint))["nodes"]
    return doc["held"] + doc["idle"]


@pytest.fixture
def large_mount(tmp_path, mount_factory):
    build(str(tmp_path / "db.lmdb"))
    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb")
    return m, query(str(m.path))["pid"]


def test_a_listing_costs_the_node_ids_the_kernel_holds_not_the_folder(large_mount):
    m, pid = large_mount
    assert os.listdir(m.path / "small") == [f"{i:06d}" for i in range(SMALL)]
    before, held = memory(pid), nodes(m.path)
    listed = os.listdir(m.path / "large")  # hundreds of READDIRPLUS, each resuming the last
    assert listed == [f"{i:06d}" for i in range(LARGE)]  # every name once, in order
    after, given = memory(pid), nodes(m.path) - held
    assert given > 0
    grown = after["VmRSS"] - before["VmRSS"]
    assert grown < given * PER_NODE + CONSTANT, (grown >> 20, given, (grown - CONSTANT) / given)


@pytest.mark.serial  # drop_caches: every mount of the machine forgets, other tests' too
def test_memory_goes_back_when_the_kernel_forgets_the_names(large_mount):
    m, pid = large_mount
    try:
        drop = open("/proc/sys/vm/drop_caches", "w")  # noqa: SIM115
    except OSError as exc:
        pytest.skip(f"the kernel's caches cannot be dropped here: {exc}")
    start = memory(pid)
    for folder in ("small", "large"):
        assert len(os.listdir(m.path / folder)) == {"small": SMALL, "large": LARGE}[folder]
    listed = memory(pid)
    assert nodes(m.path) > SMALL + LARGE // 2
    with drop:
        drop.write("2")  # dentries and inodes: the kernel forgets the names it can
    deadline = time.monotonic() + 120
    while query(str(m.path))["nodes"]["held"] > 1000 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert query(str(m.path))["nodes"]["held"] <= 1000
    time.sleep(0.5)  # the last BATCH_FORGET handled
    back = memory(pid)
    assert back["RssAnon"] < start["RssAnon"] + IDLE + CONSTANT, (
        start["RssAnon"] >> 20,
        listed["RssAnon"] >> 20,
        back["RssAnon"] >> 20,
    )


# --- the servers' drivers: Redis and PostgreSQL ----------------------------------------------

SERVER_SMALL, SERVER_LARGE = 20_000, 60_000
SERVER_CONSTANT = 16 << 20  # batches and windows, the heap's slack: no map (measured: nothing past the nodes)


def fill_server(kind: str, url: str, server) -> None:
    """Two folders ``small/`` and ``large/`` of 16-byte values, written with the server's own
    client as zarr-python 2's stores would (Redis: no index, the first mount builds it)."""
    sizes = (("small", SERVER_SMALL), ("large", SERVER_LARGE))
    rows = [(f"{folder}/{i:06d}", b"v" * 16) for folder, n in sizes for i in range(n)]
    if kind == "redis":
        prefix = url.rsplit("prefix=", 1)[1]
        client = server.client()
        for i in range(0, len(rows), 10_000):
            client.mset({f"{prefix}:{k}": v for k, v in rows[i : i + 10_000]})
        return
    from psycopg import sql

    from zarrfs.backends import open_driver

    open_driver(url).close()  # makes the tables
    with server.connect() as conn, conn.cursor() as cur:
        table = sql.Identifier(url.rsplit("table=", 1)[1])
        with cur.copy(sql.SQL("COPY {} (k, v) FROM STDIN").format(table)) as out:
            for row in rows:
                out.write_row(row)


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_server_listing_costs_the_node_ids_the_kernel_holds_not_the_folder(kind, request, mount_factory):
    """The same bound on Redis and PostgreSQL, whose listings are paged by the server (the
    Redis index by ZRANGEBYLEX, PostgreSQL by LIMIT) and whose windows' sizes and attributes
    come in batches: what the larger listing adds is the node IDs the kernel was given and a
    constant, and each listing is exact across the READDIRPLUS calls that resume it."""
    import uuid

    server = request.getfixturevalue("redis_server" if kind == "redis" else "postgres_server")
    tag = f"s{uuid.uuid4().hex[:10]}"
    url = server.url(0, prefix=tag) if kind == "redis" else server.url(table=tag)
    fill_server(kind, url, server)
    m = mount_factory(url)
    pid = query(str(m.path))["pid"]
    assert os.listdir(m.path / "small") == [f"{i:06d}" for i in range(SERVER_SMALL)]
    before, held = memory(pid), nodes(m.path)
    assert os.listdir(m.path / "large") == [f"{i:06d}" for i in range(SERVER_LARGE)]
    after, given = memory(pid), nodes(m.path) - held
    assert given > 0
    grown = after["VmRSS"] - before["VmRSS"]
    assert grown < given * PER_NODE + SERVER_CONSTANT, (grown >> 20, given, (grown - SERVER_CONSTANT) / given)


# --- zarrfs copy over many keys ----------------------------------------------------------------


def copy_heap(tmp_path, n: int) -> int:
    """What the Python heap grows by at the peak of a ``zarrfs copy --resume --progress`` of an
    LMDB folder of ``n`` keys to a database that holds them all already (every key skipped)."""
    import tracemalloc

    import lmdb

    from zarrfs.tools.copy import copy

    src, dst = f"lmdb://{tmp_path}/src-{n}.lmdb", f"lmdb://{tmp_path}/dst-{n}.lmdb"
    env = lmdb.open(f"{tmp_path}/src-{n}.lmdb", map_size=1 << 30, subdir=True, sync=False)
    with env.begin(write=True) as txn, txn.cursor() as cur:
        cur.putmulti((f"arr/{i:07d}".encode(), b"v" * 16) for i in range(n))
    env.close()
    copy(src, dst)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        done = copy(src, dst, if_exists="skip", progress=True)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert (done.keys, done.skipped) == (0, n)
    return peak


def test_copy_holds_batches_not_the_keys_it_skips_or_sizes(tmp_path):
    """A resumed copy of 10^7 keys must not keep each key it skipped (nor the sizing pass each
    size): twice the keys, the same peak (measured: under 1 MiB at both; before, 11 and 21 MiB,
    about 100 bytes a key skipped)."""
    small, large = copy_heap(tmp_path, 100_000), copy_heap(tmp_path, 200_000)
    assert large - small < 512 << 10, (small >> 10, large >> 10)


def reindex_heap(redis_server, n: int) -> int:
    """What the Python heap grows by at the peak of a ``reindex`` of a Redis database of ``n``
    keys that has no index (keys as zarr-python 2's ``RedisStore`` writes them)."""
    import tracemalloc
    import uuid

    from zarrfs.backends import open_driver

    prefix = f"ri{uuid.uuid4().hex[:8]}"
    client = redis_server.client()
    for i in range(0, n, 10_000):
        client.mset({f"{prefix}:arr/{j:07d}": b"v" for j in range(i, min(n, i + 10_000))})
    with open_driver(redis_server.url(0, prefix=prefix), build_index=False) as driver:
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            found = driver.reindex(report=lambda stage, count, total: None)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    assert found == n
    return peak


def test_reindex_holds_a_batch_not_the_keyspace(redis_server):
    """``zarrfs reindex`` of 10^7 keys (measured: 38 MiB peak resident at 10^6 and at 10^7):
    twice the keys, the same peak of the heap."""
    small, large = reindex_heap(redis_server, 40_000), reindex_heap(redis_server, 80_000)
    assert large - small < 1 << 20, (small >> 10, large >> 10)


def test_a_resumed_copy_keeps_the_extended_attributes_of_what_it_skips(tmp_path):
    from zarrfs.backends import open_driver
    from zarrfs.backends.base import SIDE
    from zarrfs.fs.sidedata import pack_xattrs, unpack_xattrs, xattr_key
    from zarrfs.tools.copy import copy

    src, dst = f"lmdb://{tmp_path}/src.lmdb", f"lmdb://{tmp_path}/dst.lmdb"
    with open_driver(src) as d:
        d.transact(lambda t: [t.put(f"a/{k}", b"x" * 4) for k in "pqr"])
        mark = pack_xattrs({b"user.k": b"src"})
        d.transact(lambda t: [t.put(xattr_key(f"a/{k}"), mark, SIDE) for k in "pq"])
    with open_driver(dst) as d:
        d.transact(lambda t: t.put("a/p", b"y" * 4))  # whole: skipped
        d.transact(lambda t: t.put(xattr_key("a/p"), pack_xattrs({b"user.k": b"dst"}), SIDE))
        d.transact(lambda t: t.put("a/q", b"y"))  # written in part: copied again
    done = copy(src, dst, if_exists="skip")
    assert (done.keys, done.skipped) == (2, 1)
    with open_driver(dst) as d:
        found = {k: d.transact(lambda t, k=k: t.get(xattr_key(f"a/{k}"), SIDE), write=False) for k in "pqr"}
    assert {k: raw and unpack_xattrs(raw) for k, raw in found.items()} == {
        "p": {b"user.k": b"dst"},
        "q": {b"user.k": b"src"},
        "r": None,
    }


def test_check_counts_the_keys_on_a_terminal(tmp_path):
    """``zarrfs check`` of 10^7 keys takes minutes: on a terminal it counts the keys it passes
    (a tqdm bar on stderr); problems still go to stdout, one line each."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios
    from pathlib import Path

    import lmdb

    env = lmdb.open(str(tmp_path / "db.lmdb"), map_size=1 << 30, subdir=True, sync=False)
    with env.begin(write=True) as txn, txn.cursor() as cur:
        txn.put(b"arr/.zarray", b'{"zarr_format": 2, "shape": [30000], "chunks": [1], "dtype": "|u1", '
                b'"compressor": null, "fill_value": 0, "order": "C", "filters": null}')
        cur.putmulti((f"arr/{i}".encode(), b"v") for i in range(30_000))
        txn.put(b"arr/zz", b"v")
    env.close()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    checkout = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-m", "zarrfs", "check", f"lmdb://{tmp_path}/db.lmdb"],
        stdout=subprocess.PIPE, stderr=slave, text=True, env={**os.environ, "PYTHONPATH": checkout},
    )
    os.close(slave)
    said = b""
    while True:  # read as it comes: a full terminal buffer would stop the bar's writer
        try:
            got = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed, all is read
            break
        if not got:
            break
        said += got
    os.close(master)
    out = proc.stdout.read()
    proc.wait()
    assert proc.returncode == 1 and out.startswith("error: arr/zz: chunk-key.not-integer")
    assert b"30.0k keys" in said and b"1 problem(s) found" in said, said[-300:]


def test_known_records_cost_the_same_a_name_when_full():
    """A mount that keeps extended-attribute records drops the oldest when full: a name then
    costs what it cost while the table filled (CPU time of each phase, measured here). The
    table was a dict whose first key, after many deletions from its front, was found by a
    scan over their holes: a listing of 10^6 names on Redis spent most of its time there."""
    from zarrfs.fs.knownfolders import KnownFolders

    cap = 16384
    known = KnownFolders(xattr_records=cap)

    def per_name(prefix: str, n: int) -> float:
        start = time.process_time()
        for i in range(n):
            known.read_xattrs(f"{prefix}/0.{i}", None)
        return (time.process_time() - start) / n

    filling = min(per_name("fill", cap) for _ in range(3))  # the table full from the first
    full = per_name("arr", 4 * cap)
    assert len(known.xattrs) == cap
    assert full < 5 * filling, (full, filling)

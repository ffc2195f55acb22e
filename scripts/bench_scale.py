#!/usr/bin/env python3
"""Scale benchmark: one zarr array folder of 10^5, 10^6 (and, on demand, 10^7) chunks, mounted.

For each driver and size it builds the database directly with the driver's own client (py-lmdb,
sqlite3, redis-py, psycopg: the layout zarr-python 2's stores write, fast), mounts it
(read-write: a Redis mount builds its key index at the first mount, which a read-only one
cannot), and measures with the kernel's caches dropped before each step (as root; otherwise
warm, and the table says so; then, on a mount, until the daemon has taken back the node IDs
the kernel forgot): the mount itself, ``ls -f`` of the array folder, ``find -name`` over it (names only),
``du -s`` and ``ls -l`` of it (every name's attributes), and a zarr-python read of a slice
touching 1,000 chunks; then the daemon's peak resident memory.
For LMDB it also measures, caches dropped, the floor of a listing in Python (:func:`lmdb_floor`):
the least a Python daemon does per name, a cursor over the folder's keys and one packed
``fuse_direntplus`` record each, with no FUSE, no node table and no filesystem layer. The same
files on the local disk (ext4 here) are measured the same way where the machine holds them (up
to --native-max files), and a 1,000-chunk array gives the slice's floor: a slice of a
10^6-chunk array should take as long as the same slice of that one.

    python scripts/bench_scale.py                                # lmdb, sqlite: 10^3, 10^5, 10^6
    python scripts/bench_scale.py --drivers lmdb --sizes 10000000 --native-max 0   # 10^7, mount only
    python scripts/bench_scale.py --drivers sqlite,redis,postgres   # throw-away servers on 127.0.0.1

Each chunk is 32 x 32 uint8 (1 KiB, no compressor): a value that small lives in its key's LMDB
leaf page, the worst case for a listing. The array is 1,000 chunks wide; the slice is its first
row of chunks (1,000 chunks). Every figure is one run: on a shared machine, compare the rows of
one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from against import query as status_of
from bench import PostgresServer, RedisServer

HERE = Path(__file__).resolve().parent.parent
CHUNK = 32  # a chunk is CHUNK x CHUNK uint8: 1 KiB
COLUMNS = 1000  # chunks per row of the array


def zarrfs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "zarrfs", *args], check=True, cwd=HERE)


def layout(n: int):
    """The array's metadata document and its chunk keys, row by row (``n`` chunks)."""
    rows = max(1, n // COLUMNS)
    cols = min(n, COLUMNS)
    meta = {
        "zarr_format": 2,
        "shape": [rows * CHUNK, cols * CHUNK],
        "chunks": [CHUNK, CHUNK],
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
        "dimension_separator": ".",
    }
    keys = (f"{i}.{j}" for i in range(rows) for j in range(cols))
    return json.dumps(meta).encode(), keys, rows * cols


VALUE = bytes(range(256)) * (CHUNK * CHUNK // 256)


def build_lmdb(url: str, n: int) -> int:
    import lmdb

    meta, keys, total = layout(n)
    env = lmdb.open(url.split("://", 1)[1], map_size=1 << 40, subdir=True, sync=False)
    with env.begin(write=True) as txn, txn.cursor() as cur:
        txn.put(b"arr/.zarray", meta)
        cur.putmulti(((f"arr/{k}".encode(), VALUE) for k in keys), append=False)
    env.close()
    return total


def build_sqlite(url: str, n: int) -> int:
    import sqlite3

    meta, keys, total = layout(n)
    db = sqlite3.connect(url.split("://", 1)[1])
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS zarr(k TEXT PRIMARY KEY, v BLOB)")
    with db:
        db.execute("INSERT INTO zarr VALUES (?, ?)", ("arr/.zarray", meta))
        db.executemany("INSERT INTO zarr VALUES (?, ?)", ((f"arr/{k}", VALUE) for k in keys))
    db.close()
    return total


def build_redis(url: str, n: int) -> int:
    """Plain ``prefix:key`` strings, as ``RedisStore`` writes them; zarrfs builds its own
    sorted index from a SCAN at the first mount (counted in the mount's time)."""
    import redis

    base, _, query = url.partition("?")
    prefix = dict(p.split("=", 1) for p in query.split("&") if p).get("prefix", "zarr")
    client = redis.Redis.from_url(base)
    meta, keys, total = layout(n)
    pipe = client.pipeline(transaction=False)
    pipe.set(f"{prefix}:arr/.zarray", meta)
    for i, k in enumerate(keys, 1):
        pipe.set(f"{prefix}:arr/{k}", VALUE)
        if i % 10000 == 0:
            pipe.execute()
    pipe.execute()
    client.close()
    return total


def drop_redis(url: str) -> None:
    """Delete what a size's run left in Redis: the data keys, zarrfs's side keys and indexes."""
    import redis

    from zarrfs.backends.redis.url import KeyNames

    base, _, query = url.partition("?")
    names = KeyNames(dict(p.split("=", 1) for p in query.split("&") if p).get("prefix", "zarr"))
    client = redis.Redis.from_url(base)
    client.delete(*names.index.values())
    for prefix in (names.data_prefix, names.side_prefix):
        batch = []
        for key in client.scan_iter(match=prefix + b"*", count=10000):
            batch.append(key)
            if len(batch) >= 10000:
                client.unlink(*batch)
                batch = []
        if batch:
            client.unlink(*batch)
    client.close()


def build_postgres(url: str, n: int) -> int:
    """Rows of the driver's table, written with COPY (zarrfs makes the tables first)."""
    import psycopg
    from psycopg import sql

    from zarrfs.backends import open_driver

    with open_driver(url):  # makes the tables
        pass
    base, _, query = url.partition("?")
    options = dict(p.split("=", 1) for p in query.split("&") if p)
    table = options.pop("table", "zarr")
    meta, keys, total = layout(n)
    with psycopg.connect(base) as conn, conn.cursor() as cur:
        copy = sql.SQL("COPY {} (k, v) FROM STDIN").format(sql.Identifier(table))
        with cur.copy(copy) as out:
            out.write_row(("arr/.zarray", meta))
            for k in keys:
                out.write_row((f"arr/{k}", VALUE))
    return total


def drop_postgres(url: str) -> None:
    import psycopg
    from psycopg import sql

    base, _, query = url.partition("?")
    table = dict(p.split("=", 1) for p in query.split("&") if p).get("table", "zarr")
    with psycopg.connect(base, autocommit=True) as conn:
        for name in (table, table + "_side"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def build_native(folder: Path, n: int) -> None:
    meta, keys, _ = layout(n)
    arr = folder / "arr"
    arr.mkdir(parents=True)
    (arr / ".zarray").write_bytes(meta)
    for k in keys:
        fd = os.open(arr / k, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, VALUE)
        os.close(fd)


def cold(enabled: bool) -> None:
    """Write back and drop the kernel's page cache, dentries and inodes (root only)."""
    os.sync()
    if enabled:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3")


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def read_slice(root: Path, out: np.ndarray) -> float:
    """A zarr-python read of the array's first row of chunks (up to 1,000 chunks) into ``out``."""
    import zarr
    from zarr.storage import LocalStore

    t = time.perf_counter()
    arr = zarr.open_array(store=LocalStore(root, read_only=True), path="arr", mode="r", zarr_format=2)
    out[...] = arr[:CHUNK, : out.shape[1]]
    return time.perf_counter() - t


# fuse_direntplus as the kernel reads it (include/uapi/linux/fuse.h; zarrfs/fuse/abi.py packs
# the same): fuse_entry_out (nodeid generation entry_valid attr_valid, their nsec, fuse_attr:
# 128 bytes), then fuse_dirent (ino off namelen type: 24 bytes), then the name padded to 8.
DIRENTPLUS = struct.Struct("<QQQQII" + "QQQQQQIIIIIIIIII" + "QQII")
ATTR = (1024, 2, 0, 0, 0, 0, 0, 0, 0o100644, 1, 0, 0, 0, 4096, 0)  # size blocks times mode ... flags
REPLY = 1 << 20  # bytes a READDIRPLUS reply holds at most (Linux 6.18 asks about this much)


def lmdb_floor(path: str, folder: bytes = b"arr/") -> tuple[float, int]:
    """The least a Python daemon does to list ``folder`` of an LMDB database: open the
    environment read-only, scan the folder's keys with a cursor (keys only, as the driver
    does), and pack one ``fuse_direntplus`` per name into a reply buffer (a name with a further
    ``/`` is a subfolder's: skipped, there are none here). Returns the seconds and the names."""
    import lmdb

    pack_into = DIRENTPLUS.pack_into
    head = DIRENTPLUS.size
    buf = bytearray(REPLY)
    cut = len(folder)
    names = used = 0
    t = time.perf_counter()
    env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=8)
    with env.begin(buffers=True) as txn, txn.cursor() as cur:
        found = cur.set_range(folder)
        while found:
            key = bytes(cur.key())
            if not key.startswith(folder):
                break
            name = key[cut:]
            if b"/" not in name:
                n = len(name)
                length = (head + n + 7) & ~7
                if used + length > REPLY:
                    used = 0  # the reply goes to the kernel; the next one starts
                names += 1
                # node ID, generation, validities, attr (ino, then ATTR), then the dirent (ino,
                # next offset, name length, type)
                pack_into(buf, used, names, 0, 1, 1, 0, 0, names, *ATTR, names, names, n, 8)
                buf[used + head : used + head + n] = name
                used += length
            found = cur.next()
    env.close()
    return time.perf_counter() - t, names


def settled(mountpoint: Path) -> None:
    """Wait until the daemon has taken back the node IDs the kernel forgot when its caches
    were dropped (a million after a listing of a million names: about a second of the
    daemon's time), so that the next step's figure is its own work."""
    last = None
    while True:
        held = status_of(str(mountpoint))["nodes"]["held"]
        if held == last:
            return
        last = held
        time.sleep(0.5)


def walk(root: Path, drop: bool, out: np.ndarray, mount: bool = False) -> dict[str, float]:
    figures = {}
    arr = str(root / "arr")
    steps = (
        ("ls", ["ls", "-f", arr]),
        ("find", ["find", arr, "-name", "*.7"]),  # names only: no stat a name
        ("du", ["du", "-s", arr]),
        ("lsl", ["ls", "-l", arr]),  # every name's attributes (and one SELinux label a run)
    )
    for name, cmd in steps:
        cold(drop)
        if mount:
            settled(root)
        figures[name] = timed(cmd)
    cold(drop)
    if mount:
        settled(root)
    figures["slice"] = read_slice(root, out)
    return figures


def peak_rss(mountpoint: Path) -> int:
    return status_of(str(mountpoint))["memory"]["VmHWM"]


def run(kind: str, url: str, n: int, work: Path, args, out: np.ndarray) -> dict:
    build = {"lmdb": build_lmdb, "sqlite": build_sqlite, "redis": build_redis, "postgres": build_postgres}
    t = time.perf_counter()
    total = build[kind](url, n)
    row = {"driver": kind, "chunks": total, "build": time.perf_counter() - t}
    mnt = work / f"mnt-{kind}-{n}"
    mnt.mkdir()
    cold(args.drop)
    t = time.perf_counter()
    zarrfs("mount", url, str(mnt), "--log-file", str(work / f"{kind}-{n}.log"))
    row["mount"] = time.perf_counter() - t
    try:
        row.update(walk(mnt, args.drop, out, mount=True))
        row["rss"] = peak_rss(mnt)
    finally:
        zarrfs("umount", str(mnt))
    if kind == "lmdb":
        cold(args.drop)
        row["floor"], listed = lmdb_floor(url.split("://", 1)[1])
        assert listed == total + 1, (listed, total)  # the chunks and .zarray
    return row


def native(n: int, work: Path, args, out: np.ndarray) -> dict:
    folder = work / f"native-{n}"
    build_native(folder, n)
    try:
        return walk(folder, args.drop, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def table(rows: list[dict], natives: dict[int, dict], drop: bool) -> str:
    state = "kernel caches dropped before each step" if drop else "warm caches (not root)"
    lines = [
        f"({state}; ext4's figure in parentheses; Python floor: an LMDB key scan packing a "
        "fuse_direntplus per name, no FUSE)",
        "| driver | chunks | mount | ls -f | Python floor | find -name | du -s | ls -l | 1,000-chunk slice "
        "| daemon peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(r: dict, nat: dict, key: str) -> str:
        own = f"{r[key]:.2f} s"
        return f"{own} ({nat[key]:.2f} s)" if key in nat else own

    for r in rows:
        nat = natives.get(r["chunks"], {})
        floor = cell(r, {}, "floor") if "floor" in r else "—"
        lines.append(
            f"| {r['driver']} | {r['chunks']:,} | {r['mount']:.2f} s | {cell(r, nat, 'ls')} | {floor} | "
            f"{cell(r, nat, 'find')} | {cell(r, nat, 'du')} | {cell(r, nat, 'lsl')} | "
            f"{cell(r, nat, 'slice')} | {r['rss'] / (1 << 20):.0f} MiB |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drivers", default="lmdb,sqlite")
    parser.add_argument("--sizes", default="1000,100000,1000000", help="chunk counts, comma-separated")
    parser.add_argument("--native-max", type=int, default=1_000_000, help="largest size also on ext4")
    parser.add_argument("--workdir", default=None, help="where the files go (default: a temp folder)")
    parser.add_argument("--postgres", default=None,
                        help="a postgresql:// URL (default: a throw-away server made with initdb)")
    parser.add_argument("--redis", default=None, help="a redis:// URL (default: a throw-away redis-server)")
    args = parser.parse_args()
    args.drop = os.geteuid() == 0
    sizes = [int(s) for s in args.sizes.split(",")]
    drivers = args.drivers.split(",")
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="zarrfs-scale-", dir=args.workdir))
    out = np.empty((CHUNK, min(max(sizes), COLUMNS) * CHUNK), dtype=np.uint8)
    out[...] = 0
    server = postgres = None
    rows, natives = [], {}
    try:
        if "redis" in drivers and args.redis is None:
            server = RedisServer(work)
        if "postgres" in drivers and args.postgres is None:
            postgres = PostgresServer(work)
            args.postgres = postgres.url()
        load = os.getloadavg()[0]
        print(f"zarrfs scale benchmark: {os.cpu_count()} cores, load average {load:.1f} at the start")
        for n in sizes:
            if n <= args.native_max:
                natives[n] = native(n, work, args, out)
                print(json.dumps({"driver": "ext4", "chunks": n, **natives[n]}), flush=True)
            for kind in drivers:
                if kind == "redis":
                    url = f"{args.redis}?prefix=scale{n}" if args.redis else server.url(f"scale{n}")
                elif kind == "postgres":
                    url = f"{args.postgres}{'&' if '?' in args.postgres else '?'}table=scale{n}"
                else:
                    url = f"{kind}://{work}/db-{n}.{kind}"
                try:
                    rows.append(run(kind, url, n, work, args, out))
                finally:
                    if kind == "postgres":
                        drop_postgres(url)
                    elif kind == "redis":
                        drop_redis(url)
                    for leftover in work.glob(f"db-{n}.*"):
                        if leftover.is_dir():
                            shutil.rmtree(leftover, ignore_errors=True)
                        else:
                            leftover.unlink()
                print(json.dumps(rows[-1]) if rows else "", flush=True)
    finally:
        if server is not None:
            server.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print(table(rows, natives, args.drop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

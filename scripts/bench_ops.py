#!/usr/bin/env python3
"""Requests, daemon CPU and wall time per user operation: zarrfs against a C floor and a native
folder, in one run.

Each operation (create + write + close of 4 KiB files, 1 MiB files written 64 KiB at a time,
``stat`` of existing names through a fresh mount, ``stat`` of missing names, a read of a 4 KiB
file through a fresh mount; ``ls -f``, ``ls -l``, ``find -name`` and ``du -s`` of a folder of
``--entries`` files through a fresh mount) runs through a zarrfs mount, through
``scripts/fuse_ops_floor.c`` (a filesystem in C answering from memory, built here with gcc) and
in a native folder of the work directory's filesystem (its caches dropped before each cold
operation, as ``bench.py`` does; root only, else it runs warm and says so), back to back,
``--repeats`` times. Printed for each: the FUSE requests one operation costs, by type, on
either FUSE side, and the CPU the daemon spent on it (all its threads, from ``/proc``), in
microseconds; then, for zarrfs, each request type's handler CPU per request
(``ZARRFS_REQUEST_CPU``); then the wall time of an operation on each side and the speed of
zarrfs and of the floor as a fraction of the native folder's: the floor's fraction is the most
any FUSE daemon gets on this machine, so a target above it (``bench.py``'s) cannot be met here.
Medians of the rounds. By default neither daemon spins (``-o spin=0``, and the floor's loop
sleeps at once): otherwise the CPU would count the spinning between a client's requests;
``--spin default`` gives zarrfs its own window and the floor the same, for wall times as a
user gets them. Counts are exact; CPU figures hold on a busy machine better than wall-clock
ones, and compare back to back (``--against REV``, which leaves the handlers' clocks off on
both sides: they cost two system calls a request).

    python scripts/bench_ops.py                         # LMDB, 2,000 operations, 20,000 names
    python scripts/bench_ops.py --drivers lmdb,sqlite --ops 500 --entries 5000 --repeats 1
    python scripts/bench_ops.py --spin default          # wall times with both daemons spinning
    python scripts/bench_ops.py --against HEAD~3        # that commit's zarrfs, then this one's
    python scripts/bench_ops.py --against HEAD~3 --alternate 3 --repeats 1  # taking turns, 3 runs each
    python scripts/bench_ops.py --only "ls,stat"        # some of the operations
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 4096
OPS = [
    "create+write+close 4 KiB", "write 1 MiB in 64 KiB writes", "stat existing, cold", "stat missing",
    "read 4 KiB, cold", "ls -f", "ls -l", "find -name", "du -s",
]
CREATES = OPS[0]
#: The drivers it mounts (embedded, a file each, named after the driver).
DRIVERS = ("lmdb", "sqlite")
#: What reads the files the first round's creates made (``Zarrfs.existing``).
READS_CREATED = ("stat existing, cold", "read 4 KiB, cold")
# The listings: each a program run once over the folder "big" (find looks for a name no file has).
LISTINGS = {
    "ls -f": lambda big: ["ls", "-f", big], "ls -l": lambda big: ["ls", "-l", big],
    "find -name": lambda big: ["find", big, "-name", "nothing"], "du -s": lambda big: ["du", "-s", big],
}


def chosen(only: str | None) -> list[str]:
    """The operations ``--only`` names (all without it); the creates come along with an
    operation that reads the files they make (a cold ``stat``, a cold read)."""
    ops = [op for op in OPS if not only or any(w in op for w in only.split(","))]
    if any(op in READS_CREATED for op in ops) and CREATES not in ops:
        ops.insert(0, CREATES)
    return ops


def process_cpu_ns(pid: int) -> int:
    """CPU time of every thread of process ``pid`` so far, in nanoseconds (schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


class Zarrfs:
    """A zarrfs mount of one database, mounted again for each cold operation."""

    name = "zarrfs"

    def __init__(self, url: str, root: Path, entries: int, spin: str | None, clocks: bool) -> None:
        self.url, self.root, self.spin, self.clocks = url, root, spin, clocks
        root.mkdir()
        from zarrfs.backends import open_driver

        subprocess.run(self._cmd("mount", url, str(root), "-o", "create"), check=True)  # made as a user would
        subprocess.run(self._cmd("umount", str(root)), check=True)
        with open_driver(url) as driver:
            for start in range(0, entries, 5000):
                stop = min(entries, start + 5000)
                driver.transact(lambda t, s=start, e=stop: [t.put(f"big/{i}", b"") for i in range(s, e)])
        self.mounted = False

    @staticmethod
    def _cmd(*args: str) -> list[str]:
        return [sys.executable, "-m", "zarrfs", *args]

    def fresh(self) -> None:
        if self.mounted:
            subprocess.run(self._cmd("umount", str(self.root)), check=True)
        self._cached()
        env = {**os.environ, "ZARRFS_REQUEST_CPU": "1"} if self.clocks else os.environ
        log = str(self.root) + ".log"
        args = ["--log-file", log, *([] if self.spin is None else ["-o", f"spin={self.spin}"])]
        subprocess.run(self._cmd("mount", self.url, str(self.root), *args), check=True, env=env)
        self.mounted = True
        self.pid = self._status()["pid"]

    def _cached(self) -> None:
        """Read the database's files, so that "cold" means a fresh mount of a database in the
        page cache whatever the native side's dropping of caches did just before."""
        path = Path(self.url.split("://", 1)[1].split("?", 1)[0])
        files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]
        files += list(path.parent.glob(path.name + "-*")) if not path.is_dir() else []
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(1 << 20):
                    pass

    def _status(self) -> dict:
        from against import query

        return query(str(self.root))

    def counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        """Requests by type, handler CPU (µs) by type, and the process's CPU (ns) so far."""
        doc = self._status()
        return doc["requests"], doc.get("request_cpu_us") or {}, process_cpu_ns(self.pid)

    def existing(self, i: int) -> Path:
        return self.root / f"c0_{i}"  # made by the first round's creates

    def close(self) -> None:
        if self.mounted:
            subprocess.run(self._cmd("umount", str(self.root)), check=False)


class Floor:
    """``scripts/fuse_ops_floor.c``, built once, started again for each cold operation."""

    name = "floor"
    OPCODES = {1: "lookup", 3: "getattr", 4: "setattr", 14: "open", 15: "read", 16: "write", 17: "statfs",
               18: "release", 22: "getxattr", 23: "listxattr", 25: "flush", 26: "init", 27: "opendir",
               28: "readdir", 29: "releasedir", 35: "create", 39: "ioctl", 42: "batch_forget", 2: "forget",
               44: "readdirplus"}

    def __init__(self, work: Path, root: Path, entries: int, spin_us: float) -> None:
        self.spin_us = spin_us
        self.binary = work / "fuse_ops_floor"
        source = str(HERE / "scripts/fuse_ops_floor.c")
        subprocess.run(["gcc", "-O2", source, "-o", str(self.binary)], check=True)
        self.root, self.entries, self.file = root, entries, work / "floor-counts"
        root.mkdir()
        self.proc: subprocess.Popen | None = None
        self.created = 0

    def fresh(self) -> None:
        self.close()
        argv = [str(self.binary), str(self.root), str(self.entries), str(self.file), f"{self.spin_us:g}"]
        self.proc = subprocess.Popen(argv)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.root):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the C floor did not mount")
            time.sleep(0.01)

    def counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        cpu = process_cpu_ns(self.pid)
        self.file.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        os.stat(self.root)  # a request, or none (cached): the loop notices the signal either way
        deadline = time.monotonic() + 5
        while not self.file.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        counts = {}
        for line in self.file.read_text().split("\n") if self.file.exists() else ():
            if line:
                code, n = map(int, line.split())
                counts[self.OPCODES.get(code, f"opcode_{code}")] = n
        return counts, {}, cpu

    def existing(self, i: int) -> Path:
        return self.root / f"e{i}"

    def close(self) -> None:
        if self.proc is not None:
            subprocess.run(["fusermount3", "-u", str(self.root)], check=False)
            self.proc.wait(timeout=10)
            self.proc = None


class Native:
    """A folder of the work directory's own filesystem, its caches dropped before each cold
    operation (``drop_caches``: root only; without it every operation runs warm)."""

    name = "native"

    def __init__(self, root: Path, entries: int, drop: bool = True) -> None:
        self.root = root
        (root / "big").mkdir(parents=True)
        for i in range(entries):
            (root / "big" / str(i)).touch()
        self.drops = drop and os.access("/proc/sys/vm/drop_caches", os.W_OK)
        found = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(root)],
                               capture_output=True, text=True) if shutil.which("findmnt") else None
        self.fstype = (found.stdout.strip() if found else "") or "native"

    def fresh(self) -> None:
        from bench_scale import cold  # its sync and drop of the kernel's caches

        cold(self.drops)

    def counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        return {}, {}, 0

    def existing(self, i: int) -> Path:
        return self.root / f"c0_{i}"

    def close(self) -> None:
        pass


def run_op(op: str, side, n: int, round_: int) -> None:
    """One operation ``n`` times (a listing once) through ``side``'s root."""
    root = side.root
    if op.startswith("create"):
        for i in range(n):
            fd = os.open(root / f"c{round_}_{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, PAYLOAD)
            os.close(fd)
    elif op.startswith("write 1 MiB"):
        for i in range(max(1, n // 16)):  # as cp or dd bs=64K write a file
            fd = os.open(root / f"w{round_}_{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for _ in range(16):
                os.write(fd, PAYLOAD * 16)
            os.close(fd)
    elif op == "stat existing, cold":
        for i in range(n):
            os.stat(side.existing(i))
    elif op == "stat missing":
        for i in range(n):
            try:
                os.stat(root / f"missing{round_}_{i}")
            except FileNotFoundError:
                pass
    elif op.startswith("read"):
        for i in range(n):
            fd = os.open(side.existing(i), os.O_RDONLY)
            os.read(fd, 65536)
            os.close(fd)
    else:
        subprocess.run(LISTINGS[op](str(root / "big")), check=True, stdout=subprocess.DEVNULL)


def measure(op: str, side, n: int, round_: int) -> tuple[dict[str, float], dict[str, float], float, float]:
    """Requests by type per operation, handler µs per request by type, process CPU µs per
    operation and wall µs per operation, of one round of ``op`` through a fresh mount of
    ``side``."""
    side.fresh()  # cold: nothing cached by the kernel
    count = 1 if op in LISTINGS else max(1, n // 16) if op.startswith("write 1 MiB") else n
    before, cpu0, ns0 = side.counts()
    start = time.perf_counter()
    run_op(op, side, n, round_)
    wall = (time.perf_counter() - start) * 1e6 / count
    time.sleep(0.2)  # RELEASE comes after close() returns
    after, cpu1, ns1 = side.counts()
    diff = {k: (v - before.get(k, 0)) / count for k, v in after.items() if v - before.get(k, 0)}
    if side.name == "floor" and diff.get("getattr", 0) * count <= 1:
        diff.pop("getattr", None)  # the stat that wakes the floor to write its counts
    per_request = {}
    for kind, us in cpu1.items():
        served = (after.get(kind, 0) - before.get(kind, 0))
        if served:
            per_request[kind] = (us - cpu0.get(kind, 0)) / served
    return diff, per_request, (ns1 - ns0) / 1000 / count, wall


def requests_text(counts: dict[str, float]) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{total:g}: {parts}" if parts else "0"


def median_counts(rounds: list[dict[str, float]]) -> dict[str, float]:
    kinds = {k for r in rounds for k in r}
    return {k: round(statistics.median(r.get(k, 0) for r in rounds), 2) for k in kinds}


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="zarrfs-bench-ops-", dir=args.workdir))
    results: dict = {}
    try:
        floor = None
        if shutil.which("gcc"):
            floor = Floor(work, work / "floor", args.entries, spin_us(args.spin))
        for kind in args.drivers.split(","):
            native = Native(work / f"native-{kind}", args.entries, not args.native_warm)
            url = f"{kind}://{work}/{kind}.{kind}"
            spin = None if args.spin == "default" else args.spin
            z = Zarrfs(url, work / f"mnt-{kind}", args.entries, spin, not args.no_handler_cpu)
            rows = {}
            try:
                for op in chosen(args.only):
                    n = args.ops
                    rounds = {"zarrfs": [], "floor": [], "native": []}
                    for r in range(args.repeats):
                        sides = (z, floor, native)[r % 3:] + (z, floor, native)[: r % 3]  # each first in turn
                        for side in sides:
                            if side is not None:
                                rounds[side.name].append(measure(op, side, n, r))
                    row = {}
                    for name, got in rounds.items():
                        if got:
                            kinds = {k for _, pr, _, _ in got for k in pr}
                            row[name] = {
                                "requests": median_counts([g[0] for g in got]),
                                "cpu_us": statistics.median(g[2] for g in got),
                                "wall_us": statistics.median(g[3] for g in got),
                                "handler_us": {
                                    k: statistics.median(g[1][k] for g in got if k in g[1]) for k in kinds
                                },
                            }
                    row["native"].update(fstype=native.fstype, cold=native.drops)
                    rows[op] = row
            finally:
                z.close()
            results[kind] = rows
        if floor is not None:
            floor.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def spin_us(spin: str) -> float:
    """The floor's spin for ``--spin``: zarrfs's own default window for "default"."""
    if spin != "default":
        return float(spin)
    try:
        from zarrfs.fuse.loop import DEFAULT_SPIN_US
    except ImportError:  # a zarrfs without a spinning loop
        return 0.0
    return float(DEFAULT_SPIN_US)


def speed(native_us: float, us: float) -> str:
    """Speed as a fraction of the native folder's (its time over this side's)."""
    return f"{native_us / us:5.2f}x" if us else ""


def report(results: dict, args) -> None:
    print(f"zarrfs against the C floor (scripts/fuse_ops_floor.c): {args.ops} operations, "
          f"listings of {args.entries} names, median of {args.repeats}, {os.cpu_count()} cores")
    for kind, rows in results.items():
        print(f"\n{kind}")
        print(f"| {'operation':<26} | {'zarrfs requests/op':<58} | {'floor requests/op':<40} "
              f"| {'zarrfs CPU µs/op':>16} | {'floor CPU µs/op':>15} | {'ratio':>6} |")
        print(f"|{'-' * 28}|{'-' * 60}|{'-' * 42}|{'-' * 18}|{'-' * 17}|{'-' * 8}|")
        handler: dict[str, list[float]] = {}
        for op, row in rows.items():
            z, f = row.get("zarrfs"), row.get("floor")
            ratio = f"{z['cpu_us'] / f['cpu_us']:5.1f}x" if f and f["cpu_us"] else ""
            print(f"| {op:<26} | {requests_text(z['requests']):<58} | "
                  f"{requests_text(f['requests']) if f else '':<40} | {z['cpu_us']:>16.1f} | "
                  f"{f['cpu_us'] if f else float('nan'):>15.1f} | {ratio:>6} |")
            for k, us in z["handler_us"].items():
                handler.setdefault(k, []).append(us)
        figures = ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in sorted(handler.items()))
        if figures:  # --against and --no-handler-cpu leave the handlers' clocks off
            print(f"  zarrfs handler CPU, µs a request (median over the operations): {figures}")
        some = next(iter(rows.values()))["native"]
        how = "caches dropped before each operation" if some["cold"] else "warm: not root, caches not dropped"
        print(f"\n{kind}: wall time of an operation, µs (native: {some['fstype']}, {how}; "
              f"spin {args.spin}); speed as a fraction of native")
        print(f"| {'operation':<28} | {'native':>12} | {'floor':>12} | {'zarrfs':>12} "
              f"| {'floor speed':>11} | {'zarrfs speed':>12} |")
        print(f"|{'-' * 30}|{'-' * 14}|{'-' * 14}|{'-' * 14}|{'-' * 13}|{'-' * 14}|")
        for op, row in rows.items():
            z, f, nat = row["zarrfs"], row.get("floor"), row["native"]
            fw = f["wall_us"] if f else float("nan")
            fs, zs = speed(nat["wall_us"], fw) if f else "", speed(nat["wall_us"], z["wall_us"])
            print(f"| {op:<28} | {nat['wall_us']:>12.1f} | {fw:>12.1f} | {z['wall_us']:>12.1f} "
                  f"| {fs:>11} | {zs:>12} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drivers", default="lmdb")
    parser.add_argument("--ops", type=int, default=2000, help="operations of each kind a round")
    parser.add_argument("--entries", type=int, default=20000, help="names in the listed folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--spin", default="0", help="the mount's -o spin= ('default': its own; 0: a "
                        "loop that sleeps at once, as the floor's, so its CPU is the requests' alone)")
    parser.add_argument("--only", default=None, help="the operations whose names hold one of these words")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--no-handler-cpu", action="store_true", help="no ZARRFS_REQUEST_CPU clocks")
    parser.add_argument("--native-warm", action="store_true",
                        help="the native folder's caches are not dropped (its figures are warm)")
    parser.add_argument("--against", default=None, metavar="REV",
                        help="run on REV's zarrfs first, then on this tree's (scripts/against.py)")
    parser.add_argument("--alternate", type=int, default=1, metavar="N",
                        help="with --against: run each side N times, taking turns, and compare medians")
    args = parser.parse_args()
    if args.alternate < 1:
        parser.error("--alternate takes a number of runs, 1 or more")
    unknown = sorted(set(args.drivers.split(",")) - set(DRIVERS))
    if unknown:
        parser.error(f"--drivers {','.join(unknown)}: this benchmark mounts {' and '.join(DRIVERS)} "
                     "(database servers: scripts/bench_network.py)")
    if args.against:
        from against import compare

        argv = [*sys.argv[1:], "--no-handler-cpu"]
        return compare(args.against, Path(__file__).name, argv, ops_rows, args.alternate)
    results = run(args)
    report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def ops_rows(doc: dict) -> dict[str, tuple[float, str]]:
    """The figures ``--against`` compares: each operation's zarrfs CPU µs and requests."""
    rows = {}
    for kind, ops in doc.items():
        for op, row in ops.items():
            z = row["zarrfs"]
            rows[f"{kind} {op}, CPU µs/op"] = (z["cpu_us"], "lower")
            rows[f"{kind} {op}, requests/op"] = (sum(z["requests"].values()), "lower")
            rows[f"{kind} {op}, wall µs/op"] = (z["wall_us"], "lower")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())

"""The rows of ``bench.py`` about the kernel's caches and other mounts: a second (warm) pass of
``stat`` and of ``ls -l``, and how soon a file written through one mount shows on another."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path


def warm_stats(root: Path, n: int, files: int) -> float:
    """Seconds for a second ``stat`` pass over ``n`` existing names (the first warms the
    kernel's caches; with a change feed the mount's names stay cached)."""
    paths = [f"{root}/small/{i % files}" for i in range(n)]
    for p in paths:
        os.stat(p)
    t0 = time.perf_counter()
    for p in paths:
        os.stat(p)
    return time.perf_counter() - t0


def warm_ls_l(folder: Path) -> float:
    """Seconds for a second ``ls -l`` of ``folder``."""
    subprocess.run(["ls", "-l", str(folder)], check=True, stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    subprocess.run(["ls", "-l", str(folder)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def seen_after(writer: Path, reader: Path, rounds: int = 100, deadline: float = 5.0) -> list[float]:
    """Milliseconds from the close of a file written through ``writer`` until ``reader`` (a
    second mount of the same database) shows its content, polled, per round."""
    (writer / "seen").mkdir(exist_ok=True)
    out = []
    for i in range(rounds):
        data = b"%08d" % i * (1 + i % 7)
        name = f"seen/f{i % 10}"
        (writer / name).write_bytes(data)
        t0 = time.perf_counter()
        while True:
            try:
                if (reader / name).read_bytes() == data:
                    break
            except OSError:
                pass
            if time.perf_counter() - t0 > deadline:
                break
            time.sleep(0.0005)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def percentiles(ms: list[float]) -> tuple[float, float]:
    """Median and 99th percentile."""
    ordered = sorted(ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    """``python scripts/bench_coherence.py URL``: mount the database twice (the first mount
    creates it) and print how soon a file written through one shows on the other."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("url", help="a database URL (a fresh table or prefix)")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent

    def zarrfs(*words: str) -> None:
        subprocess.run([sys.executable, "-m", "zarrfs", *words], check=True, cwd=here)

    with tempfile.TemporaryDirectory(prefix="zarrfs-seen-") as work:
        a, b = Path(work, "a"), Path(work, "b")
        a.mkdir()
        b.mkdir()
        zarrfs("mount", args.url, str(a), "-o", "create", "--log-file", f"{work}/a.log")
        try:
            zarrfs("mount", args.url, str(b), "--log-file", f"{work}/b.log")
            try:
                median, p99 = percentiles(seen_after(a, b, rounds=args.rounds))
            finally:
                zarrfs("umount", str(b))
        finally:
            zarrfs("umount", str(a))
    print(f"seen: median {median:.2f} ms, p99 {p99:.2f} ms ({args.rounds} rounds; target <= 50 / 200)")


if __name__ == "__main__":
    main()

"""Micro-benchmark of one-shot driver calls on LMDB and SQLite, in process: the best of 25 runs
of 20,000 calls each, CPU time per call (the CPU time, not the wall clock, so that other work
on the machine disturbs it less).

Run from a directory without a ``zarrfs`` folder, with ``PYTHONPATH`` naming the tree to
measure, to compare two trees: ``cd /tmp && PYTHONPATH=/path/to/tree python bench_oneshot.py``.
"""

import os
import sys
import tempfile
import time
import timeit

from zarrfs.backends import open_driver

N = 20_000


def run(url: str) -> dict[str, float]:
    """Microseconds per call of each one-shot operation on the database at ``url``."""
    d = open_driver(url)
    try:
        d.put("arr/c/0/0", os.urandom(1 << 20))
        d.put("arr/.zarray", b"{}" * 100)
        out = {}
        for name, fn in [
            ("size", lambda: d.size("arr/c/0/0")),
            ("size-miss", lambda: d.size("arr/c/9/9")),
            ("get-small", lambda: d.get("arr/.zarray")),
            ("read-4k", lambda: d.read("arr/c/0/0", 4096, 4096)),
            ("txn-size", lambda: d.transact(lambda t: t.size("arr/c/0/0"), write=False)),
        ]:
            best = min(timeit.repeat(fn, number=N, repeat=25, timer=time.process_time))
            out[name] = best / N * 1e6
        return out
    finally:
        d.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for kind, url in [("lmdb", f"lmdb://{tmp}/db.lmdb"), ("sqlite", f"sqlite://{tmp}/x.db")]:
            res = run(url)
            print(kind, " ".join(f"{k}={v:.2f}us" for k, v in res.items()))
            sys.stdout.flush()

#!/usr/bin/env python3
"""Benchmark: a zip archive mounted (``zip://``) against the same data in LMDB, mounted, and in
a native folder, in one run.

One zarr-python 3 array of small chunks (a many-files case) is written to a folder, then
copied key for key with ``zarrfs copy`` into an LMDB database and a zip archive (stored, as
zarr-python's ``ZipStore`` writes). Each repeat mounts both afresh (cold daemon, cold kernel
cache), then times a listing with ``stat`` of every file (``os.walk`` + ``lstat``) and a read of
every file; the native folder is timed in the same loop. Figures are medians; the ratio that
matters is zip/LMDB.

    python scripts/bench_zip.py                       # 4,096 chunks of 4 KiB, 5 repeats
    python scripts/bench_zip.py --chunks 1024 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent


def zarrfs(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    subprocess.run([sys.executable, "-m", "zarrfs", *args], check=True, env=env, capture_output=True)


def listing(root: str) -> int:
    count = 0
    for folder, _, files in os.walk(root):
        for name in files:
            os.lstat(os.path.join(folder, name))
            count += 1
    return count


def reading(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                total += len(fh.read())
    return total


def timed(fn, root: str) -> float:
    start = time.perf_counter()
    fn(root)
    return time.perf_counter() - start


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--chunks", type=int, default=4096, help="chunks of the array")
    parser.add_argument("--chunk-kib", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import zarr

    with tempfile.TemporaryDirectory(prefix="bench-zip-") as tmp:
        work = Path(tmp)
        side = int(args.chunks**0.5)
        items = args.chunk_kib * 1024 // 8
        native = work / "native"
        root = zarr.open_group(str(native), mode="w", zarr_format=2)
        shape = (side, side * items)
        arr = root.create_array("x", shape=shape, chunks=(1, items), dtype="f8", compressors=None)
        arr[:] = np.random.default_rng(0).random(arr.shape)
        zarrfs("copy", str(native), f"lmdb://{work}/db.lmdb")
        zarrfs("copy", str(native), f"zip://{work}/db.zip")
        kinds = ("native", "lmdb", "zip")
        figures: dict[str, dict[str, list[float]]] = {k: {"list": [], "read": []} for k in kinds}
        for _ in range(args.repeats):
            for kind, url in (("lmdb", f"lmdb://{work}/db.lmdb"), ("zip", f"zip://{work}/db.zip")):
                mnt = work / f"m-{kind}"
                mnt.mkdir(exist_ok=True)
                zarrfs("mount", url, str(mnt), "-o", "ro")
                try:
                    figures[kind]["list"].append(timed(listing, str(mnt)))
                    figures[kind]["read"].append(timed(reading, str(mnt)))
                finally:
                    zarrfs("umount", str(mnt))
            figures["native"]["list"].append(timed(listing, str(native)))
            figures["native"]["read"].append(timed(reading, str(native)))
        files = listing(str(native))
        print(f"{files} files of {args.chunk_kib} KiB, median of {args.repeats} (fresh mounts)")
        print(f"{'':8}{'native s':>10}{'lmdb s':>10}{'zip s':>10}{'zip/lmdb':>10}")
        for what in ("list", "read"):
            med = {k: statistics.median(v[what]) for k, v in figures.items()}
            ratio = med["zip"] / med["lmdb"]
            print(f"{what:8}{med['native']:10.3f}{med['lmdb']:10.3f}{med['zip']:10.3f}{ratio:10.2f}")


if __name__ == "__main__":
    main()

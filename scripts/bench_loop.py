#!/usr/bin/env python3
"""How long the request loop should spin before it sleeps (``-o spin=US``, see
``zarrfs/loop.py``): lookups per second of missing names from one and from two client
processes, and the zarr write and read rates of a Blosc array, against LMDB mounts.

    python scripts/bench_loop.py                      # spin 0, 25, 50, 100 us; two rounds
    python scripts/bench_loop.py --spins 0,50 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def probe(args: tuple[str, str, int]) -> float:
    sys.path.insert(0, str(HERE / "scripts"))
    from bench import time_stats

    root, tag, n = args
    return n / time_stats(f"{root}/{tag}-{i}" for i in range(n))


def zarr_rates(root: str, mib: int) -> tuple[float, float]:
    sys.path.insert(0, str(HERE / "scripts"))
    import numpy as np
    import zarr
    from bench import sample_array
    from zarr.codecs import BloscCodec

    data = sample_array(mib)
    t0 = time.perf_counter()
    arr = zarr.create_array(
        store=f"{root}/a.zarr",
        shape=data.shape,
        chunks=(256, 4096),
        dtype="float32",
        compressors=BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
        overwrite=True,
    )
    arr[...] = data
    t1 = time.perf_counter()
    back = zarr.open_array(f"{root}/a.zarr", mode="r")[...]
    t2 = time.perf_counter()
    assert np.array_equal(back[:3], data[:3])
    return mib / (t1 - t0), mib / (t2 - t1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spins", default="0,25,50,100")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lookups", type=int, default=10000)
    parser.add_argument("--array-mib", type=int, default=128)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zarrfs-loop-"))
    try:
        for rnd in range(args.rounds):
            for n in [int(x) for x in args.spins.split(",")]:
                mnt = work / f"m{rnd}-{n}"
                mnt.mkdir()
                url = f"lmdb://{work}/db{rnd}-{n}.lmdb"
                subprocess.run(
                    [sys.executable, "-m", "zarrfs", "mount", url, str(mnt), "-o", f"create,spin={n}"],
                    check=True,
                    cwd=HERE,
                )
                try:
                    rates = []
                    for clients in (1, 2):
                        with Pool(clients) as pool:
                            work_items = [(str(mnt), f"c{clients}p{j}", args.lookups) for j in range(clients)]
                            rates.append(sum(pool.map(probe, work_items)))
                    write, read = zarr_rates(str(mnt), args.array_mib)
                finally:
                    subprocess.run([sys.executable, "-m", "zarrfs", "umount", str(mnt)], check=True, cwd=HERE)
                print(
                    f"spin={n:>3} us: lookups/s 1 client {rates[0]:7.0f}, 2 clients {rates[1]:7.0f}; "
                    f"zarr write {write:4.0f} MiB/s, read {read:4.0f} MiB/s",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Why the daemon is single-threaded: lookups per second of missing names, from one and from two
client processes, against a mount served by one thread and by libfuse's worker threads (with a
lock around the operations, which is what our handle table would need).

    python scripts/bench_threads.py            # prints one line per configuration and run
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool


def serve(url: str, mountpoint: str, threads: bool) -> None:
    from zarrfs.daemon import MountOptions, fuse_options, make_hooks, open_database
    from zarrfs.handles import HandleTable
    from zarrfs.ops import FUSE, Operations
    from zarrfs.tree import Tree

    opts = MountOptions(create=True)
    tree = Tree(open_database(url, opts), uid=os.getuid(), gid=os.getgid(), hooks=make_hooks(opts))
    ops = Operations(tree, HandleTable(tree))
    if threads:
        lock = threading.RLock()
        for name in (
            "node",
            "getattr",
            "open",
            "create",
            "read",
            "write",
            "flush",
            "release",
            "opendir",
            "releasedir",
            "mkdir",
            "statfs",
        ):
            method = getattr(ops, name)

            def locked(*args, _m=method, **kwargs):
                with lock:
                    return _m(*args, **kwargs)

            setattr(ops, name, functools.wraps(method)(locked))
    FUSE(ops, mountpoint, foreground=True, nothreads=not threads, **fuse_options(url, opts))


def probe(args: tuple[str, str, int]) -> float:
    root, tag, n = args
    t0 = time.perf_counter()
    for i in range(n):
        try:
            os.stat(f"{root}/{tag}-{i}")
        except FileNotFoundError:
            pass
    return n / (time.perf_counter() - t0)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
        return 0
    work = tempfile.mkdtemp(prefix="zarrfs-threads-")
    for run in range(2):
        for threads in (False, True):
            mnt = os.path.join(work, f"m{run}{int(threads)}")
            os.mkdir(mnt)
            url = f"lmdb://{work}/db{run}{int(threads)}.lmdb"
            daemon = subprocess.Popen([sys.executable, __file__, "--serve", url, mnt, str(int(threads))])
            while not os.path.ismount(mnt):
                time.sleep(0.05)
            for clients in (1, 2):
                with Pool(clients) as pool:
                    rates = pool.map(probe, [(mnt, f"c{clients}p{j}", 5000) for j in range(clients)])
                mode = "worker threads" if threads else "one thread"
                print(f"{mode:>14}, {clients} client(s): {sum(rates):8.0f} lookups/s")
            subprocess.run(["fusermount3", "-u", mnt], check=True)
            daemon.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

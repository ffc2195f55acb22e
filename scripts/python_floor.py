#!/usr/bin/env python3
"""The floor of a FUSE filesystem written in Python: what zarrfs' request loop costs alone.

Mounts a filesystem (through zarrfs.fuse.channel, i.e. libfuse's mount) whose folder ``small`` holds
``--files`` empty files, answered from a dict by zarrfs.fuse.loop (spinning as it does) and a handler written
like zarrfs.fuse.session, or with ``--session`` by zarrfs.fuse.session itself over an operations
object that finds nodes in a dict (the cost of the session's dispatch and replies), and
``stat``s existing and missing names from a client process, each
name once (cached for 1 s, as a zarrfs mount caches them). Compare with
``scripts/fuse_floor.c`` (the same in C) and with ``scripts/bench.py`` (the same lookups
answered from a database).

    python scripts/python_floor.py                 # 20,000 lookups each way
    python scripts/python_floor.py --spin 0        # sleeping between requests
    python scripts/python_floor.py --session       # through zarrfs' Session
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zarrfs.fs.node import DIR, FILE, Node  # noqa: E402
from zarrfs.fs.sidedata import Attrs  # noqa: E402
from zarrfs.fuse import abi as k  # noqa: E402
from zarrfs.fuse.channel import Channel  # noqa: E402
from zarrfs.fuse.loop import Loop  # noqa: E402
from zarrfs.fuse.session import BUFFER_SIZE, MAX_WRITE, Session  # noqa: E402

FOLDER_ID = 2


class DictOps:
    """The part of zarrfs.fs.api.Operations a stat needs, answered from a dict: what the
    session costs around the filesystem's own work."""

    def __init__(self, files: int) -> None:
        now = time.time_ns()
        folder = Attrs(stat.S_IFDIR | 0o755, 0, 0, now, now, now)
        empty = Attrs(stat.S_IFREG | 0o644, 0, 0, now, now, now)
        # The filesystem's own node class: what the session reads of a node is what it reads here.
        self.nodes = {"": Node(DIR, 0, folder)}
        self.nodes["small"] = self.nodes[""]
        for i in range(files):
            self.nodes[f"small/{i}"] = Node(FILE, 0, empty)
        self.tree = SimpleNamespace()  # where sessions before on_keys_changed() registered
        self.handles = SimpleNamespace()  # the open files: none here
        self.locks = None  # no lock table: the kernel keeps locks, as on a read-only mount

    def on_keys_changed(self, callback) -> None:
        pass

    def find(self, key: str, folder: str | None = None, name: str | None = None):
        return self.nodes.get(key)


def serve_session(mountpoint: str, files: int, spin: float) -> None:
    channel = Channel(mountpoint, {"fsname": "python-floor", "subtype": "floor"})
    session = Session(DictOps(files), channel.fd)
    try:
        Loop(channel.fd, session.handle, BUFFER_SIZE, spin).run()
    finally:
        session.close()
        channel.close()


def serve(mountpoint: str, files: int, spin: float) -> None:
    channel = Channel(mountpoint, {"fsname": "python-floor", "subtype": "floor"})
    fd = channel.fd
    now = int(time.time())
    names = {str(i).encode(): i + 10 for i in range(files)}

    def attr(ino: int, mode: int) -> tuple:
        return (ino, 0, 0, now, now, now, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)

    def handle(buf: memoryview) -> None:
        length, op, unique, nodeid, *_ = k.IN_HEADER.unpack_from(buf)
        if op == k.LOOKUP:
            name = bytes(buf[k.IN_HEADER_SIZE : length - 1])
            if nodeid == k.ROOT_ID and name == b"small":
                a = attr(FOLDER_ID, stat.S_IFDIR | 0o755)
                os.write(fd, k.ENTRY_REPLY.pack(k.ENTRY_REPLY.size, 0, unique, FOLDER_ID, 0, 1, 1, 0, 0, *a))
            elif nodeid == FOLDER_ID and name in names:
                ino = names[name]
                a = attr(ino, stat.S_IFREG | 0o644)
                os.write(fd, k.ENTRY_REPLY.pack(k.ENTRY_REPLY.size, 0, unique, ino, 0, 1, 1, 0, 0, *a))
            else:
                os.write(fd, k.OUT_HEADER.pack(16, -errno.ENOENT, unique))
        elif op == k.GETATTR:
            mode = stat.S_IFDIR | 0o755 if nodeid in (k.ROOT_ID, FOLDER_ID) else stat.S_IFREG | 0o644
            os.write(fd, k.ATTR_REPLY.pack(k.ATTR_REPLY.size, 0, unique, 1, 0, 0, *attr(nodeid, mode)))
        elif op == k.INIT:
            readahead = k.INIT_IN.unpack_from(buf, k.IN_HEADER_SIZE)[2]
            reply = (k.MAJOR, k.MINOR, readahead, 0, 0, 0, MAX_WRITE, 1, MAX_WRITE // 4096, 0, 0)
            os.write(fd, k.INIT_REPLY.pack(k.INIT_REPLY.size, 0, unique, *reply))
        elif op not in (k.FORGET, k.BATCH_FORGET, k.INTERRUPT):
            os.write(fd, k.OUT_HEADER.pack(16, -errno.ENOSYS, unique))

    try:
        Loop(fd, handle, BUFFER_SIZE, spin).run()
    finally:
        channel.close()


CLIENT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from bench import bench_stats  # the lookups scripts/bench.py makes
n = int(sys.argv[2])
existing, missing = bench_stats(Path(sys.argv[1]), n, n, 0)
print(f"existing {n / existing:,.0f} lookups/s, missing {n / missing:,.0f} lookups/s")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--spin", type=float, default=200, help="microseconds, as -o spin=")
    parser.add_argument("--session", action="store_true", help="answer through zarrfs.fuse.session")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="python-floor-") as mnt:
        pid = os.fork()
        if pid == 0:
            try:
                (serve_session if args.session else serve)(mnt, args.files, args.spin)
            finally:
                os._exit(0)
        try:
            for _ in range(200):
                if os.path.ismount(mnt):
                    break
                time.sleep(0.02)
            scripts = str(Path(__file__).resolve().parent)
            subprocess.run([sys.executable, "-c", CLIENT, mnt, str(args.files), scripts], check=True)
        finally:
            subprocess.run(["fusermount3", "-u", mnt], check=False)
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

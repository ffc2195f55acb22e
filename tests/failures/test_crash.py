"""Crash consistency, in the manner of JuiceFS's crash-consistency workflow: writers record each
file (name and digest) in a manifest once its fsync has returned; the daemon is killed with
kill -9 mid-run; ``zarrfs umount`` clears the mountpoint; after a remount every recorded file
is there, whole, and ``zarrfs check`` finds nothing wrong."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest
from mounting import Mount, eventually, make_url, needs_fuse, zarrfs

pytestmark = needs_fuse

WRITER = r"""
import hashlib, os, random, sys
root, manifest, me = sys.argv[1], sys.argv[2], sys.argv[3]
rng = random.Random(me)
with open(manifest, "a") as out:
    for i in range(100000):
        name = f"{me}-{i}"
        data = os.urandom(rng.choice([100, 5000, 70000, 300000]))
        try:
            fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            break  # the daemon is gone
        out.write(f"{name} {hashlib.sha256(data).hexdigest()}\n")
        out.flush()
        os.fsync(out.fileno())
"""


def _lines(path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_kill_9_loses_nothing_fsynced(kind, tmp_path, request):
    url = make_url(kind, tmp_path, request)
    m = Mount(url, tmp_path / "mnt", ["create", "validate=off"])
    writers = []
    try:
        m.start()
        pid = json.loads(zarrfs("status", str(m.path), "--json").stdout)["pid"]
        for w in range(3):
            manifest = tmp_path / f"manifest{w}"
            writers.append(
                subprocess.Popen([sys.executable, "-c", WRITER, str(m.path), str(manifest), f"w{w}"])
            )
        # Killed mid-run, once every writer has recorded a few files (however busy the machine).
        eventually(lambda: all(_lines(tmp_path / f"manifest{w}") > 4 for w in range(3)), "writers started")
        os.kill(pid, signal.SIGKILL)
        for proc in writers:
            proc.wait(timeout=60)
        zarrfs("umount", str(m.path))
        assert not m.mounted()
    finally:
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
        m.stop()
    recorded = {}
    for w in range(3):
        for line in (tmp_path / f"manifest{w}").read_text().splitlines():
            name, digest = line.split()
            recorded[name] = digest
    assert len(recorded) > 10, recorded
    with Mount(url, tmp_path / "mnt") as again:
        for name, digest in recorded.items():
            assert hashlib.sha256((again.path / name).read_bytes()).hexdigest() == digest, name
    done = zarrfs("check", url, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

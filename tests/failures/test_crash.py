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
import time

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


MIXED_WRITER = r"""
import hashlib, os, random, sys
root, log, me = sys.argv[1], sys.argv[2], sys.argv[3]
rng = random.Random(me)
out = open(log, "a")
def note(*words):
    out.write(" ".join(words) + "\n")
    out.flush()
    os.fsync(out.fileno())
content = {}
try:
    for step in range(100000):
        name = f"{me}-{rng.randrange(8)}"
        path = os.path.join(root, name)
        op = rng.choice(["rename", "rename", "overwrite", "append", "parts"])
        if op == "rename" or name not in content:  # zarr's way: a fsynced temporary renamed
            new = os.urandom(rng.choice([10, 4096, 70000, 300000]))
            note("intent", name, hashlib.sha256(new).hexdigest())
            fd = os.open(path + ".partial", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, new)
            os.fsync(fd)
            os.close(fd)
            os.rename(path + ".partial", path)
            fd = os.open(root, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        elif op == "parts":  # over parts_above: stored in parts, then named by one commit
            new = os.urandom(1 << 20) * rng.randint(3, 6)
            note("intent", name, hashlib.sha256(new).hexdigest())
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            for start in range(0, len(new), 1 << 20):
                os.write(fd, new[start : start + (1 << 20)])
            os.fsync(fd)
            os.close(fd)
        else:
            old = content[name]
            if op == "overwrite":
                at, piece = rng.randrange(len(old) + 1), os.urandom(rng.choice([1, 100, 5000]))
                new = old[:at] + piece + old[at + len(piece) :]
            else:
                at, piece = len(old), os.urandom(rng.choice([1, 3000, 200000]))
                new = old + piece
            note("intent", name, hashlib.sha256(new).hexdigest())
            fd = os.open(path, os.O_WRONLY)
            os.pwrite(fd, piece, at)
            os.fsync(fd)
            os.close(fd)
        content[name] = new
        note("done", name)
except OSError:
    pass  # the daemon is gone
"""


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_kill_9_mid_renames_overwrites_and_parts_leaves_each_file_old_or_new(kind, tmp_path, request):
    """Writers replace files by renaming fsynced temporaries, overwrite and append in place,
    and rewrite files stored in parts (``parts_above=1M``), each step fsynced; the daemon is
    killed at a random moment. After a remount each file holds what its last finished step
    wrote or what the step under way would have (a name never finished may be missing), never
    a mix; ``zarrfs check`` finds nothing but parts no file references (a commit in parts cut
    short), and ``--repair`` leaves it clean."""
    import random

    url = make_url(kind, tmp_path, request)
    m = Mount(url, tmp_path / "mnt", ["create", "validate=off", "parts_above=1M"])
    logs = [tmp_path / f"log{w}" for w in range(3)]
    writers = []
    try:
        m.start()
        pid = json.loads(zarrfs("status", str(m.path), "--json").stdout)["pid"]
        for w, log in enumerate(logs):
            command = [sys.executable, "-c", MIXED_WRITER, str(m.path), str(log), f"w{w}"]
            writers.append(subprocess.Popen(command))
        eventually(lambda: all(_lines(log) > 6 for log in logs), "writers started")
        time.sleep(random.uniform(0, 2))
        os.kill(pid, signal.SIGKILL)
        for proc in writers:
            proc.wait(timeout=60)
        zarrfs("umount", str(m.path))
    finally:
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
        m.stop()
    allowed: dict[str, set[str | None]] = {}
    for log in logs:
        pending: dict[str, str] = {}
        for line in log.read_text().splitlines():
            word, name, *digest = line.split()
            if word == "intent":
                pending[name] = digest[0]
            else:
                allowed[name] = {pending.pop(name)}
        for name, digest in pending.items():
            allowed[name] = allowed.get(name, {None}) | {digest}
    assert sum(len(v) == 1 for v in allowed.values()) >= 3, allowed
    with Mount(url, tmp_path / "mnt") as again:
        for name, ok in allowed.items():
            path = again.path / name
            got = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
            assert got in ok, (name, got, ok)
    done = zarrfs("check", url, check=False)
    errors = [line for line in done.stdout.splitlines() if line.startswith("error")]
    assert all("no file references" in line for line in errors), done.stdout + done.stderr
    zarrfs("check", "--repair", url)
    assert zarrfs("check", url, check=False).returncode == 0

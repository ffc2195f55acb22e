"""A full store: a database on a small tmpfs filled through the mount, and a redis-server with
a small maxmemory. The close that does not fit fails with ENOSPC and stores nothing; what was
closed before is all there after a remount; and cleanup (unlink, rmdir, truncate to 0) works
on the full store."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time

import pytest
from conftest import start_redis, stop_redis
from mounting import Mount, needs_fuse, unavailable

from zarrfs.backends import open_driver

pytestmark = needs_fuse

CHUNK = 200_000


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(root, prefix: str, limit: int = 400, size: int = CHUNK) -> tuple[dict[str, str], str]:
    """Write files until a close fails; the closed files' digests and the failed name."""
    kept: dict[str, str] = {}
    for i in range(limit):
        name = f"{prefix}{i}"
        data = os.urandom(size)
        fd = os.open(root / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        except OSError:
            os.close(fd)
            raise
        try:
            os.close(fd)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return kept, name
        kept[name] = hashlib.sha256(data).hexdigest()
    raise AssertionError(f"{limit} files of {CHUNK} bytes fit")


def _check(root, kept: dict[str, str], failed: str) -> None:
    assert not (root / failed).exists()
    for name, digest in kept.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


def _cleanup(root, kept: dict[str, str]) -> None:
    """One removal at a time, with pauses (a user's commands): the mount's background work
    runs between them (on SQLite a checkpoint that took the room the first removal freed)."""
    names = list(kept)
    os.truncate(root / names[0], 0)
    kept[names[0]] = hashlib.sha256(b"").hexdigest()
    for name in names[1:4]:
        time.sleep(0.3)
        os.unlink(root / name)
        del kept[name]
    os.rmdir(root / "empty")


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_full_disk(kind, small_disk, tmp_path):
    url = f"lmdb://{small_disk}/db.lmdb" if kind == "lmdb" else f"sqlite://{small_disk}/db.sqlite"
    m = Mount(url, tmp_path / "mnt", ["create", "validate=off"])
    with m:
        (m.path / "empty").mkdir()
        kept, failed = _fill(m.path, "f")
        _check(m.path, kept, failed)
        _cleanup(m.path, kept)  # on the full disk
    with Mount(url, tmp_path / "mnt", ["validate=off"]) as again:
        _check(again.path, kept, failed)
        assert not (again.path / "empty").exists()
        log = [
            line for line in again.log_text().splitlines() + m.log_text().splitlines() if " ERROR " in line
        ]
    assert any("ENOSPC" in line for line in log)
    assert not any("EIO" in line for line in log), log


def test_a_full_lmdb_map(tmp_path):
    url = f"lmdb://{tmp_path}/small.lmdb?map_size={4 << 20}"
    with Mount(url, tmp_path / "mnt", ["create", "validate=off"]) as m:
        (m.path / "empty").mkdir()
        kept, failed = _fill(m.path, "f")
        _check(m.path, kept, failed)
        _cleanup(m.path, kept)
    with Mount(url, tmp_path / "mnt", ["validate=off"]) as again:
        _check(again.path, kept, failed)


def test_redis_a_transaction_found_over_maxmemory_at_its_exec_is_a_full_store(tmp_path):
    """Redis checks maxmemory again at EXEC: a commit whose commands were queued under the
    limit and that is over it at EXEC (what it queued, or another client's write, took it
    there) is refused with ``EXECABORT ... OOM ...``. That is a full store (ENOSPC at the
    close), as an OOM while queueing is, not an I/O error: ``test_redis_maxmemory`` filling
    a mount met it as EIO now and then. Lowering maxmemory between the queueing and the EXEC
    makes the same refusal every time."""
    from zarrfs.backends.base import StorageFullError
    from zarrfs.backends.redis.link import Link, translate

    server = start_redis(str(tmp_path))
    driver = open_driver(server.url(0, prefix="exec"))
    link = Link(driver)
    try:
        client = server.client()
        client.config_set("maxmemory-policy", "noeviction")
        assert link.call([("MULTI",), ("SET", b"exec:k", b"v" * 1000)]) == [b"OK", b"QUEUED"]
        client.config_set("maxmemory", str(client.info("memory")["used_memory"] - (64 << 10)))
        (reply,) = link.call([("EXEC",)])
        assert isinstance(reply, Exception) and str(reply).startswith("EXECABORT"), reply
        assert isinstance(translate(reply, "where"), StorageFullError)
        client.config_set("maxmemory", "0")
        assert client.get("exec:k") is None
    finally:
        link.close()
        driver.close()
        stop_redis(server)


def test_redis_maxmemory(tmp_path):
    server = start_redis(str(tmp_path))
    try:
        client = server.client()
        client.config_set("maxmemory", str(client.info("memory")["used_memory"] + (2 << 20)))
        client.config_set("maxmemory-policy", "noeviction")
        url = server.url(0, prefix="full")
        driver = open_driver(url)
        driver.put("d/only", b"1")  # a folder made by a key alone: no mark of its own
        driver.close()
        with Mount(url, tmp_path / "mnt", ["create", "validate=off"]) as m:
            (m.path / "empty").mkdir()
            kept, failed = _fill(m.path, "f", limit=5000, size=2000)
            _check(m.path, kept, failed)
            # Over the limit for good (as after a lowered maxmemory), not only for the next write.
            client.config_set("maxmemory", str(client.info("memory")["used_memory"] - (256 << 10)))
            # Redis refuses every write that may add memory: a truncation stores a value.
            with pytest.raises(OSError) as info:
                os.truncate(m.path / next(iter(kept)), 0)
            assert info.value.errno == errno.ENOSPC
            for name in list(kept)[1:4]:
                os.unlink(m.path / name)
                del kept[name]
            os.rmdir(m.path / "empty")
            # The last file of a folder: the folder's mark is a write Redis refuses now.
            os.unlink(m.path / "d" / "only")
        with Mount(url, tmp_path / "mnt", ["validate=off"]) as again:
            _check(again.path, kept, failed)
    finally:
        stop_redis(server)


def _empty_file_refused(root) -> None:
    """A new empty file on the full store: its close says ENOSPC and the file is not there
    (its store is the close's, not a later release's that no program hears)."""
    fd = os.open(root / "new-empty", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with pytest.raises(OSError) as info:
        os.close(fd)
    assert info.value.errno == errno.ENOSPC
    assert "new-empty" not in os.listdir(root)
    # The kernel forgets the name once the descriptor's release (sent after close returns) is
    # answered; till then it may answer a stat from its cache.
    deadline = time.monotonic() + 60
    while (root / "new-empty").exists():
        assert time.monotonic() < deadline, "the name of a file never stored is still there"
        time.sleep(0.05)


def test_a_new_empty_file_on_a_full_lmdb_map_fails_its_close(tmp_path):
    url = f"lmdb://{tmp_path}/small.lmdb?map_size={4 << 20}"
    with Mount(url, tmp_path / "mnt", ["create", "validate=off"]) as m:
        _fill(m.path, "f")  # then smaller files, till not even a byte's file fits
        _fill(m.path, "g", limit=5000, size=4096)
        _fill(m.path, "h", limit=50000, size=1)
        _empty_file_refused(m.path)


def test_a_new_empty_file_over_redis_maxmemory_fails_its_close(tmp_path):
    server = start_redis(str(tmp_path))
    try:
        client = server.client()
        url = server.url(0, prefix="full")
        with Mount(url, tmp_path / "mnt", ["create", "validate=off"]) as m:
            (m.path / "kept").write_bytes(b"k")
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")
            try:
                _empty_file_refused(m.path)
            finally:
                client.config_set("maxmemory", "0")
            assert (m.path / "kept").read_bytes() == b"k"
    finally:
        stop_redis(server)

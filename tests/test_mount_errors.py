"""Bad conditions under a live mount: a full database, a dead Redis. The caller gets the right
errno, the daemon logs one line and stays up, and it works again once the condition passes."""

from __future__ import annotations

import errno
import os

import pytest
from conftest import start_redis, stop_redis
from mounting import needs_fuse, write

pytestmark = needs_fuse


def test_full_lmdb_map_is_enospc_and_the_daemon_stays_up(tmp_path, mount_factory):
    url = f"lmdb://{tmp_path}/small.lmdb?map_size=4194304"
    m = mount_factory(url, ["create"])
    write(m.path / "fits", b"x" * 100_000)
    with pytest.raises(OSError) as info:
        write(m.path / "too-big", os.urandom(8 << 20))
    assert info.value.errno == errno.ENOSPC
    assert not (m.path / "too-big").exists()  # nothing half-stored
    assert (m.path / "fits").read_bytes() == b"x" * 100_000
    write(m.path / "still-works", b"ok")
    assert (m.path / "still-works").read_bytes() == b"ok"
    log = m.log_text()
    assert sum("ENOSPC" in line for line in log.splitlines() if " ERROR " in line) >= 1
    assert "map is full" in log


def test_dead_redis_is_eio_and_the_mount_recovers(tmp_path, mount_factory):
    server = start_redis(str(tmp_path))
    try:
        url = server.url(0, prefix="dead")
        m = mount_factory(url, ["create", "cache_timeout=0"])
        write(m.path / "before", b"1")
        stop_redis(server)
        for action in (lambda: os.stat(m.path / "new-name"), lambda: write(m.path / "new-file", b"2")):
            with pytest.raises(OSError) as info:
                action()
            assert info.value.errno == errno.EIO
        assert m.mounted()  # the daemon is still there (a stat of the root is EIO too now)
        server = start_redis(str(tmp_path), server.port)  # empty again: the data was in memory
        write(m.path / "after", b"3")
        assert (m.path / "after").read_bytes() == b"3"
        errors = [line for line in m.log_text().splitlines() if " ERROR " in line and "EIO" in line]
        assert errors and all(len(line) < 500 for line in errors)  # one line each, no tracebacks
        m.stop()
        assert not m.mounted()
    finally:
        stop_redis(server)

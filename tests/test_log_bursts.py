"""Error lines name the file, and a burst of them (a Redis outage under a stat loop) is a
handful of lines and a count, at the default log level."""

from __future__ import annotations

import os
import time

from conftest import start_redis, stop_redis
from mounting import Mount, needs_fuse

pytestmark = needs_fuse


def test_a_redis_outage_is_a_handful_of_lines_naming_files(tmp_path):
    server = start_redis(str(tmp_path))
    m = Mount(
        server.url(0, prefix="burst"), tmp_path / "mnt", ["create", "cache_timeout=0"], log_level="info"
    )
    try:
        m.start()
        for i in range(5):
            (m.path / f"f{i}").write_bytes(b"x")
        failures = 0
        deadline = time.monotonic() + 3
        stopped_at = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            if server is not None and time.monotonic() > stopped_at:
                port = server.port
                stop_redis(server)
                server = None
                restart_at = time.monotonic() + 1.5
            if server is None and time.monotonic() > restart_at:
                server = start_redis(str(tmp_path), port)
            for i in range(5):
                try:
                    os.stat(m.path / f"f{i}")
                    os.stat(m.path / f"missing{i}")
                except OSError:
                    failures += 1
        assert failures > 50, failures
        m.stop()
    finally:
        m.stop()
        if server is not None:
            stop_redis(server)
    lines = m.log_text().splitlines()
    errors = [line for line in lines if " ERROR " in line or " WARNING " in line]
    assert len(errors) <= 20, "\n".join(errors[:40])
    assert any("more like this" in line for line in errors), "\n".join(errors)
    named = [line for line in errors if "lookup /" in line]
    assert named and all("lookup /f" in line or "lookup /missing" in line for line in named), named

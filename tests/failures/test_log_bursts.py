"""Error lines name the file, and a burst of them (a Redis outage under a stat loop) is a
handful of lines and a count, at the default log level."""

from __future__ import annotations

import os
import time

from conftest import start_redis, stop_redis
from mounting import Mount, eventually, needs_fuse

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

        def stats() -> int:
            """One round of stats of every file and of a missing name each: how many failed."""
            failed = 0
            for i in range(5):
                for name in (f"f{i}", f"missing{i}"):
                    try:
                        os.stat(m.path / name)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        failed += 1
            return failed

        stats()  # served
        port = server.port
        stop_redis(server)
        server = None
        failures = 0
        start = time.monotonic()
        while failures <= 50:  # a burst: more than 50 failed calls while the server is away
            assert time.monotonic() - start < 60, failures
            failures += stats()
        server = start_redis(str(tmp_path), port)
        eventually(lambda: stats() == 0, "the mount served again")
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

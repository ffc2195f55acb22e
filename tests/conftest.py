"""Shared fixtures. Each block is self-contained; mount fixtures live in their own block."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import pytest

# --- backends: a real redis-server ---------------------------------------------------------


@dataclass
class RedisServer:
    """A redis-server started for the test session."""

    host: str
    port: int
    unix_socket: str
    process: subprocess.Popen
    workdir: str

    def url(self, db: int = 0, **query: str) -> str:
        """``redis://host:port/db`` with optional query options (``prefix=...``)."""
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"redis://{self.host}:{self.port}/{db}" + (f"?{q}" if q else "")

    def client(self, db: int = 0):
        """A redis-py client on ``db``, for tests that look behind the driver."""
        import redis

        return redis.Redis(host=self.host, port=self.port, db=db)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_server():
    """Start ``redis-server`` on 127.0.0.1 (free port, no persistence, temp dir) and on a unix
    socket in that dir; stop it after the session."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    workdir = tempfile.mkdtemp(prefix="zarrfs-redis-")
    port = _free_port()
    log = open(os.path.join(workdir, "redis.log"), "wb")
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            workdir,
            "--unixsocket",
            os.path.join(workdir, "redis.sock"),
            "--unixsocketperm",
            "700",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = RedisServer("127.0.0.1", port, os.path.join(workdir, "redis.sock"), proc, workdir)
    deadline = time.monotonic() + 15
    while True:
        try:
            if server.client().ping():
                break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                with open(os.path.join(workdir, "redis.log")) as f:
                    pytest.fail(f"redis-server did not start:\n{f.read()}")
            time.sleep(0.05)
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(redis_server) -> str:
    """URL of database 0 of the session's redis-server (tests isolate by ``?prefix=``)."""
    return redis_server.url(0)


# --- backends: zarr-python 2.18 in its own venv ------------------------------------------------


@pytest.fixture(scope="session")
def zarr2_python() -> str:
    """Interpreter of a venv with zarr 2.18 (built once per machine); fails, never skips, when
    it cannot be built."""
    from zarr2env import Zarr2Unavailable, zarr2_python

    try:
        return zarr2_python()
    except Zarr2Unavailable as exc:
        pytest.fail(str(exc))


# --- mounts: real FUSE mounts through the zarrfs command line (tests/mounting.py) --------------

from mounting import db_url, fuse_required, mount_factory, mounted  # noqa: E402,F401

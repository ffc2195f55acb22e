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


def pytest_addoption(parser):
    parser.addoption(
        "--model-examples",
        type=int,
        default=0,
        help="examples per driver of tests/mount/test_model.py (default: ZARRFS_MODEL_EXAMPLES, else 5)",
    )
    parser.addoption(
        "--observe-steps",
        type=int,
        default=0,
        help="operations at least of each test_atomicity.py observation (default 60): run long",
    )
    parser.addoption(
        "--workers-seed",
        type=int,
        default=None,
        help="seed of tests/fuse/test_workers.py's concurrent clients (default: a fresh one, printed)",
    )
    parser.addoption(
        "--workers-steps",
        type=int,
        default=60,
        help="steps of each of tests/fuse/test_workers.py's concurrent clients (default 60)",
    )


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


def start_redis(workdir: str, port: int | None = None) -> RedisServer:
    """Start ``redis-server`` on 127.0.0.1 (a free port unless given; no persistence) and on
    a unix socket in ``workdir``; return once it answers PING. Fails the test if it cannot."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    port = port or _free_port()
    log = open(os.path.join(workdir, f"redis-{port}.log"), "wb")
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
    log.close()
    server = RedisServer("127.0.0.1", port, os.path.join(workdir, "redis.sock"), proc, workdir)
    deadline = time.monotonic() + 15
    while True:
        try:
            if server.client().ping():
                return server
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                with open(os.path.join(workdir, f"redis-{port}.log")) as f:
                    pytest.fail(f"redis-server did not start:\n{f.read()}")
            time.sleep(0.05)


def record_redis_calls(monkeypatch, driver=None, unwatch: bool = False) -> list[list[str]]:
    """Have the Redis driver's links record every call they send for ``driver`` (for any
    driver when None) as the names of its commands, with, when ``unwatch``, the ``UNWATCH`` a
    link owes in front; return the list they append to (one entry per round trip)."""
    from zarrfs.backends.redis.link import Link

    sent: list[list[str]] = []
    call = Link.call

    def counting(link, commands, big=False, alongside=None):
        if driver is None or link.driver is driver:
            sent.append(["UNWATCH"] * (unwatch and link.unwatch) + [c[0] for c in commands])
        return call(link, commands, big, alongside)

    monkeypatch.setattr(Link, "call", counting)
    return sent


def stop_redis(server: RedisServer) -> None:
    """Stop a server started by :func:`start_redis`."""
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def session_server(prefix: str, start, stop):
    """The body of a session fixture: ``start(workdir)`` in a fresh temporary folder, yield
    what it returns, then ``stop`` it and remove the folder."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    server = start(workdir)
    try:
        yield server
    finally:
        stop(server)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    """A ``redis-server`` for the whole session (tests isolate by key prefix)."""
    yield from session_server("zarrfs-redis-", start_redis, stop_redis)


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

from mounting import db_url, fuse_required, mount_factory, mounted, zarr2_db_url  # noqa: E402,F401

# --- the FUSE session without a mount: make_ops, make_wire, wire (tests/session_wire.py) -------
from session_wire import make_ops, make_wire, wire  # noqa: E402,F401

# --- servers beyond one machine: PostgreSQL and a Redis Cluster (tests/servers.py) ------------


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL cluster for the whole session (tests isolate by table name)."""
    from servers import start_postgres, stop_postgres

    yield from session_server("zarrfs-pg-", start_postgres, stop_postgres)


@pytest.fixture(scope="session")
def redis_cluster():
    """A three-master Redis Cluster for the whole session (tests isolate by key prefix)."""
    from servers import start_redis_cluster, stop_redis_cluster

    yield from session_server("zarrfs-cluster-", start_redis_cluster, stop_redis_cluster)


# --- the quick tier (scripts/test.sh --quick) ------------------------------------------------

# Tests marked ``quick``: every layer (the command line, the daemon and FUSE through real mounts,
# the filesystem without a mount, the Zarr rules, the drivers, tools and store) and every kind
# of driver (files: LMDB, SQLite, DBM; servers: Redis, Redis Cluster, PostgreSQL; archives: zip,
# Icechunk; memory), in a few minutes in one process. Each entry marks the tests of a file whose
# id holds every one of its parts ("" alone: the whole file); ids holding a part of QUICK_SLOW
# stay out (big values, other processes, random folder trees: the whole suite runs them).
QUICK: list[tuple[str, ...]] = [
    ("test_layout.py", ""),
    ("test_readme.py", ""),
    ("test_cli.py", "test_help_is_plain_text"),
    ("test_cli.py", "test_version_help_and_synopsis"),
    ("test_cli.py", "test_bad_option_value"),
    ("test_cli.py", "test_a_mistyped_command"),
    ("test_cli.py", "test_man_page_and_completion"),
    ("test_cli.py", "test_copy_folder_to_database_and_back"),
    ("test_cli.py", "test_a_folder_that_is_not_a_database"),
    ("test_cli.py", "test_umount_of_what_is_not_mounted"),
    ("test_session.py", ""),
    ("test_session_protocol.py", ""),
    ("test_format_v2.py", ""),
    ("test_format_v3.py", ""),
    ("test_format_check.py", ""),
    ("test_format_mount.py", "test_strict_refuses_at_close_rename_and_link[lmdb"),
    ("test_tree.py", "TestMemory::"),
    ("test_tree.py", "TestLMDB::"),
    ("test_tree.py", "TestSQLite::"),
    ("test_tree.py", "TestRedis::", "::test_rename"),
    ("test_tree.py", "TestRedisCluster::", "::test_rename"),
    ("test_tree.py", "TestPostgres::", "::test_rename"),
    ("test_backends.py", "TestRegistry::"),
    ("test_backends.py", "TestMemory::"),
    ("test_backends.py", "TestLMDBFolder::"),
    ("test_backends.py", "test_lmdb_sizes_read_no_values_from_disk"),
    ("test_backends.py", "test_lmdb_a_range_of_a_large_value_reads_the_range_from_disk"),
    ("test_backends.py", "TestSQLite::"),
    ("test_backends.py", "TestDBM::"),
    ("test_backends.py", "TestRedis::"),
    ("test_redis_guesses.py", ""),
    ("test_postgres_guesses.py", ""),
    ("test_backends.py", "TestRedisCluster::"),
    ("test_backends.py", "TestPostgres::"),
    ("test_zip.py", "TestZipConformance::"),
    ("test_zip.py", "test_zarr2_zipstore_read_through_the_mount"),
    ("test_icechunk.py", "TestIcechunkConformance::"),
    ("test_icechunk.py", "test_unmount_commits_what_was_not_committed"),
    ("test_mount_posix.py", "test_files_sizes_and_listing"),
    ("test_mount_posix.py", "test_rename_files_and_folders"),
    ("test_mount_posix.py", "test_open_file_is_visible_and_commits_on_close"),
    ("test_ops_mount.py", "test_status_lists_mounts_and_shows_live_figures[lmdb]"),
    ("test_ops_mount.py", "test_relative_database_and_log_paths_are_the_callers[bare]"),
    ("test_coherence.py", "test_close_to_open["),
    ("test_store.py", "test_store_and_mount_see_each_other"),
    ("test_one_way.py", ""),
    ("test_whole_versions.py", "test_a_descriptor_keeps_its_version", "[lmdb]"),
    ("test_whole_versions.py", "test_a_descriptor_keeps_its_version", "[redis]"),
    ("test_reachable.py", "while_another_mount_writes[lmdb]"),
    ("test_exact_listings.py", "test_a_window_read_ahead", "[lmdb]"),
    ("test_urlfs.py", "lmdb"),
]
QUICK_SLOW = ("test_big_value", "test_processes_increment_exactly", "test_killed_writer", "random_folders")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        file, test = os.path.basename(path), "::" + rest
        if any(part in test for part in QUICK_SLOW):
            continue
        if any(entry[0] == file and all(part in test for part in entry[1:]) for entry in QUICK):
            item.add_marker(pytest.mark.quick)

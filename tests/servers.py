"""Database servers the tests start on 127.0.0.1: a PostgreSQL cluster made with ``initdb`` and
``pg_ctl`` in a temporary folder, and a three-master Redis Cluster made with
``redis-server --cluster-enabled yes`` and ``redis-cli --cluster create``.

Each is started once per test session by a fixture in ``conftest.py`` and stopped at its end;
a server that cannot start fails the tests that need it (a skipped server test tests nothing).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest


def free_port() -> int:
    """A TCP port nobody listens on now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(ready, what: str, proc: subprocess.Popen | None = None, timeout: float = 30, log: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            detail = open(log).read()[-3000:] if log and os.path.exists(log) else ""
            pytest.fail(f"{what} did not start:\n{detail}")
        time.sleep(0.05)


# --- PostgreSQL ------------------------------------------------------------------------------


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@dataclass
class PostgresServer:
    """A PostgreSQL cluster of the test session, listening on 127.0.0.1:``port``."""

    port: int
    datadir: str
    user: str
    pg_ctl: str
    run_as: tuple[int, int] | None

    def url(self, db: str = "postgres", **query: str) -> str:
        """``postgresql://user@127.0.0.1:port/db`` with optional query options."""
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}" + (f"?{q}" if q else "")

    def connect(self, db: str = "postgres"):
        """A psycopg connection, for tests that look behind the driver."""
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname=db, autocommit=True)


def _demote(ids: tuple[int, int] | None):
    if ids is None:
        return None

    def run() -> None:
        os.setgid(ids[1])
        os.setuid(ids[0])

    return run


def start_postgres(workdir: str) -> PostgresServer:
    """Start a throw-away PostgreSQL cluster (trust authentication on 127.0.0.1 only, no
    fsync: the tests need a real server, not durability across a power cut)."""
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.fail("PostgreSQL's server is not installed (apt-get install postgresql)")
    run_as = None
    if os.geteuid() == 0:  # the server refuses to run as root
        pw = pwd.getpwnam("postgres")
        run_as = (pw.pw_uid, pw.pw_gid)
        os.chown(workdir, *run_as)
    user = "zarrfs"
    datadir = os.path.join(workdir, "data")
    log = os.path.join(workdir, "postgres.log")
    res = subprocess.run(
        [initdb, "-D", datadir, "-U", user, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"],
        capture_output=True,
        text=True,
        preexec_fn=_demote(run_as),
    )
    if res.returncode != 0:
        pytest.fail(f"initdb failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    port = free_port()
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {workdir} -c fsync=off -c full_page_writes=off"
    res = subprocess.run(
        [pg_ctl, "-D", datadir, "-l", log, "-o", opts, "-w", "-t", "60", "start"],
        capture_output=True,
        text=True,
        preexec_fn=_demote(run_as),
    )
    if res.returncode != 0:
        pytest.fail(f"pg_ctl start failed:\n{res.stderr[-2000:]}\n" + open(log).read()[-3000:])
    return PostgresServer(port, datadir, user, pg_ctl, run_as)


def stop_postgres(server: PostgresServer) -> None:
    """Stop a server started by :func:`start_postgres`."""
    subprocess.run(
        [server.pg_ctl, "-D", server.datadir, "-m", "immediate", "-w", "stop"],
        capture_output=True,
        preexec_fn=_demote(server.run_as),
    )


# --- Redis Cluster ---------------------------------------------------------------------------


@dataclass
class RedisCluster:
    """Three Redis masters in one cluster, on 127.0.0.1."""

    ports: list[int]
    processes: list[subprocess.Popen]
    workdir: str

    def url(self, **query: str) -> str:
        """``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,.../`` with optional query options."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"redis+cluster://{hosts}/" + (f"?{q}" if q else "")

    def client(self):
        """A redis-py cluster client, for tests that look behind the driver."""
        from redis.cluster import RedisCluster as Client

        return Client(host="127.0.0.1", port=self.ports[0])


def start_redis_cluster(
    workdir: str,
    masters: int = 3,
    replicas: int = 0,
    node_timeout_ms: int | None = None,
    announce: Callable[[int], int] | None = None,
) -> RedisCluster:
    """Start ``masters`` cluster-enabled redis-servers (and ``replicas`` replicas of each) and
    join them into one cluster. ``node_timeout_ms``: how long a silent master takes to be
    failed over (Redis' default is 15 s). ``announce(port)``: the port a node tells clients to
    use instead of its own (a proxy's; the nodes still talk to each other directly)."""
    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if exe is None or cli is None:
        pytest.fail("redis-server and redis-cli are needed (apt-get install redis-server)")
    ports = _cluster_ports(masters * (1 + replicas))
    extra = ["--cluster-node-timeout", str(node_timeout_ms)] if node_timeout_ms else []
    procs = []
    for port in ports:
        told = (
            ["--cluster-announce-port", str(announce(port)), "--cluster-announce-bus-port", str(port + 10000)]
            if announce
            else []
        )
        node = os.path.join(workdir, str(port))
        os.makedirs(node, exist_ok=True)
        log = os.path.join(node, "redis.log")
        procs.append(
            subprocess.Popen(
                [
                    exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                    "--cluster-config-file", os.path.join(node, "nodes.conf"), "--save", "",
                    "--appendonly", "no", "--dir", node, "--logfile", log, *extra, *told,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
    for port, proc in zip(ports, procs, strict=True):
        _wait(lambda port=port: _answers(port), f"redis-server {port}", proc)
    res = subprocess.run(
        [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-replicas", str(replicas),
         "--cluster-yes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode != 0:
        pytest.fail(f"redis-cli --cluster create failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    cluster = RedisCluster(ports, procs, workdir)
    # Every node: a node that has not yet learned the whole slot map answers CLUSTERDOWN.
    _wait(lambda: all(_cluster_ok(cli, port) for port in ports), "the Redis Cluster")
    return cluster


def _cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (port + 10000) are free too, so below 55536; no
    port is another's bus port (a node on 35119 and the bus of 25119 cannot both listen)."""
    import random

    ports: list[int] = []
    taken: set[int] = set()
    while len(ports) < count:
        port = random.randrange(20000, 45000)
        if port not in taken and port + 10000 not in taken and all(_free(p) for p in (port, port + 10000)):
            ports.append(port)
            taken.update((port, port + 10000))
    return ports


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _cluster_ok(cli: str, port: int) -> bool:
    res = subprocess.run([cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True)
    return "cluster_state:ok" in res.stdout


def stop_redis_cluster(cluster: RedisCluster) -> None:
    """Stop every server of the cluster."""
    for proc in cluster.processes:
        proc.terminate()
    for proc in cluster.processes:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()

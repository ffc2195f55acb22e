"""Redis over TLS (``rediss://``, ``rediss+cluster://``): real ``redis-server``s with a TLS port
and a certificate made for the test (``openssl``), opened by the drivers and mounted. A TLS 1.3
server sends its session tickets after the handshake; redis-py refused a connection on which
they waited unread."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time

import pytest
from conftest import _free_port
from servers import _cluster_ports

from zarrfs.backends import open_driver
from zarrfs.backends.base import DATA, BackendError


def _tls_server(work, cluster: bool):
    """A redis-server answering only on TLS (a cluster of one master holding every slot when
    ``cluster``), its certificate made here; ``(process, port, certificate)``."""
    for exe in ("redis-server", "openssl"):
        if shutil.which(exe) is None:
            pytest.fail(f"{exe} is not installed (scripts/setup.sh installs it)")
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    port = _cluster_ports(1)[0] if cluster else _free_port()
    extra = ["--cluster-enabled", "yes", "--tls-cluster", "yes", "--cluster-config-file", work / "nodes.conf"]
    log = open(work / "redis.log", "wb")
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert,
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", work,
         *(extra if cluster else [])],
        stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(cert))
    deadline = time.monotonic() + 15
    while True:  # answers through redis-py's own handshake
        try:
            if not cluster and client.ping():
                break
            if cluster:
                if b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO"):
                    break
                if not client.execute_command("CLUSTER", "NODES").count(b"connected 0-16383"):
                    client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis-server with TLS did not start:\n{(work / 'redis.log').read_text()}")
        time.sleep(0.05)
    return proc, port, cert


def _serve(tmp_path_factory, cluster: bool):
    """A fixture's body: the URL of a server of :func:`_tls_server`, stopped after."""
    proc, port, cert = _tls_server(tmp_path_factory.mktemp("redis-tls"), cluster)
    try:
        where = f"+cluster://127.0.0.1:{port}/" if cluster else f"://127.0.0.1:{port}/0"
        yield f"rediss{where}?ssl_ca_certs={cert}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """The URL of a redis-server answering only on TLS, its certificate in the URL."""
    yield from _serve(tmp_path_factory, cluster=False)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """The URL of a Redis Cluster of one master answering only on TLS, its certificate in it."""
    yield from _serve(tmp_path_factory, cluster=True)


@pytest.fixture
def handshake_then_wait(monkeypatch):
    """Each TLS connection takes its next step 50 ms after its handshake, as a client across
    a network does after the server's session tickets came: on this machine they often come
    after redis-py's look for unread data, and the refusal showed only now and then."""
    import redis.connection

    handshake = redis.connection.SSLConnection._connect

    def later(self):
        sock = handshake(self)
        time.sleep(0.05)
        return sock

    monkeypatch.setattr(redis.connection.SSLConnection, "_connect", later)


def _commit_and_read_back(driver) -> None:
    values = {f"v/{n}": os.urandom(n) for n in (0, 10, 16 << 10, (16 << 10) + 1, 70_000, 3 << 20)}

    def put(t):
        for key, value in values.items():
            t.put(key, value)

    driver.transact(put)
    plan = [("get", key, DATA) for key in values]
    assert driver.transact(lambda t: t.read_many(plan), write=False) == list(values.values())
    other: list = []
    thread = threading.Thread(target=lambda: other.append(driver.get("v/70000")))
    thread.start()
    thread.join(60)
    assert other == [values["v/70000"]]


@pytest.mark.usefixtures("handshake_then_wait")
def test_a_tls_server_is_opened_and_a_commit_of_large_values_read_back(tls_redis):
    """The driver's own connections (no ``CLIENT SETINFO`` elsewhere) and a commit sent piece
    by piece, as a TLS socket has no ``sendmsg``; a second thread's link connects too."""
    driver = open_driver(tls_redis + "&prefix=tls", create=True)
    try:
        _commit_and_read_back(driver)
    finally:
        driver.close()


@pytest.mark.usefixtures("handshake_then_wait")
def test_a_tls_cluster_is_opened_with_its_authority_in_the_url(tls_cluster):
    """``rediss+cluster://`` takes TLS's settings as ``rediss://`` does (the certificate of an
    authority of one's own: the URL had no way to give it)."""
    driver = open_driver(tls_cluster + "&prefix=tls", create=True)
    try:
        _commit_and_read_back(driver)
    finally:
        driver.close()


@pytest.mark.parametrize(
    ("url", "use"),
    [
        ("redis://127.0.0.1:1/0?prefix=x&ssl_ca_certs=/nowhere", "rediss://"),
        ("valkey://127.0.0.1:1/0?prefix=x&ssl_cert_reqs=none", "valkeys://"),
        ("redis+cluster://127.0.0.1:1/?prefix=x&ssl_ca_certs=/nowhere", "rediss+cluster://"),
    ],
)
def test_a_tls_setting_on_a_plain_url_is_refused_saying_which_scheme_takes_it(url, use):
    """Refused before any connection (redis-py said "unexpected keyword argument")."""
    with pytest.raises(BackendError, match=re.escape(f"is a TLS setting: use {use}") + "$"):
        open_driver(url)


def test_a_tls_server_mounts_and_a_file_written_reads_back(tls_redis, mount_factory):
    m = mount_factory(tls_redis + "&prefix=mnt", ["create"])
    data = os.urandom(200_000)
    (m.path / "a").mkdir()
    (m.path / "a" / "f").write_bytes(data)
    assert (m.path / "a" / "f").read_bytes() == data
    assert sorted(os.listdir(m.path / "a")) == ["f"]

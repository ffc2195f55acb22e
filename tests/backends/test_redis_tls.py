"""Redis over TLS (``rediss://``): a real ``redis-server`` with a TLS port and a certificate made
for the test (``openssl``), opened by the driver and mounted. A TLS 1.3 server sends its session
tickets after the handshake; redis-py refused a connection on which they waited unread."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest
from conftest import _free_port

from zarrfs.backends import open_driver
from zarrfs.backends.base import DATA


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """``(url, server)``: a redis-server answering only on TLS, its certificate in the URL."""
    for exe in ("redis-server", "openssl"):
        if shutil.which(exe) is None:
            pytest.fail(f"{exe} is not installed (scripts/setup.sh installs it)")
    work = tmp_path_factory.mktemp("redis-tls")
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    port = _free_port()
    log = open(work / "redis.log", "wb")
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert,
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", work],
        stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    try:
        import redis

        deadline = time.monotonic() + 15
        while True:  # answers PING through redis-py's own handshake
            try:
                if redis.Redis.from_url(url).ping():
                    break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server with TLS did not start:\n{(work / 'redis.log').read_text()}")
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_tls_server_is_opened_and_a_commit_of_large_values_read_back(tls_redis, monkeypatch):
    """The driver's own connections (no ``CLIENT SETINFO`` elsewhere) and a commit sent piece
    by piece, as a TLS socket has no ``sendmsg``; a second thread's link connects too. Each
    connection takes its next step 50 ms after its handshake, as a client across a network
    does after the server's session tickets came: on this machine they often come after
    redis-py's look for unread data, and the refusal showed now and then."""
    import redis.connection

    handshake = redis.connection.SSLConnection._connect

    def later(self):
        sock = handshake(self)
        time.sleep(0.05)
        return sock

    monkeypatch.setattr(redis.connection.SSLConnection, "_connect", later)
    driver = open_driver(tls_redis + "&prefix=tls", create=True)
    try:
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
    finally:
        driver.close()


def test_a_tls_server_mounts_and_a_file_written_reads_back(tls_redis, mount_factory):
    m = mount_factory(tls_redis + "&prefix=mnt", ["create"])
    data = os.urandom(200_000)
    (m.path / "a").mkdir()
    (m.path / "a" / "f").write_bytes(data)
    assert (m.path / "a" / "f").read_bytes() == data
    assert sorted(os.listdir(m.path / "a")) == ["f"]

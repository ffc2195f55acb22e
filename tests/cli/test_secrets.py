"""A Redis password, however it is given (in the URL, ``?password_file=``, ``$ZARRFS_PASSWORD``,
``$REDISCLI_AUTH``), reaches the server and shows nowhere: not in the daemon's argv or
environment, not in the mount table, not in the log, not in ``zarrfs status``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import _free_port
from mounting import needs_fuse

from zarrfs.cli.main import daemon_pids

pytestmark = needs_fuse

SECRET = "s3cr3t-Pw_42"
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def locked_redis(tmp_path):
    """A redis-server that wants ``SECRET``; yields its port."""
    port = _free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--requirepass", SECRET, "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    import redis

    deadline = time.monotonic() + 15
    while True:
        try:
            redis.Redis(port=port, password=SECRET).ping()
            break
        except Exception:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def run(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ZARRFS_PASSWORD", "REDISCLI_AUTH")}
    full.update(env or {})
    full["PYTHONPATH"] = CHECKOUT  # this checkout's zarrfs from any folder
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=120, env=full,
        cwd=cwd,
    )


def assert_hidden(mnt, log) -> None:
    pids = daemon_pids(str(mnt))
    assert len(pids) == 1, pids
    for what in ("cmdline", "environ"):
        with open(f"/proc/{pids[0]}/{what}", "rb") as fh:
            assert SECRET.encode() not in fh.read(), what
    with open("/proc/mounts") as fh:
        line = next(ln for ln in fh if ln.split()[1] == str(mnt))
    assert SECRET not in line and "password=" not in line and "password_file" not in line
    assert line.split()[0].startswith("redis://127.0.0.1:")
    text = log.read_text()
    assert "mounting redis://127.0.0.1:" in text and SECRET not in text
    status = run("status", str(mnt), "--json")
    assert status.returncode == 0, status.stderr
    assert SECRET not in status.stdout and "redis://127.0.0.1:" in status.stdout


@pytest.mark.parametrize("how", ["url", "password_file", "ZARRFS_PASSWORD", "REDISCLI_AUTH"])
def test_password_shows_nowhere(locked_redis, tmp_path, how):
    mnt = tmp_path / "m"
    mnt.mkdir()
    log = tmp_path / "zarrfs.log"
    base = f"redis://127.0.0.1:{locked_redis}/0?prefix=p{how[:3]}"
    env = {}
    if how == "url":
        url = f"redis://:{SECRET}@127.0.0.1:{locked_redis}/0?prefix=p{how[:3]}"
    elif how == "password_file":
        (tmp_path / "pw").write_text(SECRET + "\n")
        url = base + "&password_file=pw"  # relative to the caller's folder
    else:
        url, env = base, {how: SECRET}
    # without the password the server refuses, in one line
    refused = run("mount", base, str(mnt), "-o", "create")
    assert refused.returncode == 1 and "Authentication required" in refused.stderr, refused.stderr
    res = run("mount", url, str(mnt), "-o", "create", "--log-file", str(log), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    try:
        (mnt / "f").write_bytes(b"stored")
        assert (mnt / "f").read_bytes() == b"stored"
        assert_hidden(mnt, log)
    finally:
        assert run("umount", str(mnt)).returncode == 0
    import redis

    assert redis.Redis(port=locked_redis, password=SECRET).get(f"p{how[:3]}:f") == b"stored"


def test_password_in_a_foreground_url_is_blanked_from_its_argv(locked_redis, tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    url = f"redis://:{SECRET}@127.0.0.1:{locked_redis}/0?prefix=fg"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zarrfs", "mount", url, str(mnt), "-f", "-o", "create"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
            argv = fh.read()
        assert SECRET.encode() not in argv and b"127.0.0.1" in argv
        assert b"*" not in argv  # nor its length
        (mnt / "f").write_bytes(b"1")
    finally:
        run("umount", str(mnt))
        proc.wait(timeout=30)
    assert SECRET not in proc.stderr.read()


def test_unreadable_password_file_is_one_line(tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    res = run("mount", f"redis://127.0.0.1:{_free_port()}/0?password_file={tmp_path}/absent", str(mnt))
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "cannot read the password file" in res.stderr


def test_a_server_that_wants_a_password_says_where_to_give_it(locked_redis, tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    for args in (("mount", f"redis://127.0.0.1:{locked_redis}/0", str(mnt), "-o", "create"),
                 ("check", f"redis://127.0.0.1:{locked_redis}/0")):
        res = run(*args)
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
        assert "password_file" in res.stderr and "ZARRFS_PASSWORD" in res.stderr, res.stderr


def test_every_secret_a_driver_declares_is_left_out_of_the_url_shown():
    """Each query option a driver's ``about`` declares secret (Redis: a TLS key's
    ``ssl_password`` too), and a password in the URL, are cut from the URL logs, the mount
    table and ``zarrfs status`` show; the rest of the URL stays."""
    from zarrfs.backends import registry
    from zarrfs.backends.urls import shown_url

    shown = shown_url(f"rediss://me:{SECRET}@host:1/0?ssl_password={SECRET}&prefix=kept")
    assert shown == "rediss://me@host:1/0?prefix=kept"
    checked = set()
    for scheme in registry.known_schemes():
        about = registry.about(scheme)
        if about.files is not None or not about.secrets:
            continue
        for name in about.secrets:
            url = f"{scheme}://me:{SECRET}@host:1/0?{name}={SECRET}&prefix=kept"
            shown = shown_url(url)
            assert SECRET not in shown, shown
            assert shown == f"{scheme}://me@host:1/0?prefix=kept"
            checked.add(name)
    assert {"password", "password_file", "ssl_password"} <= checked

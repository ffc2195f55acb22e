"""Bad conditions under a live mount: a full database, a dead Redis. The caller gets the right
errno, the daemon logs one line and stays up, and it works again once the condition passes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest
from conftest import start_redis, stop_redis
from mounting import close_in_background, needs_fuse, reads_while, write

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


@pytest.mark.parametrize("workers", [1, 16])
def test_dead_redis_is_eio_and_the_mount_recovers(tmp_path, mount_factory, workers):
    """With request threads, a thread whose first connection was refused while the server
    was away makes the others' links suspect too: the first write after the restart was EIO
    (the writing link's socket, closed by the restart, was used again)."""
    server = start_redis(str(tmp_path))
    try:
        url = server.url(0, prefix="dead")
        m = mount_factory(url, ["create", "cache_timeout=0", f"workers={workers}"])
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


# --- the first hour under a live mount ------------------------------------------------------

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env={**os.environ, "PYTHONPATH": CHECKOUT, **(env or {})},
    )


def until(condition, what: str, seconds: float = 30.0):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)
    return found


def test_a_relative_dbm_url_is_the_callers(tmp_path):
    (tmp_path / "db").mkdir()
    (tmp_path / "m").mkdir()
    assert run("mount", "dbm://db/d.dbm", "m", "-o", "create", cwd=tmp_path).returncode == 0
    try:
        write(tmp_path / "m" / "f", b"here")
    finally:
        assert run("umount", "m", cwd=tmp_path).returncode == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("d.dbm")] == []  # not in cwd's top
    assert run("check", "dbm://db/d.dbm", cwd=tmp_path).returncode == 0
    assert not os.path.exists("/db/d.dbm")


def test_an_empty_folder_with_create_and_a_non_empty_mountpoint_with_nonempty(tmp_path, mount_factory):
    (tmp_path / "new.lmdb").mkdir()
    where = tmp_path / "full"
    where.mkdir()
    (where / "hidden").write_text("x")
    m = mount_factory(f"lmdb://{tmp_path}/new.lmdb", ["create", "nonempty"], name="full")
    write(m.path / "a", b"1")
    assert sorted(os.listdir(m.path)) == ["a"]


def test_status_names_requests_lists_subtype_mounts_and_survives_a_closed_pipe(tmp_path, mount_factory):
    """A comma (libfuse's option separator) and a space in the database's path show as they
    are in the listing: a comma showed as "_", both as %2C and %20 in an lmdb:// URL. The
    listing leaves nothing in the daemon's log; zarrfs check of the mountpoint checks the
    database mounted there."""
    m = mount_factory(f"lmdb://{tmp_path}/d,b 1.lmdb", ["create", "subtype=mine"])
    write(m.path / "f", b"1")
    with pytest.raises(OSError):
        os.getxattr(m.path / "f", "user.x")
    # copy_file_range: answered ENOSYS, the kernel copies itself; counted under the kernel's
    # name (FUSE_COPY_FILE_RANGE_64 on kernels from 6.18), not as "opcode_53"
    with open(m.path / "f", "rb") as src, open(m.path / "g", "wb") as dst:
        assert os.copy_file_range(src.fileno(), dst.fileno(), 1) == 1
    assert (m.path / "g").read_bytes() == b"1"
    listed = run("status")
    assert f"{m.path}\tlmdb://{tmp_path}/d,b 1.lmdb\trw" in listed.stdout.splitlines(), listed
    doc = __import__("json").loads(run("status", "--json", str(m.path)).stdout)
    # the listing's look at the daemon is a request it answers, not a hang-up it logs (its
    # connection was served before the one just answered)
    assert "status request failed" not in m.log_text() and "Broken pipe" not in m.log_text()
    # check of the mountpoint checks the database mounted there (it suggested copying the mount)
    checked = run("check", str(m.path))
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.splitlines() == [
        f"{m.path} is a mount of lmdb://{tmp_path}/d,b 1.lmdb: checking lmdb://{tmp_path}/d,b 1.lmdb",
        "no problems found"], checked.stderr
    refused = run("check", "--repair", str(m.path))
    assert refused.returncode == 1 and "unmount it first" in refused.stderr, refused.stderr
    assert not [name for name in doc["requests"] if name.startswith("opcode_")], doc["requests"]
    assert "getxattr" in doc["requests"]
    piped = subprocess.run(
        f"{sys.executable} -m zarrfs status {m.path} | head -1", shell=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": CHECKOUT}, timeout=60,
    )
    assert piped.stdout.startswith("mountpoint") and piped.stderr == "", piped.stderr


def daemon_of(mountpoint) -> int:
    from zarrfs.cli.main import daemon_pids

    pids = daemon_pids(str(mountpoint))
    assert len(pids) == 1, pids
    return pids[0]


def test_auto_unmount_clears_the_mountpoint_after_kill_9(tmp_path, mount_factory):
    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create", "auto_unmount"])
    pid = daemon_of(m.path)
    # pkill -9 -f zarrfs: the daemon and libfuse's watcher (whose command line names the type)
    helpers = subprocess.run(["pgrep", "-f", f"fusermount3.*{m.path}"], capture_output=True, text=True)
    os.kill(pid, 9)
    for helper in helpers.stdout.split():
        try:
            os.kill(int(helper), 9)
        except ProcessLookupError:
            pass
    until(lambda: not m.mounted(), "the dead mount detached")
    assert os.listdir(m.path) == []


def test_status_lists_a_dead_mount_as_dead(tmp_path, mount_factory):
    """And a mount on it says the daemon is gone: it said "busy (already mounted)", the
    kernel answering the mountpoint's stat from its cache."""
    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create"])
    os.stat(m.path)  # in the kernel's cache (cache_timeout 3600 under a change feed)
    os.kill(daemon_of(m.path), 9)
    until(lambda: "dead" in run("status").stdout, "status saying dead")
    res = run("mount", f"lmdb://{tmp_path}/db.lmdb", str(m.path))
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "daemon is gone" in res.stderr and f"zarrfs umount {m.path}" in res.stderr, res.stderr
    line = [ln for ln in run("status").stdout.splitlines() if ln.startswith(f"{m.path}\t")][0]
    assert "zarrfs umount" in line
    res = run("status", str(m.path))
    assert res.returncode == 1 and "is gone" in res.stderr and len(res.stderr.splitlines()) == 1
    assert run("umount", str(m.path)).returncode == 0


def test_a_log_line_about_a_name_holding_a_newline_is_one_line(tmp_path, mount_factory):
    """The names in a log line come from the kernel and the database: a newline in one made
    the line three, an escape sequence was written as it is."""
    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create", "validate=strict"])
    folder = m.path / "x\ny\x1b[31m"
    folder.mkdir()
    with pytest.raises(OSError):
        (folder / ".zarray").write_text("{not json")
    lines = [ln for ln in m.log_text().splitlines() if ".zarray" in ln]
    assert lines and all(ln.startswith("20") for ln in lines), lines  # each a line of its own
    assert any("flush /x\\ny\\x1b[31m/.zarray: EINVAL" in ln for ln in lines), lines
    assert "\x1b" not in m.log_text()


def test_systemd_notify_ready_and_stopping(tmp_path):
    import socket

    (tmp_path / "m").mkdir()
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(60)
        proc = subprocess.Popen(
            [sys.executable, "-m", "zarrfs", "mount", "-f", f"lmdb://{tmp_path}/db.lmdb", str(tmp_path / "m"),
             "-o", "create"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": CHECKOUT, "NOTIFY_SOCKET": address},
        )
        try:
            ready = sock.recv(4096).decode()
            assert "READY=1" in ready.splitlines() and os.path.ismount(tmp_path / "m"), ready
            assert run("umount", str(tmp_path / "m")).returncode == 0
            stopping = sock.recv(4096).decode()
            assert "STOPPING=1" in stopping.splitlines(), stopping
        finally:
            if proc.poll() is None and os.path.ismount(tmp_path / "m"):
                run("umount", str(tmp_path / "m"))
            proc.wait(timeout=60)
        # the background form: READY=1 names the daemon as the service's main process
        assert run("mount", f"lmdb://{tmp_path}/db.lmdb", str(tmp_path / "m"),
                   env={"NOTIFY_SOCKET": address}).returncode == 0
        try:
            ready = sock.recv(4096).decode().splitlines()
            assert "READY=1" in ready and f"MAINPID={daemon_of(tmp_path / 'm')}" in ready, ready
        finally:
            run("umount", str(tmp_path / "m"))


def hold_lmdb_writer(path):
    return subprocess.Popen(
        [sys.executable, "-c", "import lmdb, sys; e = lmdb.open(sys.argv[1], map_size=2**30); "
         "t = e.begin(write=True); print('held', flush=True); sys.stdin.read()", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def hold_sqlite_exclusive(path):
    return subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
         "c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); sys.stdin.read()", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_database_another_program_holds(tmp_path, kind):
    url = f"{kind}://{tmp_path}/db.{kind}"
    src = tmp_path / "src"
    src.mkdir()
    (src / "kept").write_bytes(b"old")
    assert run("copy", str(src), url).returncode == 0
    mnt = tmp_path / "m"
    mnt.mkdir()
    timeout = 4  # -o timeout=: a write waits this long for the lock, then is ETIMEDOUT
    holder = (hold_lmdb_writer if kind == "lmdb" else hold_sqlite_exclusive)(str(tmp_path / f"db.{kind}"))
    assert holder.stdout.readline().strip() == "held"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zarrfs", "mount", "-f", url, str(mnt), "-o", f"timeout={timeout}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    try:
        until(lambda: os.path.ismount(mnt), "mounted while the lock is held", 60)
        assert (mnt / "kept").read_bytes() == b"old"  # a read needs no write lock
        started = time.monotonic()
        with pytest.raises(OSError) as info:
            write(mnt / "new", b"blocked")
        assert info.value.errno == errno.ETIMEDOUT
        took = time.monotonic() - started
        assert took < 15 * timeout, took  # bounded by timeout=, not retried for minutes
        assert (mnt / "kept").read_bytes() == b"old"  # the mount still serves
        holder.stdin.close()
        holder.wait(timeout=30)
        write(mnt / "new", b"free")  # the lock is free: writes work again
        assert (mnt / "new").read_bytes() == b"free"
    finally:
        if holder.poll() is None:
            holder.kill()
        if os.path.ismount(mnt):
            run("umount", str(mnt))
        err = proc.communicate(timeout=60)[1]
    said = [ln for ln in err.splitlines() if "holds the database's write lock" in ln]
    assert said and "waiting up to 4 s" in said[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_reads_are_answered_while_a_write_waits_for_a_held_database(tmp_path, kind):
    """While a close waits for the write lock another program holds (up to ``-o timeout=``),
    other processes' lookups, opens, reads and closes of the mount are answered (before, they
    all waited behind it)."""
    url = f"{kind}://{tmp_path}/db.{kind}"
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "kept").write_bytes(b"old")
    (src / "d" / "other").write_bytes(b"")  # a folder of its own: a create holds its folder
    assert run("copy", str(src), url).returncode == 0
    mnt = tmp_path / "m"
    mnt.mkdir()
    assert run("mount", url, str(mnt)).returncode == 0
    holder = (hold_lmdb_writer if kind == "lmdb" else hold_sqlite_exclusive)(str(tmp_path / f"db.{kind}"))
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(mnt / "d" / "new", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"waits")  # buffered: the close commits, and waits for the lock

        closer, outcome = close_in_background(fd)
        reads = reads_while(closer, mnt / "kept", b"old")  # lookup, open, read, close
        assert reads == 20, f"{reads} reads answered while the close waited"
        holder.stdin.close()
        holder.wait(timeout=30)
        closer.join(timeout=120)
        assert outcome == ["stored"], outcome  # the lock freed: the waiting close stored the file
        assert (mnt / "d" / "new").read_bytes() == b"waits"
    finally:
        if holder.poll() is None:
            holder.kill()
        if os.path.ismount(mnt):
            run("umount", str(mnt))


def test_mount_says_at_once_that_another_program_holds_the_database(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "kept").write_bytes(b"old")
    url = f"lmdb://{tmp_path}/db.lmdb"
    assert run("copy", str(src), url).returncode == 0  # never mounted: the first mount writes
    (tmp_path / "m").mkdir()
    holder = hold_lmdb_writer(str(tmp_path / "db.lmdb"))
    try:
        assert holder.stdout.readline().strip() == "held"
        res = run("mount", url, str(tmp_path / "m"), "-o", "timeout=2")
        assert res.returncode == 0, res.stderr
        assert res.stderr.startswith("zarrfs: warning: ") and "holds the database's write lock" in res.stderr
        assert (tmp_path / "m" / "kept").read_bytes() == b"old"
    finally:
        holder.kill()
        holder.wait(timeout=30)
        if os.path.ismount(tmp_path / "m"):
            run("umount", str(tmp_path / "m"))


def test_a_warning_of_the_databases_open_is_said_once_by_the_mount_command(tmp_path):
    """The starting command opened the database itself first (its checks) and printed what
    that open warned, bare, before the daemon's own open said it again, prefixed."""
    import sqlite3

    db = tmp_path / "db.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")  # the side table as zarrfs made it for a while
    conn.execute("CREATE TABLE zarrfs_side(k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID")
    conn.close()
    (tmp_path / "m").mkdir()
    res = run("mount", f"sqlite://{db}", str(tmp_path / "m"), "-o", "create")
    try:
        assert res.returncode == 0, res.stderr
        said = [line for line in res.stderr.splitlines() if "no rowids" in line]
        assert len(said) == 1 and said[0].startswith("zarrfs: warning: "), res.stderr
    finally:
        if os.path.ismount(tmp_path / "m"):
            run("umount", str(tmp_path / "m"))


@pytest.mark.parametrize("scheme", ["redis", "postgresql", "redis+cluster"])
def test_timeout_bounds_the_open_on_a_server_that_accepts_and_never_answers(tmp_path, scheme):
    """The open's first calls waited the default 10 s (a cluster's 120 s) whatever
    ``-o timeout=`` said: it was applied once the driver was open."""
    import socket

    from zarrfs.backends.base import DEFAULT_TIMEOUT

    (tmp_path / "m").mkdir()
    with socket.socket() as closed:  # the baseline: the same command, refused at once
        closed.bind(("127.0.0.1", 0))
        url = f"{scheme}://u@127.0.0.1:{closed.getsockname()[1]}/db"
        started = time.monotonic()
        refused = run("mount", url, str(tmp_path / "m"), "-o", "timeout=1")
        baseline = time.monotonic() - started
    assert refused.returncode == 1, refused.stderr
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        # a database name for PostgreSQL, a number for Redis (redis://host/db is refused), none for a cluster
        path = "db" if scheme.startswith("postgres") else "" if "cluster" in scheme else "0"
        url = f"{scheme}://u@127.0.0.1:{silent.getsockname()[1]}/{path}"
        started = time.monotonic()
        res = run("mount", url, str(tmp_path / "m"), "-o", "timeout=1")
        took = time.monotonic() - started
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "timeout" in res.stderr.lower() and "Traceback" not in res.stderr
    # Past the baseline (the command's own start and end): the timeout's second (libpq counts
    # whole seconds, 2 at least), where it waited the default 10 s (a cluster's 120 s).
    assert took - baseline < DEFAULT_TIMEOUT / 2, (took, baseline)
    assert not os.path.ismount(tmp_path / "m")

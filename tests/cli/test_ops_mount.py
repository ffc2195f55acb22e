"""The command line around real mounts: paths resolved against the caller's folder, one-line
failures (busy umount, libfuse's own reasons), access (allow_root, allow_other,
default_permissions) checked as another user, uid/gid/umask, where the log goes and SIGHUP,
/etc/fstab and mount -t fuse.zarrfs through mount.fuse3, and zarrfs status."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mounting import make_url, needs_fuse

from zarrfs.backends import open_driver
from zarrfs.cli import mounttable
from zarrfs.cli.main import daemon_pids
from zarrfs.daemon.control import socket_path
from zarrfs.daemon.logs import default_log_file

pytestmark = needs_fuse

CHECKOUT = str(Path(__file__).resolve().parents[2])
NOBODY = 65534


def zarrfs(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=CHECKOUT, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env=full,
    )


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr
    return result


def one_line(result: subprocess.CompletedProcess, status: int, *words: str) -> str:
    assert result.returncode == status, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def mounted(path) -> bool:
    # The mount table's own reading (a space, tab or backslash in a mountpoint is escaped
    # there: compared raw, such a mount was never found, and cleanup left it mounted).
    return mounttable.mounted(str(path))


def mount_line(path) -> list[str]:
    with open("/proc/mounts") as fh:
        return next(line.split() for line in fh if line.split()[1] == str(path))


@pytest.fixture(autouse=True)
def no_logs_left_behind():
    """Remove the log files (``/var/log/zarrfs``, no syslog here) of mounts made without
    ``--log-file`` in this test."""
    folder = Path(default_log_file("/x")).parent
    before = set(folder.iterdir()) if folder.is_dir() else set()
    yield
    for path in set(folder.iterdir()) - before if folder.is_dir() else ():
        if "pytest" in path.name or "zarrfs\\x2dops" in path.name:
            path.unlink(missing_ok=True)


@pytest.fixture
def cleanup():
    """Mountpoints to unmount after the test, whatever happened."""
    points: list[Path] = []
    yield points
    for p in points:
        if mounted(p):
            if zarrfs("umount", str(p)).returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", str(p)], check=False)


@pytest.fixture
def shared_dir():
    """A folder other users can reach (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="zarrfs-ops-"))
    path.chmod(0o755)
    yield path
    for sub in path.iterdir():
        if mounted(sub):
            subprocess.run(["fusermount3", "-u", "-z", str(sub)], check=False)
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd],
        capture_output=True, text=True, timeout=60,
    )


# --- 3. paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["bare", "lmdb", "sqlite"])
def test_relative_database_and_log_paths_are_the_callers(tmp_path, cleanup, form):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "m").mkdir()
    cleanup.append(tmp_path / "m")
    name = {"bare": "rel.lmdb", "lmdb": "lmdb://rel.lmdb", "sqlite": "sqlite://rel.sqlite"}[form]
    ok(zarrfs("mount", name, "../m", "-o", "create", "--log-file", "rel.log", cwd=work))
    (tmp_path / "m/f").write_bytes(b"here")
    ok(zarrfs("umount", "../m", cwd=work))
    made = sorted(p.name for p in work.iterdir() if not p.name.endswith(".zarrfs-reserve"))
    assert made == sorted([name.rpartition("/")[2], "rel.log"]), made
    assert not os.path.exists("/rel.lmdb") and not os.path.exists("/rel.sqlite")
    assert "mounting" in (work / "rel.log").read_text()
    # again from the folder, without -o create: the database is found
    ok(zarrfs("mount", name, "../m", cwd=work))
    assert (tmp_path / "m/f").read_bytes() == b"here"
    ok(zarrfs("umount", str(tmp_path / "m")))


# --- 7. messages ------------------------------------------------------------------------------


def test_umount_of_a_busy_mount_names_z(tmp_path, cleanup):
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    ok(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(m), "-o", "create"))
    fh = open(m / "open-file", "wb")
    try:
        one_line(zarrfs("umount", str(m)), 1, "busy", "-z")
        assert mounted(m)
    finally:
        fh.close()
    ok(zarrfs("umount", str(m)))
    one_line(zarrfs("umount", str(m)), 1, "is not mounted")


@pytest.mark.parametrize(
    "options, said",
    [("max_read=abc", "invalid parameter in option `max_read=abc'"),
     ("auto_unmount,context=foo", "unknown option 'context=foo'")],  # the second from fusermount3
)
def test_a_refused_mount_gives_libfuses_own_reason(tmp_path, options, said):
    (tmp_path / "m").mkdir()
    line = one_line(zarrfs("mount", "memory://x", str(tmp_path / "m"), "-o", options), 1, said)
    assert "could not mount" not in line and not mounted(tmp_path / "m")


@pytest.mark.parametrize(
    "option", ["entry_timeout=inf", "attr_timeout=nan", "negative_timeout=-inf", "spin=inf"]
)
def test_a_time_that_is_no_number_is_refused_and_nothing_is_mounted(tmp_path, option):
    """``inf`` and ``nan`` parse as floats: they were taken, and the daemon then failed on its
    first reply's arithmetic with the mount made (a dead mount left behind)."""
    (tmp_path / "m").mkdir()
    one_line(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(tmp_path / "m"), "-o", f"create,{option}"), 2,
             "takes a finite number", option.split("=")[0])
    assert not mounted(tmp_path / "m")


def test_cache_times_longer_than_the_kernel_takes_are_its_longest(tmp_path, cleanup):
    """A time past what the kernel's 64-bit seconds hold (1e300) was packed as it was: every
    lookup of a missing name failed with EIO."""
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    times = "entry_timeout=1e300,attr_timeout=1e300,negative_timeout=1e300"
    ok(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(m), "-o", f"create,{times}"))
    assert not os.path.exists(m / "missing")
    (m / "f").write_bytes(b"x")
    assert (m / "f").read_bytes() == b"x" and os.stat(m / "f").st_size == 1
    ok(zarrfs("umount", str(m)))


def test_a_daemon_failing_after_its_mount_was_made_unmounts_it(tmp_path):
    """Between the mount and the request loop (the session, the change feed, the threads) a
    failure ended the daemon with the mount made: a dead mount ("Transport endpoint is not
    connected") until someone unmounted it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "if '--ready-fd' in sys.argv:\n"
        "    import zarrfs.fuse.session as session\n"
        "    def refuse(*args, **kwargs):\n"
        "        raise RuntimeError('made to fail after the mount')\n"
        "    session.Session.__init__ = refuse\n"
    )
    (tmp_path / "m").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([CHECKOUT, str(site)])}
    db, where = f"lmdb://{tmp_path}/db.lmdb", str(tmp_path / "m")
    args = [sys.executable, "-m", "zarrfs", "mount", db, where, "-o", "create"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0 and "made to fail after the mount" in result.stderr, result.stderr
    assert not mounted(tmp_path / "m")


def test_umount_z_returns_at_once_and_a_wait_says_what_it_waits_for(tmp_path, cleanup):
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    url = f"lmdb://{tmp_path}/db.lmdb"
    ok(zarrfs("mount", url, str(m), "-o", "create"))
    started = time.monotonic()
    ok(zarrfs("umount", str(m)))  # the baseline: an idle mount, its daemon waited for
    baseline = time.monotonic() - started
    ok(zarrfs("mount", url, str(m)))
    (pid,) = daemon_pids(str(m))
    fh = open(m / "f", "wb")
    try:
        fh.write(b"kept")
        fh.flush()
        started = time.monotonic()
        lazy = ok(zarrfs("umount", "-z", str(m)))
        took = time.monotonic() - started
        assert lazy.stderr == "" and not mounted(m)
        assert daemon_pids(str(m)) == [pid]  # it still serves the open file
        assert took < 5 * baseline, (took, baseline)  # it waited 30 s for the daemon
    finally:
        fh.close()
    deadline = time.monotonic() + 60
    while daemon_pids(str(m)):
        assert time.monotonic() < deadline, "the daemon did not end once its file was closed"
        time.sleep(0.05)
    ok(zarrfs("mount", url, str(m)))
    assert (m / "f").read_bytes() == b"kept"
    # a daemon that does not end at once: the umount says whom it waits for, then returns
    (pid,) = daemon_pids(str(m))
    os.kill(pid, signal.SIGSTOP)
    try:
        full = dict(os.environ, PYTHONPATH=CHECKOUT)
        waiting = subprocess.Popen([sys.executable, "-m", "zarrfs", "umount", str(m)], env=full,
                                   stderr=subprocess.PIPE, text=True)
        line = waiting.stderr.readline()
        assert f"unmounted {m}; waiting for its daemon (pid {pid})" in line, line
        assert waiting.poll() is None
    finally:
        os.kill(pid, signal.SIGCONT)
    assert waiting.wait(timeout=60) == 0 and waiting.stderr.read() == ""
    assert not daemon_pids(str(m))


# --- 2. and 8. access, owner and permission bits --------------------------------------------


def _mount(url: str, where: Path, *options: str) -> None:
    where.mkdir(exist_ok=True)
    where.chmod(0o755)
    args = ["mount", url, str(where)] + [x for o in options for x in ("-o", o)]
    ok(zarrfs(*args))


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_access_of_another_user(shared_dir, request, kind, tmp_path):
    url = make_url(kind, shared_dir, request)
    with open_driver(url) as driver:
        driver.put("data", b"payload")  # a key without recorded owner or mode
    m = shared_dir / "m"
    # no option: only the owner (root) gets in; the kernel turns the others away
    _mount(url, m)
    try:
        assert (m / "data").read_bytes() == b"payload"
        res = as_nobody("cat", str(m / "data"))
        assert res.returncode != 0 and "Permission denied" in res.stderr
    finally:
        ok(zarrfs("umount", str(m)))
    # allow_root: root and the owner; the daemon refuses everyone else
    _mount(url, m, "allow_root")
    try:
        opts = mount_line(m)[3].split(",")
        assert "allow_other" in opts and "default_permissions" in opts
        assert (m / "data").read_bytes() == b"payload"
        res = as_nobody("cat", str(m / "data"))
        assert res.returncode != 0 and "Permission denied" in res.stderr
        res = as_nobody("ls", str(m))
        assert res.returncode != 0 and "Permission denied" in res.stderr
    finally:
        ok(zarrfs("umount", str(m)))
    # allow_other: everyone, with the kernel checking permissions (files are root's, 0644)
    _mount(url, m, "allow_other")
    try:
        assert "default_permissions" in mount_line(m)[3].split(",")
        assert as_nobody("cat", str(m / "data")).stdout == "payload"
        res = as_nobody("sh", "-c", f"echo x > {m}/data")
        assert res.returncode != 0 and "Permission denied" in res.stderr
        assert (m / "data").read_bytes() == b"payload"
    finally:
        ok(zarrfs("umount", str(m)))
    # allow_other,no_default_permissions: no checks by the kernel
    _mount(url, m, "allow_other,no_default_permissions")
    try:
        assert "default_permissions" not in mount_line(m)[3].split(",")
        assert as_nobody("sh", "-c", f"echo x > {m}/data").returncode == 0
        assert (m / "data").read_bytes() == b"x\n"
    finally:
        ok(zarrfs("umount", str(m)))
    # uid/gid/umask: the owner and bits shown for nodes with none recorded
    with open_driver(url) as driver:
        driver.put("grp/fresh", b"new")  # written beside the mount: nothing recorded
    _mount(url, m, f"uid={NOBODY},gid={NOBODY},umask=027", "allow_other")
    try:
        for path, mode in ((m / "grp/fresh", 0o640), (m / "grp", 0o750), (m, 0o750)):
            st = os.stat(path)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, mode), path
        assert os.stat(m / "data").st_uid == 0  # written through the mount by root: recorded
        assert as_nobody("sh", "-c", f"echo mine > {m}/grp/fresh").returncode == 0  # nobody owns it now
        assert (m / "grp/fresh").read_bytes() == b"mine\n"
    finally:
        ok(zarrfs("umount", str(m)))


def as_a_user(home: Path, *args: str) -> subprocess.CompletedProcess:
    """``zarrfs ARGS`` run as uid 65534 as a user's own mount would be: its daemon runs as that
    user and the mount table names them (``user_id=``). The process keeps two capabilities:
    DAC_OVERRIDE, since this machine's Python lives in root's home and its /dev/fuse may be
    root's only (fusermount3 opens it as the user), and SYS_ADMIN, so libfuse mounts directly."""
    caps = "+dac_override,+sys_admin"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": CHECKOUT, "HOME": str(home)}
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", f"--inh-caps={caps}",
         f"--ambient-caps={caps}", sys.executable, "-m", "zarrfs", *args],
        capture_output=True, text=True, timeout=120, env=env, cwd=str(home),
    )


def test_root_sees_and_queries_a_users_mount_and_umount_a_takes_only_the_users(shared_dir, tmp_path, cleanup):
    theirs, mine = shared_dir / "m", tmp_path / "mine"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    mine.mkdir()
    cleanup.extend([theirs, mine])
    url = f"sqlite://{shared_dir}/db.sqlite"
    res = as_a_user(shared_dir, "mount", url, str(theirs), "-o", "create", "--log-file", f"{shared_dir}/log")
    assert res.returncode == 0, res.stderr
    assert f"user_id={NOBODY}" in mount_line(theirs)[3]
    ok(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(mine), "-o", "create"))
    listed = ok(zarrfs("status")).stdout.splitlines()
    assert f"{theirs}\t{url}\trw\tuser nobody" in listed, listed
    assert f"{mine}\tlmdb://{tmp_path}/db.lmdb\trw" in listed, listed
    doc = json.loads(ok(zarrfs("status", str(theirs), "--json")).stdout)
    assert doc["mountpoint"] == str(theirs) and doc["url"] == url
    assert doc["pid"] == daemon_pids(str(theirs))[0]
    res = as_a_user(shared_dir, "umount", "-a")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert not mounted(theirs) and not daemon_pids(str(theirs))
    assert mounted(mine)
    ok(zarrfs("umount", str(mine)))


# --- 4. logs ----------------------------------------------------------------------------------


def test_background_log_without_syslog_goes_to_the_documented_file(tmp_path, cleanup):
    assert not os.path.exists("/dev/log")  # this machine has no syslog
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    log = Path(default_log_file(str(m)))
    assert log.parent == Path("/var/log/zarrfs")  # root's
    log.unlink(missing_ok=True)
    ok(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(m), "-o", "create"))
    try:
        assert f"mounting lmdb://{tmp_path}/db.lmdb at {m}" in log.read_text()
    finally:
        ok(zarrfs("umount", str(m)))
    assert f"unmounted {m}" in log.read_text()
    log.unlink()


def test_sighup_reopens_the_log_file_and_keeps_the_mount(tmp_path, cleanup):
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    log = tmp_path / "zarrfs.log"
    ok(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(m), "-o", "create", "--log-file", str(log)))
    (pid,) = daemon_pids(str(m))
    log.rename(tmp_path / "zarrfs.log.1")  # as logrotate does
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 60
    while not log.exists():
        assert time.monotonic() < deadline, "the log was not reopened"
        time.sleep(0.05)
    assert mounted(m) and daemon_pids(str(m)) == [pid]
    (m / "f").write_bytes(b"1")
    ok(zarrfs("umount", str(m)))
    text = log.read_text()
    assert "reopened" in text and f"unmounted {m}" in text
    assert "unmounted" not in (tmp_path / "zarrfs.log.1").read_text()


# --- 5. /etc/fstab and mount -t fuse.zarrfs -------------------------------------------------


@pytest.fixture
def zarrfs_on_path(tmp_path):
    """A folder with a ``zarrfs`` command that runs this checkout, as an installed script would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "zarrfs"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={CHECKOUT} exec {sys.executable} -m zarrfs "$@"\n')
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_fstab_and_mount_t_through_mount_fuse3(tmp_path, request, zarrfs_on_path, kind):
    """mount(8) runs its helpers with the standard PATH only, so the test runs in a mount
    namespace of its own where the wrapper folder is bound over /usr/local/sbin (nothing on
    the machine changes); mount.fuse3 then runs ``zarrfs URL MOUNTPOINT -o OPTS``."""
    url = make_url(kind, tmp_path, request)
    m = tmp_path / "m"
    m.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    fstab = tmp_path / "fstab"
    options = "defaults,_netdev,noauto,nofail,user,ro,x-systemd.automount"
    fstab.write_text(f"# a test fstab\n{url} {m} fuse.zarrfs {options} 0 0\n")
    script = f"""
set -e
mount --bind {zarrfs_on_path} /usr/local/sbin
mount -t fuse.zarrfs '{url}' {m} -o create,rw,dev,suid,_netdev,defaults
grep ' {m} ' /proc/self/mounts > {out}/first
echo via-mount-t > {m}/f
umount {m}
while pgrep -f '[-]m zarrfs mount .* {m} ' > /dev/null; do sleep 0.05; done
mount --fstab {fstab} {m}
grep ' {m} ' /proc/self/mounts > {out}/second
cat {m}/f > {out}/read
umount {m}
while pgrep -f '[-]m zarrfs mount .* {m} ' > /dev/null; do sleep 0.05; done
echo done > {out}/done
"""
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    first = (out / "first").read_text().split()
    assert first[0] == url and first[2] == "fuse.zarrfs"
    assert "nosuid" in first[3] and "nodev" in first[3] and first[3].startswith("rw,")
    second = (out / "second").read_text().split()
    assert second[0] == url and second[3].startswith("ro,")
    assert (out / "read").read_text() == "via-mount-t\n"
    assert (out / "done").exists() and not daemon_pids(str(m))


# --- 9. status --------------------------------------------------------------------------------


def test_a_folder_in_tmp_not_named_by_a_uid_is_passed_over_by_roots_look_for_a_socket():
    """Root looks through every user's ``/tmp/zarrfs-UID`` for the status socket of a mount not
    its own; anyone may make ``/tmp/zarrfs-²1`` (digits to ``str.isdigit``, not to ``int``),
    which is passed over, not a traceback."""
    from zarrfs.daemon import control

    odd = f"/tmp/zarrfs-\u00b2{os.getpid()}"
    os.mkdir(odd)
    try:
        assert odd not in control._users_folders()
        nowhere = "/nowhere/mounted/here"
        assert control.socket_path(nowhere) == control.own_socket_path(nowhere)
    finally:
        os.rmdir(odd)


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_status_lists_mounts_and_shows_live_figures(tmp_path, request, cleanup, kind):
    url = make_url(kind, tmp_path, request)
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    ok(zarrfs("mount", url, str(m), "-o", "create"))
    listed = ok(zarrfs("status")).stdout.splitlines()
    assert f"{m}\t{url}\trw" in listed
    sock = socket_path(str(m))
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
    (m / "a").write_bytes(b"x" * 100_000)
    for _ in range(40):
        os.path.exists(m / "missing")
    held = open(m / "a", "rb")
    try:
        doc = json.loads(ok(zarrfs("status", str(m), "--json")).stdout)
        assert doc["url"] == url and doc["mountpoint"] == str(m) and doc["open_files"] == 1
        assert doc["pid"] == daemon_pids(str(m))[0]
        db = doc["database"]
        assert (db["bytes"] >= 100_000) if kind != "redis" else (db["keys"] >= 1)
        assert doc["folder_snapshots"]["lifetime"] == 1
        if doc["requests"] is not None:  # a session that counts (Session.stats)
            assert doc["requests"], doc
        txns = doc["transactions"]
        assert txns["write"] >= 1 and txns["read"] >= 1, txns  # the file written, then looked up
        text = ok(zarrfs("status", str(m))).stdout
        assert f"mountpoint  {m}" in text and "open files  1" in text and url in text
        assert re.search(r"^txns +\d+ reading, \d+ writing", text, re.M), text
    finally:
        held.close()
    ok(zarrfs("umount", str(m)))
    assert not os.path.exists(sock)
    one_line(zarrfs("status", str(m)), 1, "not a zarrfs mount")


def test_status_writes_a_tab_or_newline_in_a_mountpoint_as_the_mount_table_does(tmp_path, mount_factory):
    # A line of "zarrfs status" is tab-separated: a mountpoint holding a tab read as two fields.
    url = f"lmdb://{tmp_path}/db.lmdb"
    m = mount_factory(url, ["create"], name="a\tb c\\d\x1be").path
    escaped = str(m).replace("\\", "\\134").replace("\t", "\\011").replace("\x1b", "\\x1b")
    lines = [ln.split("\t") for ln in ok(zarrfs("status")).stdout.splitlines()]
    assert [escaped, url, "rw"] in lines, lines
    rows = ok(zarrfs("status", str(m))).stdout.splitlines()
    row = f"mountpoint  {m}".replace("\t", "\\t").replace("\x1b", "\\x1b")
    assert row in rows, rows  # its row, the tab and the escape escaped


def test_stats_rows_follow_the_work_and_prometheus_text_parses(tmp_path, mount_factory):
    from prometheus_client.parser import text_string_to_metric_families

    m = mount_factory(f"lmdb://{tmp_path}/db.lmdb", ["create"])
    full = dict(os.environ, PYTHONPATH=CHECKOUT)
    live = subprocess.Popen([sys.executable, "-m", "zarrfs", "stats", str(m.path), "-i", "0.2"], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        titles, names = live.stdout.readline().split(), live.stdout.readline().split()
        assert titles[0].strip("-") == "requests/s" and names[:3] == ["lookup", "attr", "list"], names
        columns = {f"{group}.{name}": i for i, (group, name) in enumerate(
            (g, n) for g, ns in (("req", names[:7]), ("ms", ["all"]), ("mib", ["read", "write"]),
                                 ("txn", ["read", "write"]), ("hits", ["s"]), ("err", ["s"])) for n in ns)}
        data = os.urandom(1 << 20)
        (m.path / "f").write_bytes(data)
        for n in range(50):
            os.path.exists(m.path / f"missing{n}")
        fd = os.open(m.path / "f", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read goes to the daemon
        assert os.read(fd, 1 << 20) == data
        os.close(fd)
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while not all(seen.get(c, 0) > 0 for c in ("req.lookup", "req.write", "mib.write", "mib.read",
                                                   "txn.write", "ms.all")):
            assert time.monotonic() < deadline, seen
            cells = live.stdout.readline().split()
            for name, i in columns.items():
                x = cells[i]
                scale = {"K": 1e3, "M": 1e6}.get(x[-1], 1)
                seen[name] = max(seen.get(name, 0), float(x.rstrip("KM")) * scale)
    finally:
        live.send_signal(signal.SIGINT)
        assert live.wait(timeout=60) == 0 and live.stderr.read() == ""
    text = ok(zarrfs("stats", "--prometheus", str(m.path))).stdout
    found = {(s.name, s.labels.get("op") or s.labels.get("kind")): s
             for family in text_string_to_metric_families(text) for s in family.samples}
    assert found[("zarrfs_up", None)].value == 1
    assert found[("zarrfs_written_bytes_total", None)].value == len(data)
    assert found[("zarrfs_read_bytes_total", None)].value >= len(data)
    assert found[("zarrfs_requests_total", "write")].value >= 1
    assert found[("zarrfs_request_seconds_total", "write")].value > 0
    assert found[("zarrfs_transactions_total", "write")].value >= 1
    assert found[("zarrfs_mount_info", None)].labels["url"] == f"lmdb://{tmp_path}/db.lmdb"
    every = ok(zarrfs("stats", "--prometheus")).stdout  # every mount: this one among them
    assert f'zarrfs_up{{mountpoint="{m.path}"}} 1' in every
    list(text_string_to_metric_families(every))
    one_line(zarrfs("stats", str(tmp_path)), 1, "not a zarrfs mount")
    one_line(zarrfs("stats"), 2, "--prometheus")
    one_line(zarrfs("stats", str(m.path), "-n", "0"), 2, "--count")


@pytest.mark.parametrize("kind", ["lmdb", "dbm", "redis", "postgres"])  # SQLite's: as DBM's
def test_df_shows_the_databases_capacity_and_use(tmp_path, request, mount_factory, kind):
    """statfs: an LMDB map smaller than the disk is the size; DBM (SQLite, zip) the disk its files are on;
    Redis maxmemory and used_memory; PostgreSQL the disk of its data directory (a server on
    this machine, asked by a superuser)."""
    url = f"dbm://{tmp_path}/db" if kind == "dbm" else make_url(kind, tmp_path, request)
    if kind == "lmdb":
        url += "?map_size=64M"
    restore = None
    if kind == "redis":
        client = request.getfixturevalue("redis_server").client()
        restore = client.config_get("maxmemory")["maxmemory"]
        client.config_set("maxmemory", str(1 << 30))
    try:
        m = mount_factory(url, ["create"])
        (m.path / "f").write_bytes(os.urandom(1 << 20))
        st = os.statvfs(m.path)
        size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        if kind == "lmdb":
            assert size == 64 << 20 and size - free >= 1 << 20, (size, free)
        elif kind == "dbm":
            disk = os.statvfs(tmp_path)
            assert abs(size - disk.f_blocks * disk.f_frsize) < 1 << 20
        elif kind == "redis":
            used = client.info("memory")["used_memory"]
            assert size == 1 << 30 and abs((size - free) - used) < 1 << 20, (size, free, used)
        else:
            disk = os.statvfs(request.getfixturevalue("postgres_server").datadir)
            assert abs(size - disk.f_blocks * disk.f_frsize) < 1 << 20
            assert abs(free - disk.f_bavail * disk.f_frsize) < 64 << 20
        df = subprocess.run(["df", "-B1", "--output=size,used", str(m.path)], capture_output=True, text=True)
        assert df.returncode == 0 and int(df.stdout.split()[2]) == size, df.stdout
        assert abs(int(df.stdout.split()[3]) - (size - free)) < 1 << 20, df.stdout
    finally:
        if restore is not None:
            client.config_set("maxmemory", restore)


def test_the_systemd_unit_verifies_and_its_command_mounts_with_notify(tmp_path, zarrfs_on_path):
    """scripts/install_unit.sh (what setup.sh runs) installs zarrfs@.service; systemd-analyze
    verify loads an instance of it from that folder and prints it with its specifiers resolved
    (%i, %f, %E); its ExecStart, with the variables of an instance's .conf file, is then run as
    systemd would (NOTIFY_SOCKET set): READY=1 once mounted, and a stop (SIGTERM) unmounts
    with STOPPING=1, the written file stored."""
    import shlex
    import socket

    if shutil.which("systemd-analyze") is None or shutil.which("systemd-escape") is None:
        from mounting import unavailable

        unavailable("systemd-analyze is not installed (apt-get install systemd)")
    units = tmp_path / "units"
    install = [f"{CHECKOUT}/scripts/install_unit.sh", str(zarrfs_on_path / "zarrfs"), str(units)]
    res = subprocess.run(["bash", *install], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    m = tmp_path / "m"
    m.mkdir()
    escape = subprocess.run(["systemd-escape", "--path", str(m)], capture_output=True, text=True)
    instance = escape.stdout.strip()
    verify = subprocess.run(
        ["systemd-analyze", "verify", f"zarrfs@{instance}.service"], capture_output=True, text=True,
        env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{units}:", SYSTEMD_LOG_LEVEL="debug"),
    )
    assert verify.returncode == 0, verify.stderr[-3000:]
    said = [line.strip() for line in (verify.stdout + verify.stderr).splitlines()]  # the dump: stdout
    assert "Type: notify" in said and f"EnvironmentFile: /etc/zarrfs/{instance}.conf" in said, said
    start, stop_post = [shlex.split(line.split(": ", 1)[1].replace("\\$", "$"))
                        for line in said if line.startswith("Command Line: ")]
    conf = {"URL": f"lmdb://{tmp_path}/db.lmdb", "OPTIONS": "create", "LOG_LEVEL": "info"}
    argv = [conf.get(word[2:-1], word) if word.startswith("${") else word for word in start]
    assert argv[0] == str(zarrfs_on_path / "zarrfs") and str(m) in argv, argv
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(60)
        proc = subprocess.Popen(argv, env=dict(os.environ, NOTIFY_SOCKET=address),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert "READY=1" in sock.recv(4096).decode().splitlines(), argv
            assert mounted(m)
            (m / "f").write_bytes(b"served")
            proc.terminate()  # systemctl stop
            assert "STOPPING=1" in sock.recv(4096).decode().splitlines()
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
            if mounted(m):
                subprocess.run(["fusermount3", "-u", "-z", str(m)], check=False)
    assert not mounted(m)
    subprocess.run(stop_post, capture_output=True, timeout=60)  # "-": its status is ignored
    with open_driver(conf["URL"], readonly=True) as driver:
        assert bytes(driver.get("f")) == b"served"


def test_status_of_a_stopped_daemon_without_its_socket_returns(tmp_path, cleanup):
    """``zarrfs status`` lists a mount whose daemon is stopped and whose socket is gone (a
    runtime folder cleaned): the statfs it falls back on is bounded, it does not hang."""
    m = tmp_path / "m"
    m.mkdir()
    cleanup.append(m)
    ok(zarrfs("mount", f"lmdb://{tmp_path}/db.lmdb", str(m), "-o", "create"))
    (pid,) = daemon_pids(str(m))
    sock = socket_path(str(m))
    os.rename(sock, sock + ".away")
    os.kill(pid, signal.SIGSTOP)
    try:
        listed = ok(zarrfs("status")).stdout.splitlines()
        assert f"{m}\tlmdb://{tmp_path}/db.lmdb\trw" in listed, listed
    finally:
        os.kill(pid, signal.SIGCONT)
        os.rename(sock + ".away", sock)
    ok(zarrfs("umount", str(m)))

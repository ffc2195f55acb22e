"""Real mounts for tests: the ``zarrfs`` command line started as a user would, torn down with
``zarrfs umount`` (and ``fusermount3 -u -z`` if a test left the mount busy).

Fixtures here are imported by ``conftest.py``. Mount tests carry the ``mount`` marker and are
skipped, with the reason, on a machine without a usable ``/dev/fuse``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest


def fuse_missing() -> str | None:
    """Why FUSE mounts cannot run here, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "fusermount3 is not installed (apt-get install fuse3)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened: {exc}"
    return None


_MISSING = fuse_missing()


def in_ci() -> bool:
    """Whether this is a CI run (``.ci/run`` sets ``CI=true``), where nothing a test needs may
    be missing."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip the test with ``reason`` where the machine lacks what it needs (a mount, root, a
    server); in CI fail instead, since a skipped mount or server test tests nothing."""
    if in_ci():
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def fuse_required() -> None:
    """Skip, with the reason, where FUSE cannot run; fail in CI (:func:`unavailable`)."""
    if _MISSING is not None:
        unavailable(f"no FUSE: {_MISSING}")


needs_fuse = [pytest.mark.mount, pytest.mark.usefixtures("fuse_required")]


def zarrfs(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``zarrfs`` command line of this checkout."""
    result = subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"zarrfs {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


class Mount:
    """A database mounted at a fresh folder; ``path`` is the mountpoint."""

    def __init__(
        self, url: str, where: Path, options: list[str] | None = None, log_level: str = "debug"
    ) -> None:
        self.url = url
        self.log_level = log_level
        self.path = where
        self.options = list(options or [])
        self.log = where.parent / f"{where.name}.log"

    def start(self) -> Mount:
        """Mount and return only when the mount is ready."""
        self.path.mkdir(parents=True, exist_ok=True)
        args = ["mount", self.url, str(self.path), "--log-file", str(self.log), "--log-level", self.log_level]
        for opt in self.options:
            args += ["-o", opt]
        try:
            zarrfs(*args)
        except AssertionError as exc:  # the daemon's own account, kept in the test's report
            raise AssertionError(f"{exc}\n--- the end of {self.log} ---\n{self.log_text()[-4000:]}") from None
        assert os.path.ismount(self.path), f"{self.path} is not a mountpoint after zarrfs mount"
        return self

    def mounted(self) -> bool:
        """Whether the kernel lists the mount (``os.path.ismount`` is False while its root
        cannot be stat'ed, such as when the database is down), as the mount table reads
        (which escapes a space, tab or backslash in a mountpoint)."""
        from zarrfs.cli.mounttable import mounted

        return mounted(str(self.path))

    def stop(self) -> None:
        """Unmount; a mount that a failed test left busy is detached lazily."""
        if not self.mounted():
            return
        if zarrfs("umount", str(self.path), check=False).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False)

    def log_text(self) -> str:
        """What the daemon logged so far."""
        return self.log.read_text() if self.log.exists() else ""

    def assert_clean_log(self) -> None:
        """Fail when the daemon logged a traceback or an unexpected error."""
        text = self.log_text()
        assert "Traceback" not in text, text[-4000:]
        assert " CRITICAL " not in text, text[-4000:]

    def __enter__(self) -> Mount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- what tests do through a mount, and what the database holds behind it --------------------


def write(path, data: bytes) -> None:
    """Create or truncate the file at ``path`` and write ``data`` (one open, one close)."""
    with open(path, "wb") as fh:
        fh.write(data)


def read(path) -> bytes:
    """The whole content of the file at ``path``."""
    with open(path, "rb") as fh:
        return fh.read()


def stored(url: str, key: str) -> bytes | None:
    """The value the database holds at ``key``, read in-process with a read-only driver
    (behind the mount and the kernel's caches)."""
    from zarrfs.backends import open_driver

    with open_driver(url, readonly=True) as driver:
        value = driver.get(key)
    return None if value is None else bytes(value)


# Every mount test runs on every driver, the Redis Cluster (three masters, started once per
# session) included; ZARRFS_TEST_DRIVERS=lmdb,sqlite narrows a local run.
DRIVERS = ["lmdb", "sqlite", "redis", "postgres", "cluster"]
if os.environ.get("ZARRFS_TEST_DRIVERS"):
    DRIVERS = [d for d in DRIVERS if d in os.environ["ZARRFS_TEST_DRIVERS"].split(",")]


def make_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database of one kind for one test."""
    if kind == "lmdb":
        return f"lmdb://{tmp_path}/db.lmdb"
    if kind == "sqlite":
        return f"sqlite://{tmp_path}/db.sqlite"
    if kind == "redis":
        base = request.getfixturevalue("redis_url")
        sep = "&" if "?" in base else "?"
        return f"{base}{sep}prefix=t{uuid.uuid4().hex[:12]}"
    if kind == "postgres":
        return request.getfixturevalue("postgres_server").url(table=f"t{uuid.uuid4().hex[:12]}")
    if kind == "cluster":
        return request.getfixturevalue("redis_cluster").url(prefix=f"t{uuid.uuid4().hex[:12]}")
    if kind == "spread":  # one hierarchy's chunks over every master (?spread=1)
        return request.getfixturevalue("redis_cluster").url(prefix=f"t{uuid.uuid4().hex[:12]}", spread="1")
    raise ValueError(kind)


@pytest.fixture(params=DRIVERS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL, once per driver."""
    return make_url(request.param, tmp_path, request)


@pytest.fixture(params=["lmdb", "sqlite", "redis"])
def zarr2_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL of each driver that zarr-python 2 has a store class for."""
    return make_url(request.param, tmp_path, request)


@pytest.fixture
def mount_factory(tmp_path: Path):
    """Start mounts (``mount_factory(url, options)``) that are all unmounted after the test."""
    mounts: list[Mount] = []

    def start(url: str, options: list[str] | None = None, name: str | None = None) -> Mount:
        m = Mount(url, tmp_path / (name or f"mnt{len(mounts)}"), options)
        mounts.append(m)
        return m.start()

    yield start
    for m in mounts:
        m.stop()
    for m in mounts:
        m.assert_clean_log()


@pytest.fixture
def mounted(db_url: str, mount_factory) -> Mount:
    """A fresh database of each driver, mounted (created on first mount)."""
    return mount_factory(db_url, ["create"])


def drained(driver, cursor, want, deadline: float = 60.0):
    """Look at ``driver``'s feed until it holds ``want`` records (or None); what it got (what it
    had at the deadline, a generous one: a bound on a lost record, never on speed)."""
    got: list = []
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        cursor, records = driver.changes(cursor)
        if records is None:
            return None
        got += records
        if len(got) >= want:
            return got
        time.sleep(0.001)
    return got


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User and system CPU seconds process ``pid`` (every thread), or its thread ``tid`` alone,
    used so far."""
    where = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    with open(where) as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemon_cpu(m: Mount) -> float:
    """CPU seconds the daemon of mount ``m`` used so far. A step's cost is this figure's growth,
    compared with a baseline step's in the same test: a busy machine makes a step slower, not
    costlier."""
    from zarrfs.daemon.control import query

    return cpu_seconds(query(str(m.path))["pid"])


class Spinner:
    """A process that only spins, from now until :meth:`stop`: the CPU it got meanwhile
    (:meth:`used`) is what a loop that never sleeps gets of this machine now, the baseline a
    loop that should sleep is held to (a busy machine gives both less)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        self.start = cpu_seconds(self.proc.pid)

    def used(self) -> float:
        return cpu_seconds(self.proc.pid) - self.start

    def stop(self) -> float:
        """Stop spinning; what :meth:`used` was then."""
        used = self.used()
        self.proc.kill()
        self.proc.wait()
        return used


def eventually(condition, what: str, deadline: float = 60.0) -> None:
    """Wait until ``condition()`` holds; fail after ``deadline`` seconds (generous: a bound on a
    stuck mount, never on speed, so that a busy machine does not fail the test)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < deadline, f"{what}: not after {deadline:.0f} s"
        time.sleep(0.01)


def close_in_background(fd: int) -> tuple[threading.Thread, list]:
    """Close ``fd`` in a thread of its own, started (a close that commits may take long), and
    the list the close's outcome goes to: ``"stored"`` or its errno."""
    outcome: list = []

    def close() -> None:
        try:
            os.close(fd)
            outcome.append("stored")
        except OSError as exc:
            outcome.append(exc.errno)

    closer = threading.Thread(target=close)
    closer.start()
    return closer, outcome


def reads_while(busy: threading.Thread, path: Path, expected: bytes, most: int = 20) -> int:
    """Open, read (``expected`` must be there) and close ``path`` until ``busy`` ends, up to
    ``most`` times: how many were answered while it ran (none of them writes)."""
    reads = 0
    while busy.is_alive() and reads < most:
        with open(path, "rb") as fh:
            assert fh.read() == expected
        if busy.is_alive():
            reads += 1
    return reads

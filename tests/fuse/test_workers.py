"""Requests served concurrently (``zarrfs.fuse.workers``), seen through a delaying proxy of
the server (``zarrfs.testing.proxy.DelayProxy``, 20 ms round trips) on Redis and PostgreSQL:

* readers of different files overlap their round trips (the proxy counts the connections that
  wait at once); with ``-o workers=1`` they never do, which shows the count can fail;
* a request whose server never answers holds up neither a read of another file nor a write
  in another folder (a create in the same folder waits in the kernel: a lookup holds the
  folder's lock shared, a create wants it whole);
* an interrupt ends only its own request: another request stalled beside it keeps waiting and
  is answered once the server answers.

A stalled reader that a writer made stale runs again only once its server answered (a Redis
link's call, a PostgreSQL exchange): run again while stalled, it would stall again and, after
``RESTARTS``, run alone, holding the whole mount up to ``-o timeout=``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest
from mounting import read, unavailable, write

from zarrfs.testing.proxy import DelayProxy

pytestmark = [pytest.mark.mount, pytest.mark.usefixtures("fuse_required")]

DRIVERS = ["redis", "postgres"]


@pytest.fixture
def proxy():
    with DelayProxy(rtt_ms=20) as p:
        yield p


@pytest.fixture
def urls(request, proxy, tmp_path):
    """The database's URL, and the same through the proxy."""
    name = f"w{os.getpid()}_{abs(hash(request.node.name)) % 10**6}"
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        via = proxy.route(server.port)
        return server.url(0, prefix=name), f"redis://127.0.0.1:{via}/0?prefix={name}"
    server = request.getfixturevalue("postgres_server")
    via = proxy.route(server.port)
    direct = server.url(table=name)
    return direct, direct.replace(f":{server.port}/", f":{via}/")


def _fill(mount_factory, url: str, names: list[str], size: int = 4096) -> dict[str, bytes]:
    values = {n: os.urandom(size) for n in names}
    m = mount_factory(url, ["create"])
    (m.path / "a").mkdir()
    for n, v in values.items():
        write(m.path / "a" / n, v)
    m.stop()
    return values


def _at_once(paths, each) -> None:
    """``each(path)`` for every path, each in a thread of its own, started together; what
    failed is reported."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(paths))

    def one(path) -> None:
        try:
            start.wait(60)
            each(path)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def _read_all(paths, values) -> None:
    def check(path) -> None:
        assert read(path) == values[path.name]

    _at_once(paths, check)


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
@pytest.mark.parametrize("workers", ["1", "16"])
def test_readers_of_different_files_overlap_their_round_trips(urls, workers, proxy, mount_factory):
    direct, proxied = urls
    names = [f"0.{i}" for i in range(16)]
    values = _fill(mount_factory, direct, names)
    m = mount_factory(proxied, [f"workers={workers}"])
    os.stat(m.path / "a")
    proxy.reset()
    _read_all([m.path / "a" / n for n in names], values)
    if workers == "1":
        assert proxy.overlap() == 1
    else:
        assert proxy.overlap() >= 4, proxy.overlap()


_STAT = """
import os, signal, sys
def ring(*_):
    raise InterruptedError
signal.signal(signal.SIGALRM, ring)
if float(sys.argv[2]):
    signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))
try:
    os.stat(sys.argv[1])
    print("0")
except InterruptedError:
    print("alarm")
except OSError as exc:
    print(exc.errno)
"""


def _stat_in_child(path, alarm: float = 0.0) -> subprocess.Popen:
    args = [sys.executable, "-c", _STAT, str(path), str(alarm)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def _wait_held(proxy, count: int) -> None:
    for _ in range(600):
        if proxy.held() >= count:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"{proxy.held()} connections held, {count} expected")


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_a_stalled_request_holds_up_neither_a_read_of_another_file_nor_a_write(urls, proxy, mount_factory):
    direct, proxied = urls
    values = _fill(mount_factory, direct, ["stuckfile", "other"])
    m = mount_factory(proxied, ["timeout=120", "workers=16"])
    proxy.hold(b"stuckfile")
    stuck = _stat_in_child(m.path / "a" / "stuckfile")
    try:
        _wait_held(proxy, 1)
        assert read(m.path / "a" / "other") == values["other"]  # answered while one waits
        assert stuck.poll() is None  # still waiting on its server
        # A writer meanwhile: the stalled reader's wait ends and it runs again after the write
        # (then it may find the name in the folder's snapshot, or wait again).
        (m.path / "b").mkdir()
        write(m.path / "b" / "new", b"new")
        assert read(m.path / "b" / "new") == b"new"
    finally:
        proxy.release()
        out, _ = stuck.communicate(timeout=120)
    assert out.strip() == "0"


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_an_interrupt_ends_only_its_own_request(urls, proxy, mount_factory):
    direct, proxied = urls
    _fill(mount_factory, direct, ["other"])
    m = mount_factory(proxied, ["timeout=120", "workers=16"])
    proxy.hold(b"stuckname")
    waiting = _stat_in_child(m.path / "a" / "stuckname1")
    try:
        _wait_held(proxy, 1)
        interrupted = _stat_in_child(m.path / "a" / "stuckname2", alarm=1.0)
        out, _ = interrupted.communicate(timeout=120)
        assert out.strip() == "alarm"  # EINTR: its signal handler ran
        assert waiting.poll() is None  # the other request is still waiting on its server
        assert os.path.getsize(m.path / "a" / "other") == 4096  # and the mount serves others
    finally:
        proxy.release()
        out, _ = waiting.communicate(timeout=120)
    assert out.strip() == str(errno.ENOENT)  # answered once the server answered


def _client(root, native, seed: int, steps: int, errors: list) -> None:
    """One client: random changes to its own folder of the mount and the same to a native
    folder, each followed by a look at both (what it wrote it must see, whatever the others
    do meanwhile)."""
    import random

    rng = random.Random(seed)
    names = ["a", "b", "c", "d.zarr", "e/0.0", "e/0.1"]
    try:
        for step in range(steps):
            name = rng.choice(names)
            op = rng.choice(["write", "append", "truncate", "rename", "unlink", "read", "list"])
            results = []
            for base in (root, native):
                path = base / name
                try:
                    if op == "write":
                        path.parent.mkdir(exist_ok=True)
                        write(path, bytes([step % 256]) * random.Random(step).randint(0, 3000))
                    elif op == "append":
                        with open(path, "ab") as fh:
                            fh.write(b"+" * (step % 7))
                    elif op == "truncate":
                        os.truncate(path, step % 100)
                    elif op == "rename":
                        os.rename(path, base / random.Random(step).choice(["a", "b", "c", "d.zarr"]))
                    elif op == "unlink":
                        os.unlink(path)
                    elif op == "read":
                        results.append(read(path))
                        continue
                    results.append("ok")
                except OSError as exc:
                    results.append(exc.errno)
                if op == "list" or op != "read":
                    results.append(sorted(os.listdir(base)) if base.exists() else None)
            half = len(results) // 2
            assert results[:half] == results[half:], (seed, step, op, name, results)
        for dirpath, _dirs, files in os.walk(native):
            rel = os.path.relpath(dirpath, native)
            assert sorted(os.listdir(root / rel)) == sorted(os.listdir(dirpath)), (seed, rel)
            for f in files:
                assert read(root / rel / f) == read(native / rel / f), (seed, rel, f)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_concurrent_clients_of_one_mount_each_see_what_a_native_folder_shows(
    urls, tmp_path, mount_factory, request
):
    """Four clients change their own folders of one mount at once (through a proxy that
    delays nothing, so that requests overlap at every wait), each comparing every step with a
    native folder; a fifth lists and reads everything meanwhile. The seed is printed; run one
    again, or longer, with ``--workers-seed N --workers-steps N``."""
    import random

    direct, _ = urls
    seed = request.config.getoption("--workers-seed")
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 30)
    steps = request.config.getoption("--workers-steps")
    print(f"seed {seed}")
    m = mount_factory(direct, ["create", "workers=16"])
    errors: list = []
    threads = []
    for i in range(4):
        (m.path / f"c{i}").mkdir()
        (tmp_path / "native" / f"c{i}").mkdir(parents=True)
        args = (m.path / f"c{i}", tmp_path / "native" / f"c{i}", seed + i, steps, errors)
        threads.append(threading.Thread(target=_client, args=args))
    done = threading.Event()

    def browse() -> None:
        while not done.is_set():
            for dirpath, _dirs, files in os.walk(m.path):
                for f in files:
                    try:
                        read(os.path.join(dirpath, f))
                    except (FileNotFoundError, IsADirectoryError):
                        pass  # gone meanwhile

    browser = threading.Thread(target=browse)
    browser.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    done.set()
    browser.join(120)
    assert not errors, (seed, errors)


def _write_all(paths, values) -> None:
    _at_once(paths, lambda path: write(path, values[path.name]))


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_closes_waiting_together_share_one_commit(urls, proxy, mount_factory):
    """Sixteen programs each write a new chunk into one folder at once: their closes, waiting
    for their turns together, are committed in shared transactions, so the mount pays far
    fewer round trips than two a file (one close alone: the checks, then the commit); each
    file is stored whole, as a fresh mount reads it."""
    direct, proxied = urls
    _fill(mount_factory, direct, ["0.0"])
    m = mount_factory(proxied, ["workers=16"])
    os.listdir(m.path / "a")  # the folder's names are known: a create asks nothing
    names = [f"1.{i}" for i in range(16)]
    values = {n: os.urandom(4096) for n in names}
    proxy.reset()
    _write_all([m.path / "a" / n for n in names], values)
    trips = proxy.round_trips()
    assert trips <= 16, f"{trips} round trips for 16 closes waiting together"
    m.stop()
    fresh = mount_factory(direct)
    for n, v in values.items():
        assert read(fresh.path / "a" / n) == v


@pytest.mark.parametrize("urls", ["redis"], indirect=True)
def test_a_refused_close_among_closes_together_fails_alone(urls, proxy, mount_factory):
    """One of the closes served together is refused by the format layer (a ``.zarray`` that
    is not JSON): that close alone hears EINVAL, the others' files are stored."""
    direct, proxied = urls
    _fill(mount_factory, direct, ["0.0"])
    m = mount_factory(proxied, ["workers=16"])
    os.listdir(m.path / "a")
    names = [f"1.{i}" for i in range(12)]
    values = {n: os.urandom(1024) for n in names}
    values[".zarray"] = b"not json"
    results: dict[str, object] = {}
    start = threading.Barrier(len(values))

    def one(name: str) -> None:
        start.wait(60)
        try:
            write(m.path / "a" / name, values[name])
            results[name] = "ok"
        except OSError as exc:
            results[name] = exc.errno

    threads = [threading.Thread(target=one, args=(n,)) for n in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results.pop(".zarray") == errno.EINVAL
    assert set(results.values()) == {"ok"}, results
    m.stop()
    fresh = mount_factory(direct)
    for n in names:
        assert read(fresh.path / "a" / n) == values[n]
    assert not (fresh.path / "a" / ".zarray").exists()


@pytest.mark.parametrize("urls", DRIVERS, indirect=True)
def test_creates_let_in_beside_a_commit_wait_for_their_own_writes(urls, proxy, mount_factory):
    """While a close's commit waits on its server, creates and writes of other files are let
    in (they write nothing to the database); a create that must store at once (its folder's
    default ACL is kept with the file) waits for its turn as the writer. Eight programs write
    chunks into a plain folder while eight write into a folder with a default ACL: every file
    is stored whole, the second eight with the ACL, and the daemon says both happened."""
    import re
    import shutil

    if shutil.which("setfacl") is None or os.geteuid() != 0:
        unavailable("needs root and setfacl (apt-get install acl)")
    direct, proxied = urls
    _fill(mount_factory, direct, ["0.0"])
    m = mount_factory(proxied, ["workers=16", "allow_other", "validate=off"])
    (m.path / "d").mkdir()
    subprocess.run(["setfacl", "-d", "-m", "u:nobody:rwx", str(m.path / "d")], check=True)
    os.listdir(m.path / "a")
    os.listdir(m.path / "d")
    paths = [m.path / "a" / f"1.{i}" for i in range(8)] + [m.path / "d" / f"2.{i}" for i in range(8)]
    values = {p.name: os.urandom(2048) for p in paths}
    for _ in range(3):
        _write_all(paths, values)
    m.stop()
    said = r"(\d+) requests let in beside a close's commit, (\d+) of which then waited"
    counts = re.search(said, m.log_text())
    assert counts is not None and int(counts[1]) > 0 and int(counts[2]) > 0, counts
    fresh = mount_factory(direct, ["allow_other", "validate=off"])
    for p in paths:
        assert read(fresh.path / p.parent.name / p.name) == values[p.name]
    for i in range(8):
        shown = ["getfacl", "-cp", str(fresh.path / "d" / f"2.{i}")]
        acl = subprocess.run(shown, capture_output=True, text=True)
        assert "user:nobody:rwx" in acl.stdout, acl.stdout


@pytest.mark.parametrize("urls", ["redis"], indirect=True)
def test_files_emptied_together_are_stored_empty(urls, proxy, mount_factory):
    """Sixteen programs empty a stored file each at once (open with O_TRUNC, close): their
    closes, served together, store sixteen empty files."""
    direct, proxied = urls
    names = [f"1.{i}" for i in range(16)]
    _fill(mount_factory, direct, names, size=100)
    m = mount_factory(proxied, ["workers=16"])
    os.listdir(m.path / "a")
    _at_once([m.path / "a" / n for n in names], lambda path: write(path, b""))
    m.stop()
    fresh = mount_factory(direct)
    assert {n: os.path.getsize(fresh.path / "a" / n) for n in names} == dict.fromkeys(names, 0)

"""Several mounts (and other writers) on one database: each change shows on the others, and the
kernel's caches stay warm in between.

With a change feed the kernel keeps names, attributes and "no such file" for an hour, so a
change that shows at all within :data:`DEADLINE` was pushed out of those caches by the mount:
that is what these tests assert, polling, never sleeping over. How fast it shows is a figure of
the benchmarks (``scripts/bench.py``), not a bound a busy machine could break here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from mounting import make_url, needs_fuse, zarrfs

from zarrfs.backends import open_driver

pytestmark = needs_fuse

FEED_DRIVERS = ["lmdb", "sqlite", "redis", "postgres"]
DEADLINE = 30.0  # seconds before a wait gives up: far below the kernel's cache time (an hour)


@pytest.fixture(params=FEED_DRIVERS)
def feed_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each driver with a change feed."""
    return make_url(request.param, tmp_path, request)


def seen_after(check, since: float) -> float:
    """Seconds from ``since`` until ``check()`` holds (polled); fails at the deadline."""
    while True:
        try:
            if check():
                return time.monotonic() - since
        except OSError:
            pass
        if time.monotonic() - since > DEADLINE:
            raise AssertionError(f"not seen within {DEADLINE} s")
        time.sleep(0.001)


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def test_writes_through_one_mount_show_on_two_others(feed_url, mount_factory):
    a = mount_factory(feed_url, ["create"], name="a")
    b = mount_factory(feed_url, [], name="b")
    c = mount_factory(feed_url, [], name="c")
    # The kernel caches on b and c: a cached "no such file", a listing's names, attributes.
    assert not (b.path / "g").exists() and not (c.path / "g").exists()
    (a.path / "g").mkdir()
    t = time.monotonic()
    for m in (b, c):
        seen_after(lambda m=m: (m.path / "g").is_dir(), t)
    for i in range(5):
        data = f"v{i}".encode() * (i + 1)
        (a.path / "g" / "f").write_bytes(data)  # closed: committed
        t = time.monotonic()
        for m in (b, c):
            seen_after(lambda m=m, d=data: read(m.path / "g" / "f") == d, t)
            assert (m.path / "g" / "f").stat().st_size == len(data)
            assert sorted(os.listdir(m.path / "g")) == ["f"]
    (a.path / "g" / "f").unlink()
    t = time.monotonic()
    for m in (b, c):
        seen_after(lambda m=m: not (m.path / "g" / "f").exists(), t)


def _xattrs(path: Path | int) -> dict[str, bytes]:
    """What ``ls -l`` and ``getfattr -d`` ask of a name (or an open descriptor, which no
    lookup refreshes): its extended attributes."""
    if isinstance(path, int):
        return {n: os.getxattr(path, n) for n in os.listxattr(path)}
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in os.listxattr(path, follow_symlinks=False)}


def test_extended_attributes_show_on_a_mount_that_keeps_them(feed_url, mount_factory):
    """A mount of a remote database keeps each name's extended attributes as a listing, a
    lookup or a getxattr read them (the kernel keeps none, and ``ls -l`` asks name by name):
    what it writes itself shows at once, what another mount writes once its feed tells."""
    a = mount_factory(feed_url, ["create"], name="a")
    b = mount_factory(feed_url, [], name="b")
    (a.path / "d").mkdir()
    for name in ("f", "g", "h"):
        (a.path / "d" / name).write_bytes(name.encode())
    os.setxattr(a.path / "d" / "f", "user.k", b"1")
    os.setxattr(a.path / "d" / "g", "user.g", b"g")
    seen_after(lambda: sorted(os.listdir(b.path / "d")) == ["f", "g", "h"], time.monotonic())
    # Read on b: by the listing's attributes (READDIRPLUS), then by getxattr.
    for entry in os.scandir(b.path / "d"):
        entry.stat(follow_symlinks=False)
    assert _xattrs(b.path / "d" / "f") == {"user.k": b"1"}
    assert _xattrs(b.path / "d" / "h") == {}
    fd = os.open(b.path / "d" / "f", os.O_RDONLY)
    assert _xattrs(fd) == {"user.k": b"1"}
    # Written by the other mount: seen once the feed tells.
    os.setxattr(a.path / "d" / "f", "user.k", b"2")
    os.setxattr(a.path / "d" / "h", "user.new", b"n")
    t = time.monotonic()
    seen_after(lambda: _xattrs(fd) == {"user.k": b"2"}, t)
    os.close(fd)
    seen_after(lambda: _xattrs(b.path / "d" / "f") == {"user.k": b"2"}, t)
    seen_after(lambda: _xattrs(b.path / "d" / "h") == {"user.new": b"n"}, t)
    os.rename(a.path / "d" / "g", a.path / "d" / "f")  # f is now g's file
    seen_after(lambda: _xattrs(b.path / "d" / "f") == {"user.g": b"g"}, time.monotonic())
    # Written by this mount: seen at once, no wait.
    os.setxattr(b.path / "d" / "f", "user.b", b"b")
    assert _xattrs(b.path / "d" / "f") == {"user.g": b"g", "user.b": b"b"}
    os.removexattr(b.path / "d" / "f", "user.g")
    os.removexattr(b.path / "d" / "f", "user.b")
    assert _xattrs(b.path / "d" / "f") == {}
    os.rename(b.path / "d" / "h", b.path / "d" / "f")  # over a name whose record is kept
    assert _xattrs(b.path / "d" / "f") == {"user.new": b"n"}
    (b.path / "d" / "f").unlink()
    (b.path / "d" / "f").write_bytes(b"new")  # a new file has none
    assert _xattrs(b.path / "d" / "f") == {}
    os.setxattr(b.path / "d" / "f", "user.again", b"a")
    seen_after(lambda: _xattrs(a.path / "d" / "f") == {"user.again": b"a"}, time.monotonic())


def test_close_to_open(feed_url, mount_factory):
    """A file closed on one mount, then opened on another, shows the new content at once."""
    a = mount_factory(feed_url, ["create"], name="a")
    b = mount_factory(feed_url, [], name="b")
    (a.path / "f").write_bytes(b"old00")
    seen_after(lambda: read(b.path / "f") == b"old00", time.monotonic())
    for i in range(20):
        # The same size each time: only the open's look at the stamp tells the pages are old.
        data = b"new%02d" % i
        (a.path / "f").write_bytes(data)
        assert (b.path / "f").read_bytes() == data  # no wait at all
        assert (b.path / "f").read_bytes() == data  # the kernel's pages kept now


def test_close_to_open_of_a_new_name(request, tmp_path, mount_factory):
    """A file made and closed on one mount of Redis opens at once on another, which knows the
    folder's names and answers a name missing from them without asking the database: the
    lookup brings the feed's news in first. (On PostgreSQL a commit's notification may come
    after its writer heard it answered, and on LMDB and SQLite a folder's snapshot answers
    until the feed's next look: there a new name shows once the feed told, as README says.)"""
    url = make_url("redis", tmp_path, request)
    a = mount_factory(url, ["create"], name="a")
    b = mount_factory(url, [], name="b")
    (a.path / "d").mkdir()
    (a.path / "d" / "first").write_bytes(b"first")
    seen_after(lambda: read(b.path / "d" / "first") == b"first", time.monotonic())
    assert os.listdir(b.path / "d") == ["first"]  # b knows the folder's names now
    # Programs listing the folder on b all the while keep b busy: its idle look at the feed
    # finds no moment alone, so only a lookup that asks the feed first sees the new names.
    stop = threading.Event()

    def list_on_b() -> None:
        while not stop.is_set():
            os.listdir(b.path / "d")

    busy = [threading.Thread(target=list_on_b) for _ in range(3)]
    for t in busy:
        t.start()
    try:
        for i in range(20):
            name = f"n{i}"
            (a.path / "d" / name).write_bytes(b"%d" % i)
            assert read(b.path / "d" / name) == b"%d" % i, f"round {i}"  # no wait at all
    finally:
        stop.set()
        for t in busy:
            t.join()


def test_warm_caches_cost_no_requests(feed_url, mount_factory):
    """With a feed the kernel keeps names and attributes: a second stat pass sends nothing."""
    a = mount_factory(feed_url, ["create"], name="a")
    for i in range(50):
        (a.path / f"f{i}").write_bytes(b"x")
    b = mount_factory(feed_url, [], name="b")
    names = [b.path / f"f{i}" for i in range(50)]
    for p in names:
        p.stat()
    before = requests_of(b)
    for p in names:
        p.stat()
    assert requests_of(b) == before


def test_ls_l_begins_no_transaction_a_file(feed_url, mount_factory):
    """The kernel caches no extended attributes (``ls -l`` asks a file's ``security.selinux``,
    ``getfattr`` each name); under a feed the mount answers a node its listing or a getxattr
    read with no extended attributes without asking the database again, and drops that when
    the feed, or its own ``setxattr``, tells of a change."""
    from zarrfs.daemon.control import query

    a = mount_factory(feed_url, ["create"], name="a")
    (a.path / "d").mkdir()
    for i in range(20):
        (a.path / "d" / f"f{i}").write_bytes(b"x")
    b = mount_factory(feed_url, [], name="b")

    def ls_l() -> str:
        done = subprocess.run(["ls", "-l", str(b.path / "d")], check=True, capture_output=True, text=True)
        return done.stdout

    before = query(str(b.path))
    ls_l()  # the listing tells which files have extended attributes (READDIRPLUS)
    first = query(str(b.path))
    assert first["transactions"]["read"] - before["transactions"]["read"] <= 5, (before, first)
    before = first
    listing = ls_l()
    for i in range(20):  # a GETXATTR each (ls stopped at its first file's missing label)
        with pytest.raises(OSError):
            os.getxattr(b.path / "d" / f"f{i}", "user.k")
    after = query(str(b.path))
    assert after["requests"]["getxattr"] - before["requests"]["getxattr"] >= 20  # asked, answered here
    # The listing's own (one, or two on a database that reads ahead) and nothing for the files.
    assert after["transactions"]["read"] - before["transactions"]["read"] <= 2, (before, after)
    assert listing.count("-rw-") == 20
    os.setxattr(a.path / "d" / "f3", "user.k", b"from a")
    seen_after(lambda: os.listxattr(b.path / "d" / "f3") == ["user.k"], time.monotonic())
    os.setxattr(b.path / "d" / "f4", "user.k", b"from b")
    assert os.getxattr(b.path / "d" / "f4", "user.k") == b"from b"
    os.removexattr(b.path / "d" / "f4", "user.k")
    assert os.listxattr(b.path / "d" / "f4") == []


def test_a_folder_listed_again_is_listed_by_the_kernel_until_it_changes(feed_url, mount_factory):
    """Under a feed the kernel keeps a folder's listing: listed again, it costs no READDIR or
    READDIRPLUS. A name this mount makes, removes or renames there shows in the next listing,
    and so does one another mount makes, once its close returned (an open of the folder asks
    the feed first; on PostgreSQL once its notification came, as for a lookup)."""
    from zarrfs.daemon.control import query

    a = mount_factory(feed_url, ["create"], name="a")
    (a.path / "d").mkdir()
    for i in range(30):
        (a.path / "d" / f"f{i}").write_bytes(b"x")
    b = mount_factory(feed_url, [], name="b")
    names = {f"f{i}" for i in range(30)}
    assert set(os.listdir(b.path / "d")) == names

    def listings() -> int:
        counts = query(str(b.path))["requests"]
        return counts.get("readdir", 0) + counts.get("readdirplus", 0)

    before = listings()
    for _ in range(3):
        assert set(os.listdir(b.path / "d")) == names
    assert listings() == before
    (b.path / "d" / "new").write_bytes(b"n")
    (b.path / "d" / "f0").unlink()
    os.rename(b.path / "d" / "f1", b.path / "d" / "g1")
    names = (names - {"f0", "f1"}) | {"new", "g1"}
    assert set(os.listdir(b.path / "d")) == names
    (a.path / "d" / "from-a").write_bytes(b"a")
    (a.path / "d" / "f2").unlink()
    names = (names - {"f2"}) | {"from-a"}
    if feed_url.startswith("postgresql"):  # its notifications come after the commit
        seen_after(lambda: set(os.listdir(b.path / "d")) == names, time.monotonic())
    else:  # the feed told before the writer's close returned: b's next listing shows it
        assert set(os.listdir(b.path / "d")) == names
    assert listings() > before


def requests_of(m) -> int:
    """Requests the daemon answered so far (its status socket)."""
    from zarrfs.daemon.control import query

    return sum(query(str(m.path))["requests"].values())


def test_redis_client_not_zarrfs_listed_without_reindex(request, tmp_path, mount_factory):
    """Keys a plain Redis client adds or deletes show in listings at once (no reindex)."""
    import redis

    url = make_url("redis", tmp_path, request)
    m = mount_factory(url, ["create"])
    (m.path / "g").mkdir()
    (m.path / "g" / "mine").write_bytes(b"1")
    prefix = url.rpartition("prefix=")[2]
    client = redis.Redis.from_url(url.partition("?")[0])
    assert os.listdir(m.path / "g") == ["mine"]
    client.set(f"{prefix}:g/theirs", b"22")
    t = time.monotonic()
    seen_after(lambda: sorted(os.listdir(m.path / "g")) == ["mine", "theirs"], t)
    assert (m.path / "g" / "theirs").read_bytes() == b"22"
    client.delete(f"{prefix}:g/theirs")
    t = time.monotonic()
    seen_after(lambda: os.listdir(m.path / "g") == ["mine"], t)
    assert not (m.path / "g" / "theirs").exists()


def test_a_running_mount_lists_what_zarrfs_reindex_indexed(request, tmp_path, mount_factory):
    """A key a plain Redis client adds while no writable mount follows the database (here a
    read-only one) lists once ``zarrfs reindex`` indexed it: the mount hid it until a remount
    (an index write is no data key's, so no invalidation said so)."""
    import redis

    url = make_url("redis", tmp_path, request)
    with open_driver(url) as driver:
        driver.put("g/mine", b"1")
    m = mount_factory(url, ["ro"])
    assert os.listdir(m.path / "g") == ["mine"]
    prefix = url.rpartition("prefix=")[2]
    redis.Redis.from_url(url.partition("?")[0]).set(f"{prefix}:g/theirs", b"22")
    assert os.listdir(m.path / "g") == ["mine"]  # not indexed: a read-only mount indexes nothing
    zarrfs("reindex", url)
    t = time.monotonic()
    seen_after(lambda: sorted(os.listdir(m.path / "g")) == ["mine", "theirs"], t)
    assert (m.path / "g" / "theirs").read_bytes() == b"22"


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_writer_without_a_log_beside_a_mount(kind, request, tmp_path, mount_factory):
    """A writer that keeps no change log (zarr-python 2's LMDBStore / SQLiteStore: the raw
    database, written in this process) is seen too: "something changed", the mount rescans."""
    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create"])
    (m.path / "a").mkdir()
    (m.path / "a" / "k").write_bytes(b"zarrfs")
    assert (m.path / "a" / "k").read_bytes() == b"zarrfs"
    assert not (m.path / "a" / "new").exists()
    if kind == "lmdb":
        import lmdb

        env = lmdb.open(str(tmp_path / "db.lmdb"), max_dbs=0)
        with env.begin(write=True) as txn:  # what LMDBStore.__setitem__ does
            txn.put(b"a/k", b"store!")
            txn.put(b"a/new", b"1")
        env.close()
    else:
        import sqlite3

        conn = sqlite3.connect(tmp_path / "db.sqlite")  # what SQLiteStore does
        conn.execute("REPLACE INTO zarr VALUES (?, ?)", ("a/k", b"store!"))
        conn.execute("REPLACE INTO zarr VALUES (?, ?)", ("a/new", b"1"))
        conn.commit()
        conn.close()
    t = time.monotonic()
    seen_after(lambda: read(m.path / "a" / "k") == b"store!", t)
    assert (m.path / "a" / "new").read_bytes() == b"1"
    assert sorted(os.listdir(m.path / "a")) == ["k", "new"]


def test_mount_stays_up_when_its_peer_is_killed(feed_url, mount_factory):
    a = mount_factory(feed_url, ["create"], name="a")
    b = mount_factory(feed_url, [], name="b")
    (a.path / "f").write_bytes(b"before")
    seen_after(lambda: read(b.path / "f") == b"before", time.monotonic())
    from zarrfs.daemon.control import query

    os.kill(query(str(a.path))["pid"], signal.SIGKILL)
    (b.path / "f").write_bytes(b"after")
    (b.path / "g").mkdir()
    assert (b.path / "f").read_bytes() == b"after"
    assert sorted(os.listdir(b.path)) == ["f", "g"]
    c = mount_factory(feed_url, [], name="c")
    assert (c.path / "f").read_bytes() == b"after"
    (c.path / "f").write_bytes(b"from c")
    t = time.monotonic()
    seen_after(lambda: read(b.path / "f") == b"from c", t)
    subprocess.run(["fusermount3", "-u", "-z", str(a.path)], check=False)


def test_a_rename_or_lookup_after_another_clients_change_waits_for_no_folder_lock(feed_url, mount_factory):
    """Another client rewrites a file; a rename (here an exchange) or a lookup of a missing
    name in its folder through the mount hears of it first and drops the kernel's entry of
    the file, which the kernel writes under the folder's lock, held by that very request
    until it is answered. Such a wait could only run out its bound (100 ms a request,
    counted as ``late`` by ``zarrfs status``); none is waited for now, and names and
    contents are right."""
    import ctypes

    from zarr.core.buffer import default_buffer_prototype

    from zarrfs.daemon.control import query
    from zarrfs.store import DatabaseStore

    libc = ctypes.CDLL(None, use_errno=True)
    m = mount_factory(feed_url, ["create"])
    (m.path / "x").write_bytes(b"x")
    (m.path / "n").write_bytes(b"n")
    assert os.stat(m.path / "x").st_size == 1 and os.stat(m.path / "n").st_size == 1
    store = DatabaseStore(feed_url)
    try:
        for i in range(20):
            store.set_sync("n", default_buffer_prototype().buffer.from_bytes(b"n%d" % i))
            if i % 4 == 3:
                assert not (m.path / f"missing{i}").exists()
            elif libc.renameat2(-100, os.fsencode(m.path / "x"), -100, os.fsencode(m.path / "n"), 2) != 0:
                raise OSError(ctypes.get_errno(), "renameat2")
        late = query(str(m.path))["notifications"]["late"]
        stored = {key: store._db().get(key) for key in ("x", "n")}
    finally:
        store.close()
    assert late == 0, f"{late} waits for the kernel's notifications ran out"
    assert {key: (m.path / key).read_bytes() for key in ("x", "n")} == stored

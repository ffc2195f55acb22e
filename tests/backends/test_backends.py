"""Driver conformance, registry, scale and zarr-python 2.18 interoperability tests.

One conformance class, :class:`zarrfs.testing.DriverConformance`, checks the contract of
``backends/base.py``; each driver's test class subclasses it and only says how to open that
driver. Everything is real: files, a real ``redis-server`` (``conftest.redis_server``), real
processes, and the real zarr-python 2.18 classes in their own venv (``zarr2env``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import zarr2env
from conftest import record_redis_calls
from mounting import unavailable

from zarrfs.backends import registry
from zarrfs.backends.base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    VALUES,
    DriverNotFoundError,
    Get,
    RetryableError,
    Size,
    StorageFullError,
    prefix_stop,
)
from zarrfs.backends.registry import open_driver
from zarrfs.testing import DriverConformance
from zarrfs.testing.driver_txn import keys_of, scan_moving_keys


class _Conformance(DriverConformance):
    """The conformance kit with the ``driver`` fixture of every built-in driver: ``url``
    opened through the registry."""

    @pytest.fixture
    def driver(self, url):
        d = open_driver(url)
        yield d
        d.close()



# --- one subclass per driver -----------------------------------------------------------------------


class TestMemory(_Conformance):
    """``memory://name``."""

    multiprocess = False

    @pytest.fixture
    def url(self):
        return f"memory://test-{uuid.uuid4().hex}"


class TestLMDBFolder(_Conformance):
    """An LMDB folder environment (``data.mdb`` + ``lock.mdb``), zarr's default."""

    side_commits_with_data = False

    @pytest.fixture
    def url(self, tmp_path):
        return f"lmdb://{tmp_path}/db.lmdb"

    def fill_to_exhaustion(self, url):
        return _Closing(open_driver(url.replace("db.lmdb", "small.lmdb") + "?map_size=1048576"))

    def test_layout(self, driver, tmp_path):
        driver.put("k", b"v")
        driver.put("k", b"s", SIDE)
        names = sorted(os.listdir(tmp_path / "db.lmdb"))
        # zarrfs-reserve: disk room kept for removals on a full disk (filespace.Reserve)
        assert names == ["data.mdb", "lock.mdb", "zarrfs-reserve", "zarrfs-side.mdb", "zarrfs-side.mdb-lock"]

    def test_bare_path_means_lmdb(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        d = open_driver("relative.lmdb")
        try:
            assert type(d).__name__ == "LMDBDriver"
            assert d.url == f"lmdb://{tmp_path}/relative.lmdb"
            d.put("k", b"v")
        finally:
            d.close()
        assert os.path.isfile(tmp_path / "relative.lmdb" / "data.mdb")

    def test_options_and_missing_database(self, tmp_path):
        from zarrfs.backends.base import UnavailableError

        d = open_driver(f"lmdb://{tmp_path}/o.lmdb?map_size=64M&sync=0")
        try:
            assert d.map_size == 64 * 2**20
            assert d.env.info()["map_size"] == 64 * 2**20
            assert d.statfs()["total"] <= 64 * 2**20
        finally:
            d.close()
        with pytest.raises(UnavailableError):
            open_driver(f"lmdb://{tmp_path}/missing.lmdb", readonly=True)

    def test_two_drivers_in_one_process(self, driver, url):
        driver.put("k", b"v")
        other = open_driver(url)  # LMDB forbids opening an environment twice: shared instead
        other.put("k2", b"v2")
        other.close()
        assert driver.scan() == [("k", None), ("k2", None)]


class TestLMDBFile(_Conformance):
    """A single-file LMDB environment (``subdir=False``)."""

    side_commits_with_data = False

    @pytest.fixture
    def url(self, tmp_path):
        import lmdb

        lmdb.open(str(tmp_path / "single.mdb"), subdir=False).close()
        os.remove(tmp_path / "single.mdb-lock")
        return f"lmdb://{tmp_path}/single.mdb"

    def fill_to_exhaustion(self, url):
        import lmdb

        small = url.removeprefix("lmdb://").replace("single.mdb", "small.mdb")
        lmdb.open(small, subdir=False).close()
        return _Closing(open_driver(f"lmdb://{small}?map_size=1M"))

    def test_layout(self, driver, tmp_path):
        driver.put("k", b"s", SIDE)
        assert sorted(os.listdir(tmp_path)) == [
            "single.mdb",
            "single.mdb-lock",
            "single.mdb.zarrfs-reserve",
            "single.mdb.zarrfs-side",
            "single.mdb.zarrfs-side-lock",
        ]


class TestSQLite(_Conformance):
    """An SQLite file."""

    @pytest.fixture
    def url(self, tmp_path):
        return f"sqlite://{tmp_path}/x.db"

    def fill_to_exhaustion(self, url):
        return _SQLiteFull(url)

    def test_schema_is_zarr2(self, driver, tmp_path):
        import sqlite3

        driver.put("k", b"v")
        conn = sqlite3.connect(tmp_path / "x.db")
        try:
            sql = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall())
            assert sql["zarr"] == "CREATE TABLE zarr(k TEXT PRIMARY KEY, v BLOB)"
            # the change log (sqlite.feed); zarr-sqlite's declaration of a database made here
            assert set(sql) == {"zarr", "zarrfs_side", "zarrfs_changes", "sqlitestore_metadata"}
            assert conn.execute("SELECT k, typeof(k), typeof(v) FROM zarr").fetchall() == [
                ("k", "text", "blob")
            ]
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            conn.close()

    def test_a_value_another_writer_stored_as_text_counts_its_bytes_in_a_scan(self, driver, tmp_path):
        """A scan's sizes (what a listing gives ``ls -l``) are the values' bytes, as
        :meth:`size` and :meth:`get` give them, for values stored as TEXT or NULL by another
        writer too, not their characters."""
        import sqlite3

        driver.put("a/blob", b"\x00\xff")
        with sqlite3.connect(tmp_path / "x.db") as conn:
            conn.execute("INSERT INTO zarr VALUES ('a/text', ?)", ("héllo €",))
            conn.execute("INSERT INTO zarr VALUES ('a/null', NULL)")
        conn.close()
        want = {k: len(driver.get(k)) for k in ("a/blob", "a/null", "a/text")}
        assert want == {"a/blob": 2, "a/null": 0, "a/text": 10}
        assert dict(driver.scan("a/", "a0", fetch=SIZES)) == want
        assert driver.transact(lambda t: {k: t.size(k) for k in want}, write=False) == want

    def test_missing_database_read_only(self, tmp_path):
        from zarrfs.backends.base import UnavailableError

        with pytest.raises(UnavailableError):
            open_driver(f"sqlite://{tmp_path}/missing.db", readonly=True)
        with pytest.raises(UnavailableError):
            open_driver(f"sqlite://{tmp_path}/no/such/dir/x.db")

    def test_url_spellings(self, tmp_path):
        a = open_driver(f"sqlite:///{tmp_path}/y.db")  # four slashes, SQLAlchemy's absolute form
        b = open_driver(f"sqlite://{tmp_path}/y.db")
        try:
            a.put("k", b"v")
            assert b.get("k") == b"v"
            assert a.path == b.path == str(tmp_path / "y.db")
        finally:
            a.close()
            b.close()

    def test_read_transaction_sees_one_state(self, driver, url):
        other = open_driver(url)
        driver.put("x", b"1")
        driver.put("y", b"1", SIDE)
        driver.backoff = 0.001
        calls = []

        def fn(t):
            calls.append(1)
            x = t.size("x")
            if len(calls) == 1:  # another writer commits between the first two reads
                other.transact(lambda o: [o.put("x", b"22"), o.put("y", b"22", SIDE)])
            y = t.read_many([("get", "y", SIDE)])[0]
            return x, len(y)

        try:
            assert driver.transact(fn, write=False) in [(1, 1), (2, 2)]
        finally:
            other.close()

    def test_background_checkpoint(self, driver, tmp_path):
        import threading
        import time

        db = tmp_path / "x.db"
        # This driver's thread: a store another test opened by URL may keep one of its own.
        thread = driver.checkpointer.thread
        assert thread.name == "zarrfs-sqlite-checkpoint" and thread in threading.enumerate()
        before = db.stat().st_size
        for i in range(300):  # 1.2 MiB in the WAL, far below SQLite's own checkpoint threshold
            driver.put(f"c/{i}", os.urandom(4096))
        deadline = time.monotonic() + 60
        while db.stat().st_size < before + 300 * 4096 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert db.stat().st_size >= before + 300 * 4096  # copied into the database file
        driver.sync()
        driver.close()
        assert not thread.is_alive()

    def test_checkpoint_waits_for_a_pause_or_a_full_burst(self, driver, tmp_path):
        import time

        db = tmp_path / "x.db"
        checkpointer = driver.checkpointer
        checkpointer.interval = 30  # no pause long enough in this test
        before = db.stat().st_size
        for i in range(8):  # about 300 KiB: far below the burst
            driver.put(f"a/{i}", os.urandom(4096))
        time.sleep(0.5)
        assert db.stat().st_size == before  # still only in the WAL
        checkpointer.burst = checkpointer.burst_max = 1 << 20  # the background thread's
        for i in range(40):  # past the burst, with no pause
            driver.put(f"b/{i}", os.urandom(4096))
        deadline = time.monotonic() + 60
        while db.stat().st_size < before + 64 * 1024 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Checkpointed during the burst: the values committed up to it are in the database.
        assert db.stat().st_size >= before + 64 * 1024

    def test_lock_held_by_another_connection_is_waited_for_then_times_out(self, driver, tmp_path, caplog):
        import sqlite3

        from zarrfs.backends.base import StalledError

        other = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            d = open_driver(f"sqlite://{tmp_path}/x.db?timeout=0.2")
            d.set_timeout(0.6)  # -o timeout=: the bound of the wait, said in the log past 0.5 s
            with pytest.raises(StalledError, match="holds the database's write lock"):
                d.put("k", b"v")
            assert "waiting up to 0.6 s" in caplog.text
            d.close()
        finally:
            other.execute("ROLLBACK")
            other.close()


def test_a_transaction_retrying_for_long_says_so_once(tmp_path, caplog):
    """A transaction that keeps meeting a retryable failure (a conflict, a moving slot, a busy
    database) tries again for up to the timeout, and past ``RETRY_TELL`` says so in one log
    line, not one a retry; a short run of retries says nothing."""
    from zarrfs.backends import base

    driver = open_driver(f"lmdb://{tmp_path}/r.lmdb?map_size=1048576")
    try:
        def failing(times: int = 0, seconds: float = 0.0):
            left, until = [times], time.monotonic() + seconds

            def fn(t):
                if left[0] > 0 or time.monotonic() < until:
                    left[0] -= 1
                    raise RetryableError("a conflict, for the test")
                return t.get("k")

            return fn

        assert driver.transact(failing(times=2), write=False) is None  # retried at once: no line
        assert not [r for r in caplog.records if "trying again" in r.getMessage()]
        assert driver.transact(failing(seconds=base.RETRY_TELL + 0.6), write=False) is None
        told = [r for r in caplog.records if "trying again" in r.getMessage()]
        assert len(told) == 1 and told[0].levelname == "WARNING", caplog.text
        assert "a conflict, for the test" in told[0].getMessage()
        assert driver.url not in told[0].getMessage()  # a server's URL may hold a password
    finally:
        driver.close()


def test_sqlite_new_database_gets_large_pages_and_an_old_one_keeps_its_own(tmp_path):
    import sqlite3

    from zarrfs.backends.sqlite.sql import PAGE_SIZE

    d = open_driver(f"sqlite://{tmp_path}/new.db")
    d.put("a/0", b"x" * 300_000)
    d.close()
    old = sqlite3.connect(tmp_path / "old.db")  # as zarr's SQLiteStore makes one
    old.execute("CREATE TABLE zarr(k TEXT PRIMARY KEY, v BLOB)")
    old.commit()
    old.close()
    d = open_driver(f"sqlite://{tmp_path}/old.db")
    d.put("a/0", b"y" * 300_000)
    d.close()
    for name, size in (("new.db", PAGE_SIZE), ("old.db", 4096)):
        conn = sqlite3.connect(tmp_path / name)
        assert conn.execute("PRAGMA page_size").fetchone()[0] == size
        assert len(conn.execute("SELECT v FROM zarr WHERE k = 'a/0'").fetchone()[0]) == 300_000
        conn.close()


def test_lmdb_reserves_blocks_ahead_of_its_end(tmp_path):
    """Appending to a file makes the filesystem allocate blocks write by write (slow on ext4);
    the LMDB driver reserves them ahead with fallocate(KEEP_SIZE): the size is unchanged, the
    blocks are there, and values go on being stored and read."""
    from zarrfs.backends.filespace import FALLOC_FL_KEEP_SIZE, PREALLOCATE_MIN, _libc_fallocate

    fallocate = _libc_fallocate()
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_CREAT | os.O_WRONLY)
    try:
        if fallocate is None or fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20) != 0:
            pytest.skip(f"the filesystem of {tmp_path} cannot reserve blocks (fallocate)")
    finally:
        os.close(fd)
    path = tmp_path / "db.lmdb"
    driver = open_driver(f"lmdb://{path}")
    data_file = path / "data.mdb"
    try:
        value = os.urandom(1 << 20)
        for i in range(4):
            driver.put(f"a/{i}", value)
        st = os.stat(data_file)
        assert st.st_blocks * 512 >= st.st_size + PREALLOCATE_MIN // 4
        assert all(driver.get(f"a/{i}") == value for i in range(4))
    finally:
        driver.close()


def test_lmdb_gives_back_its_reserve_when_closed_and_never_inflates_a_small_database(tmp_path):
    """The reserve ahead of the end is released at close, so a database written by
    zarr-python 2's LMDBStore does not keep a gigabyte of blocks after one small write."""
    import lmdb

    path = tmp_path / "zarr2.lmdb"
    env = lmdb.open(str(path), map_size=1 << 30)  # as LMDBStore makes one: data.mdb + lock.mdb
    with env.begin(write=True) as txn:
        txn.put(b".zgroup", b'{"zarr_format": 2}')
    env.close()
    data_file = path / "data.mdb"
    before = os.stat(data_file).st_blocks * 512
    driver = open_driver(f"lmdb://{path}")
    try:
        driver.put("x", b"8 bytes!")
        during = os.stat(data_file)
        assert during.st_blocks * 512 - before <= 16 << 20  # a few MiB at most while open
    finally:
        driver.close()
    after = os.stat(data_file)
    assert after.st_blocks * 512 <= after.st_size + (1 << 20), (before, after.st_blocks * 512, after.st_size)


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_lmdb_sizes_of_values_it_committed_do_not_touch_them(tmp_path):
    """A lookup needs a chunk's size: py-lmdb touches every page of a value it returns, also
    for ``len()``, so sizes of what this driver committed come from memory. Counted as page
    faults of this process: touching 64 MiB of values not mapped yet (the commit wrote them
    with ``pwrite``) costs a fault per 64 KiB or less, about 1,000 in all."""
    value = os.urandom(1 << 20)
    driver = open_driver(f"lmdb://{tmp_path}/db.lmdb")
    try:
        driver.transact(lambda t: [t.put(f"arr/c/{i}/0", value) for i in range(64)])
        before = _minor_faults()
        assert [driver.size(f"arr/c/{i}/0") for i in range(64)] == [1 << 20] * 64
        assert (
            driver.transact(lambda t: [t.size(f"arr/c/{i}/0") for i in range(64)], write=False)
            == [1 << 20] * 64
        )
        rows = driver.transact(lambda t: list(t.scan("arr/c/", "arr/c0", fetch=SIZES)), write=False)
        assert len(rows) == 64 and {n for _, n in rows} == {1 << 20}
        assert _minor_faults() - before < 200
    finally:
        driver.close()


def _read_from_disk() -> int:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        pytest.skip("no per-process I/O accounting (/proc/self/io)")


def _evict(file) -> None:
    """Drop ``file``'s pages from the page cache (written back first: only clean pages go)."""
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cold_chunks(path, extra: dict[str, bytes]):
    """A driver over a new LMDB database of 64 chunks of 1 MiB (``arr/c/<i>/0``) and the
    ``extra`` keys, none of it in the page cache."""
    value = os.urandom(1 << 20)
    driver = open_driver(f"lmdb://{path}")
    try:
        driver.transact(
            lambda t: (
                [t.put(f"arr/c/{i}/0", value) for i in range(64)] + [t.put(k, v) for k, v in extra.items()]
            )
        )
    finally:
        driver.close()
    _evict(path / "data.mdb")
    return open_driver(f"lmdb://{path}")


def test_lmdb_listing_reads_no_values_from_disk(tmp_path):
    """A listing needs keys only: one over values that are not cached must not read them from
    disk. py-lmdb 2.1 and later read every value a cursor passes (the dependency pin keeps
    them out): here that is 64 MiB for a listing of 64 keys."""
    driver = _cold_chunks(tmp_path / "db.lmdb", {})
    try:
        before = _read_from_disk()
        keys = driver.transact(lambda t: [k for k, _ in t.scan("arr/c/", "arr/c0")], write=False)
        assert len(keys) == 64
        assert driver.transact(lambda t: t.read_many([("prefix", "arr/c/7", DATA)]), write=False) == [True]
        assert _read_from_disk() - before < 4 << 20
        assert driver.size("arr/c/5/0") == 1 << 20  # not known to this driver: read from the value
    finally:
        driver.close()


def test_lmdb_scans_release_the_maps_once_when_other_files_grew(tmp_path, monkeypatch):
    """Scans release LMDB's map pages once the process's resident file pages grew a budget past
    the first look, or past what a release left where that is more. Pages of other files
    mapped since the first look (a library imported later) are not the maps': counted against
    the first look alone, they made every look release the maps, and the pages each request
    touched next were mapped again."""
    import mmap

    from zarrfs.backends.lmdb import pages

    released: list[int] = []
    real = pages.release
    monkeypatch.setattr(pages, "release", lambda d: (released.append(1), real(d)))
    driver = open_driver(f"lmdb://{tmp_path / 'db.lmdb'}")
    other = tmp_path / "other"
    other.write_bytes(os.urandom(pages.BUDGET + (16 << 20)))
    try:
        driver.transact(lambda t: [t.put(f"f/{i:05}", b"v") for i in range(pages.LOOK_EVERY)])

        def scan() -> int:
            return len(driver.transact(lambda t: list(t.scan("f/", "f0")), write=False))

        assert scan() == pages.LOOK_EVERY  # the first look: the level to count from
        with open(other, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            assert len(m[:: mmap.PAGESIZE]) == len(m) // mmap.PAGESIZE  # every page read: resident
            for _ in range(8):
                assert scan() == pages.LOOK_EVERY
        assert len(released) == 1
    finally:
        driver.close()


def test_lmdb_releases_look_for_the_maps_again_only_once_they_moved(tmp_path, monkeypatch):
    """Releasing the maps' pages finds the maps in ``/proc/self/maps`` (0.4-1.2 ms in a daemon,
    a release every 32 MiB read) only the first time and after a map moved (resized here):
    between, each place is checked to be the map's still, and once it moved the pages given
    back are the new map's, never the old place's (whatever is mapped there now)."""
    from zarrfs.backends.lmdb import pages
    from zarrfs.backends.lmdb.maps import gate

    looks: list[str] = []

    def counting_open(path, *args, **kwargs):
        if path == "/proc/self/maps":
            looks.append(path)
        return open(path, *args, **kwargs)

    given: list[tuple[int, int]] = []
    real = pages._libc_madvise()
    assert real, "madvise from libc"

    def madvise(start, length, advice):
        given.append((start, start + length))
        return real(start, length, advice)

    monkeypatch.setattr(pages, "open", counting_open, raising=False)
    monkeypatch.setattr(pages, "_madvise", madvise)
    driver = open_driver(f"lmdb://{tmp_path / 'db.lmdb'}?map_size=1G")
    try:
        value = os.urandom(1 << 20)
        driver.transact(lambda t: [t.put(f"v/{i}", value) for i in range(4)])

        def read_all() -> None:
            got = driver.transact(lambda t: [bytes(t.get(f"v/{i}")) for i in range(4)], write=False)
            assert got == [value] * 4

        for _ in range(3):
            read_all()
            pages.release(driver)
        # The driver's own look for its data map (``map_where``, once a map size), and the
        # first release's; then none.
        assert len(looks) == 2
        files = {pages.data_file(env) for env in pages._environments(driver)}
        before = pages.mappings(files)
        assert len(before) == 2  # the data map and the side map
        assert given == before * 3
        assert gate.resize(driver.env, 2 << 30)
        after = pages.mappings(files)
        assert after != before
        given.clear()
        looks.clear()
        read_all()
        pages.release(driver)
        assert len(looks) == 2  # map_where's (a new map size) and the release's
        assert given == after
        read_all()
    finally:
        driver.close()


def test_lmdb_listing_takes_sizes_from_its_scans_and_reads_no_values_from_disk(tmp_path, monkeypatch):
    """A READDIRPLUS window on LMDB takes every file's size from the scans that list it (the
    length of the value's place in the map): no read a name, its first batch's neither, and
    no value read from disk, also of a folder whose scans pass the deep keys of subfolders
    (``c/<i>/0``, 1 MiB each, sizes taken and left)."""
    from zarrfs.backends.lmdb.driver import LMDBTxn
    from zarrfs.fs.tree import Tree

    names = {f"arr/c/f{i:04}": b"x" * (i % 7) for i in range(600)}
    driver = _cold_chunks(tmp_path / "db.lmdb", names)
    sized: list[bytes] = []
    real = LMDBTxn._size
    monkeypatch.setattr(LMDBTxn, "_size", lambda t, raw, space: (sized.append(raw), real(t, raw, space))[1])
    try:
        before = _read_from_disk()
        listings = Tree(driver, uid=0, gid=0).listings
        nodes: dict = {}
        got = listings.list_dir("arr/c", limit=1000, sizes={}, nodes=nodes)
        assert len(got) == 664 and len(nodes) == 664
        assert [nodes[f"f{i:04}"].size for i in range(600)] == [i % 7 for i in range(600)]
        assert sized == []
        # The leaf pages and what the kernel reads around them; the values are 64 MiB.
        assert _read_from_disk() - before < 16 << 20
    finally:
        driver.close()


def test_lmdb_sizes_read_no_values_from_disk(tmp_path):
    """The size of a value is read from its key's leaf node (zarrfs.backends.lmdb.leaf):
    py-lmdb reads every page of a value it returns, so a ``stat`` of a large chunk written by
    another program (no size known to this driver) read the chunk. A driver's sizes, alone
    and in a batch of reads, and a scan's, of 64 chunks of 1 MiB not in the page cache."""
    from zarrfs.backends.lmdb import leaf

    assert leaf.AVAILABLE  # CPython and LMDB 0.9: what the project runs on
    driver = _cold_chunks(tmp_path / "db.lmdb", {"arr/small": b"abc"})
    try:
        before = _read_from_disk()
        assert [driver.size(f"arr/c/{i}/0") for i in range(32)] == [1 << 20] * 32
        reads = [Size(f"arr/c/{i}/0", DATA) for i in range(32, 64)]
        reads += [Size("arr/small", DATA), Size("arr/x", DATA)]
        assert driver.transact(lambda t: t.read_many(reads), write=False) == [1 << 20] * 32 + [3, None]
        rows = driver.transact(lambda t: list(t.scan("arr/", "arr0", fetch=SIZES)), write=False)
        assert [n for _, n in rows] == [1 << 20] * 64 + [3]
        assert _read_from_disk() - before < 16 << 20
    finally:
        driver.close()


def test_lmdb_a_range_of_a_large_value_reads_the_range_from_disk(tmp_path):
    """A read of 64 KiB of a 256 MiB value (a zarr shard) reads about that from disk, not the
    value: py-lmdb reads every page of a value it returns, so the driver's read transactions
    view a large value from its leaf node and its overflow pages (zarrfs.backends.lmdb.leaf),
    ranges and held values (an open file's) alike. Values read whole still read whole."""
    from zarrfs.backends.heldvalues import hold

    value = os.urandom(1 << 20) * 256
    driver = open_driver(f"lmdb://{tmp_path / 'db.lmdb'}")
    try:
        driver.transact(lambda t: (t.put("s/shard", value), t.put("s/small", b"xyz")))
    finally:
        driver.close()
    _evict(tmp_path / "db.lmdb" / "data.mdb")
    driver = open_driver(f"lmdb://{tmp_path / 'db.lmdb'}")
    try:
        before = _read_from_disk()
        at = 100 << 20
        assert driver.transact(lambda t: t.read("s/shard", at, 65536), write=False) == value[at : at + 65536]
        _, held = hold(driver, lambda t, view: (None, view("s/shard")))
        assert held is not None and held.size == len(value)
        assert bytes(held.data[200 << 20 : (200 << 20) + 65536]) == value[200 << 20 : (200 << 20) + 65536]
        held.release()
        assert driver.get("s/small") == b"xyz"
        # Each access reads what the kernel reads around a fault (here up to 8 MiB), not 256.
        assert _read_from_disk() - before < 64 << 20
        assert driver.get("s/shard") == value  # whole: all of it
    finally:
        driver.close()


def test_lmdb_snapshot_of_a_folder_of_subfolders_reads_no_values_from_disk(tmp_path):
    """A folder snapshot needs the sizes of the folder's own files only: one of zarr's ``c/``
    (a subfolder per chunk row) must not read the chunks below it from disk."""
    from zarrfs.fs.tree import Tree

    driver = _cold_chunks(tmp_path / "db.lmdb", {"arr/c/x": b"xyz"})
    try:
        before = _read_from_disk()
        nodes = Tree(driver, uid=0, gid=0).folder_nodes("arr/c", 1000)
        assert len(nodes) == 65 and nodes["x"].size == 3
        assert _read_from_disk() - before < 4 << 20
    finally:
        driver.close()


def _lmdb_put(path: str, key: bytes, value: bytes) -> None:
    import lmdb

    env = lmdb.open(path, map_size=1 << 30)
    with env.begin(write=True) as txn:
        if value:
            txn.put(key, value)
        else:
            txn.delete(key)
    env.close()


def test_lmdb_known_sizes_give_way_to_another_writer(tmp_path):
    """Sizes remembered from this driver's commits answer only while nobody else has written:
    a value rewritten or deleted by another process (zarr's LMDBStore), or by another driver on
    the same database, shows its new size at once; this driver's own writes show in its
    transaction before they commit."""
    path = str(tmp_path / "db.lmdb")
    driver = open_driver(f"lmdb://{path}")
    big, bigger = b"a" * (1 << 16), b"b" * (1 << 17)
    try:
        driver.put("x/0", big)
        driver.put("x/1", big)
        assert driver.size("x/0") == 1 << 16
        assert driver.known.get(driver.transact(lambda t: t._id, write=False), b"x/0") == 1 << 16
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(target=_lmdb_put, args=(path, b"x/0", bigger))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        assert driver.size("x/0") == 1 << 17
        assert driver.transact(lambda t: t.read_many([("size", "x/0", DATA)]), write=False) == [1 << 17]
        proc = ctx.Process(target=_lmdb_put, args=(path, b"x/1", b""))
        proc.start()
        proc.join(60)
        assert driver.size("x/1") is None
        other = open_driver(f"lmdb://{path}")  # shares the environment, not the sizes
        try:
            driver.put("x/2", big)
            other.put("x/2", b"small")
            assert driver.size("x/2") == 5
        finally:
            other.close()

        def rewrite(t):
            t.put("x/2", bigger)
            inside = t.size("x/2")
            t.delete("x/0")
            return inside, t.size("x/0")

        assert driver.transact(rewrite) == (1 << 17, None)
        assert driver.size("x/2") == 1 << 17 and driver.size("x/0") is None
        assert [k for k, _ in driver.scan("x/")] == ["x/2"]
    finally:
        driver.close()


def _tmpfs(path, size: str):
    """Mount a tmpfs of ``size`` at ``path`` (a small disk to fill); skip unless root can."""
    import subprocess

    if os.geteuid() != 0:
        unavailable("mounting a small tmpfs to fill needs root")
    path.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    done = subprocess.run(command, capture_output=True)
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs: {done.stderr.decode(errors='replace').strip()}")


@pytest.mark.parametrize("big", [DATA, SIDE])
def test_lmdb_full_disk_fails_a_commit_whole(tmp_path, big):
    """LMDB keeps side data in a second environment: two commits, one outcome. Transactions
    that each write a data and a side record (and overwrite a counter in both spaces) fill a
    small disk until one fails: it raises StorageFullError, and after reopening nothing it
    wrote is there, in either space, while everything before it is. With big side values the
    side commit is the one the disk refuses; with big data values the data commit is, after
    the side commit, which is then undone."""
    import subprocess

    disk = tmp_path / "disk"
    _tmpfs(disk, "8m")
    try:
        url = f"lmdb://{disk}/db.lmdb"
        driver = open_driver(url)
        failed = None
        try:
            for i in range(200):

                def fill(t, i=i):
                    value = os.urandom(256 << 10)
                    t.put(f"fill/{i}", value if big == DATA else b"d")
                    t.put(f"fill/{i}", value if big == SIDE else b"s", SIDE)
                    t.put("counter", b"%d" % i)
                    t.put("counter", b"%d" % i, SIDE)

                try:
                    driver.transact(fill)
                except StorageFullError:
                    failed = i
                    break
        finally:
            driver.close()
        assert failed is not None and failed > 0, "the disk never filled up"
        again = open_driver(url, readonly=True)
        try:
            for space in (DATA, SIDE):
                assert again.get(f"fill/{failed}", space) is None, space
                assert again.get("counter", space) == b"%d" % (failed - 1), space
                assert all(again.get(f"fill/{i}", space) is not None for i in range(failed)), space
        finally:
            again.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_sqlite_removals_on_a_full_disk_one_at_a_time(tmp_path):
    """Removals on a full disk, each after a pause (a user's ``rm`` commands): the WAL held the
    last commits, not copied out, so the background checkpoint's copy took the room the first
    removal freed, and the removals after it failed (the third: "database or disk is full").
    The WAL now keeps no more uncopied pages than the room kept for removals."""
    import subprocess
    import time

    disk = tmp_path / "disk"
    _tmpfs(disk, "12m")
    try:
        driver = open_driver(f"sqlite://{disk}/db.sqlite")
        try:
            count = 0
            with pytest.raises(StorageFullError):
                while count < 200:
                    driver.put(f"f/{count}", os.urandom(200_000))
                    count += 1
            assert count > 10
            for i in range(6):
                time.sleep(0.3)  # a background checkpoint runs
                driver.delete(f"f/{i}")
            assert [k for k, _ in driver.scan("f/", "f0")] == sorted(f"f/{i}" for i in range(6, count))
        finally:
            driver.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


_COMMIT_SMALL_FILES = """
import os, sys
from zarrfs.backends.base import SIDE, StorageFullError
from zarrfs.backends.registry import open_driver
driver = open_driver(sys.argv[1])
try:
    for i in range(20):  # a small file's commit: its bytes and its records, one transaction
        def commit(t, i=i):
            t.put(f"d/c{i}", os.urandom(4096))
            t.put(f"e:d/c{i}", b"entry", SIDE)
            t.put(f"a:d/c{i}", b"attrs", SIDE)
        driver.transact(commit)
    print(len(driver.scan("d/")))
except StorageFullError as exc:
    print("full:", exc)
finally:
    driver.close()
"""


def test_sqlite_commits_take_no_room_in_the_temporary_folder(tmp_path):
    """A write statement inside a transaction keeps a statement journal, which SQLite spills
    to a new file in its temporary folder past 64 KiB: two of the driver's 32 KiB pages, so
    every small file's commit. With that folder full (a full ``/var/tmp`` or ``$TMPDIR`` on
    a cluster's node), each commit failed with "database or disk is full" though the
    database's own disk had room. The journal is kept in memory."""
    import subprocess

    temp = tmp_path / "temp"
    _tmpfs(temp, "64k")
    try:
        fd = os.open(temp / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        env = {**os.environ, "SQLITE_TMPDIR": str(temp), "TMPDIR": str(temp)}
        done = subprocess.run(
            [sys.executable, "-c", _COMMIT_SMALL_FILES, f"sqlite://{tmp_path}/db.sqlite"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "20"
    finally:
        subprocess.run(["umount", "-l", str(temp)], check=False)


class TestRedis(_Conformance):
    """The session's redis-server, one key prefix per test."""

    @pytest.fixture
    def url(self, redis_server):
        return redis_server.url(0, prefix=f"t{uuid.uuid4().hex[:12]}")

    def fill_to_exhaustion(self, url):
        return _RedisFull(url)

    def test_layout(self, driver, redis_server):
        driver.put("a/b", b"v")
        driver.put("a/b", b"s", SIDE)
        r = redis_server.client(0)
        p = driver.prefix
        assert sorted(r.keys(f"{p}:*")) == [f"{p}:a/b".encode()]  # what RedisStore lists
        assert r.get(f"{p}:a/b") == b"v"
        assert r.type(f"zarrfs.index.{p}") == b"zset"
        assert r.zrangebylex(f"zarrfs.index.{p}", "(", "+") == [b"a/b"]

    def test_a_key_moving_faster_than_its_batch_is_read_is_listed_once(self, driver, monkeypatch):
        """Values are read after their batch's range (names and sizes by one script): with no
        read of the range again allowed, a rename in between is common, and the read
        transaction runs again rather than list the key under no name."""
        monkeypatch.setattr("zarrfs.backends.redis.index.RECHECKS", 0)
        scan_moving_keys(driver, reads=300)

    def test_a_moving_key_is_listed_once_without_scripts(self, driver):
        """Where the server runs no scripts, names and sizes too are read after their range."""
        driver.scripts[0] = False
        scan_moving_keys(driver, reads=300)

    def test_stale_index_entries_are_not_listed(self, driver, redis_server):
        for k in ("s/1", "s/2", "s/3"):
            driver.put(k, b"x")
        r = redis_server.client(0)
        r.delete(f"{driver.prefix}:s/2")  # as RedisStore.__delitem__ would: the index is untouched
        for fetch in (KEYS, SIZES, VALUES):
            assert keys_of(driver.scan("s/", prefix_stop("s/"), fetch=fetch)) == ["s/1", "s/3"]
        assert keys_of(driver.transact(lambda t: list(t.scan("s/", "s0", fetch=SIZES)))) == ["s/1", "s/3"]
        assert driver.reindex() == 2
        assert r.zrangebylex(f"zarrfs.index.{driver.prefix}", "(", "+") == [b"s/1", b"s/3"]

    def test_index_rebuilt_from_keyspace(self, redis_server):
        prefix = f"rb{uuid.uuid4().hex[:8]}"
        r = redis_server.client(0)
        r.mset({f"{prefix}:g/.zgroup": b"{}", f"{prefix}:g/a/0": b"", f"{prefix}[x]:other": b"no"})
        r.hset(f"{prefix}:not-a-string", "f", "v")
        d = open_driver(redis_server.url(0, prefix=prefix))
        try:
            assert d.scan(fetch=SIZES) == [("g/.zgroup", 2), ("g/a/0", 0)]
        finally:
            d.close()
        r.delete(f"zarrfs.index.{prefix}")  # a lost index is rebuilt on the next open
        ro = open_driver(redis_server.url(0, prefix=prefix), readonly=True)
        try:  # read-only and no index: correct listings by scanning the keyspace
            assert keys_of(ro.scan()) == ["g/.zgroup", "g/a/0"]
            assert not r.exists(f"zarrfs.index.{prefix}")
        finally:
            ro.close()

    def test_write_conflict_is_retried(self, driver, url):
        other = open_driver(url)
        driver.put("c", b"0")
        driver.backoff = 0.001
        calls = []

        def fn(t):
            calls.append(1)
            value = t.get("c")
            if len(calls) == 1:
                other.put("c", b"100")  # a concurrent writer changes what we read
            t.put("c", str(int(value) + 1).encode())

        driver.transact(fn)
        other.close()
        assert len(calls) == 2
        assert driver.get("c") == b"101"

    def test_read_many_conflicts_are_retried(self, driver, url):
        other = open_driver(url)
        driver.put("c", b"0")
        driver.backoff = 0.001
        calls = []

        def fn(t):  # a get in a batch is watched like a single get
            calls.append(1)
            (value,) = t.read_many([("get", "c", DATA)])
            if len(calls) == 1:
                other.put("c", b"100")
            t.put("c", str(int(value) + 1).encode())

        def below(t):  # so is the index, for a prefix read: a new key under it conflicts
            calls.append(1)
            (found,) = t.read_many([("prefix", "dir/", DATA)])
            if len(calls) == 1:
                other.put("dir/x", b"1")
            t.put("flag", b"1" if found else b"0")

        try:
            driver.transact(fn)
            assert len(calls) == 2
            assert driver.get("c") == b"101"
            calls.clear()
            driver.transact(below)
            assert len(calls) == 2
            assert driver.get("flag") == b"1"
        finally:
            other.close()

    def test_round_trips(self, driver, url, monkeypatch):
        sent = record_redis_calls(monkeypatch, driver, unwatch=True)
        driver.put("f/a", b"1")
        probe = [("size", "f/a", DATA), ("prefix", "f/a/", DATA), ("get", "a:f/a", SIDE)]
        sent.clear()
        assert driver.transact(lambda t: t.read_many(probe), write=False) == [1, False, None]
        # One round trip: nothing watched (one read needs no check), and nothing else is sent.
        assert sent == [["EXISTS", "STRLEN", "ZRANGEBYLEX", "GET"]]
        sent.clear()
        # A read of two round trips: the second watches the first's keys (not the index) and
        # its own, reads the first's again behind the WATCH, and it ends with an empty
        # MULTI/EXEC, its check.
        driver.transact(lambda t: (t.read_many(probe), t.get("f/a")), write=False)
        again = ["WATCH", "EXISTS", "STRLEN", "ZRANGEBYLEX", "GET", "GET"]
        assert sent == [["EXISTS", "STRLEN", "ZRANGEBYLEX", "GET"], again, ["MULTI", "EXEC"]]
        sent.clear()
        # A write transaction takes the answers of reads this driver made before (guesses):
        # their checks, then the writes, in one round trip.
        driver.transact(lambda t: (t.read_many(probe), t.read_many(probe), t.put("f/b", b"2")))
        assert [c[:3] for c in sent] == [["WATCH", "EVAL", "MULTI"]] and sent[0][-1] == "EXEC"
        assert driver.get("f/b") == b"2"
        sent.clear()
        guesses, driver.guesses = driver.guesses, None  # reading for real
        driver.transact(lambda t: (t.read_many(probe), t.read_many(probe), t.put("f/b", b"3")))
        driver.guesses = guesses
        assert len(sent) == 3  # the reads (each with its WATCH) and MULTI ... EXEC
        assert sent[0][0] == "WATCH" and sent[1][0] != "WATCH"
        assert sent[2][0] == "MULTI" and sent[2][-1] == "EXEC"
        assert driver.get("f/b") == b"3"

        # A write transaction that ends without EXEC owes an UNWATCH: it rides on the next call,
        # and a change to what it watched does not fail the next transaction.
        other = open_driver(url)
        try:
            sent.clear()

            class Stop(Exception):
                pass

            def abandoned(t):
                t.get("f/a")
                raise Stop

            with pytest.raises(Stop):
                driver.transact(abandoned)
            # Raised on a guessed answer: run again reading, where it raises all the same.
            assert sent == [["WATCH", "GET"]]
            other.put("f/a", b"changed")
            attempts = []
            driver.transact(lambda t: (attempts.append(1), t.put("f/c", t.get("f/b") + b"!")))
            assert attempts == [1]
            assert sent[1][:2] == ["UNWATCH", "WATCH"]
            assert driver.get("f/c") == b"3!"
        finally:
            other.close()

    def test_the_writing_link_is_never_given_to_two_threads(self, driver):
        """Threads taking the writing link at once (a writer and a feed's route check): each
        gets it or a link of its own, never the one another holds (two on one socket read
        each other's replies; the other waits out the timeout)."""
        import sys
        import threading

        held: set[int] = set()
        shared: list[str] = []
        guard = threading.Lock()
        links = driver._links

        def take() -> None:
            for _ in range(2000):
                link = links.acquire(True)
                with guard:
                    if id(link) in held:
                        shared.append(f"link {id(link)} given twice")
                    held.add(id(link))
                with guard:
                    held.discard(id(link))
                links.release(link)

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, nearly
        try:
            threads = [threading.Thread(target=take) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        assert shared == []

    def test_a_read_of_several_round_trips_runs_again_from_one_snapshot(self, driver, url, monkeypatch):
        """Redis has no read snapshot: a read transaction whose key changed between its round
        trips runs again (its second round trip reads the first's keys again behind their
        WATCH, and finds the change); that run reads what the first one read in one
        MULTI/EXEC, so it ends even while writers keep changing the key."""
        sent = record_redis_calls(monkeypatch, driver)
        driver.put("r/a", b"1")
        driver.put("r/b", b"1")
        other = open_driver(url)
        try:
            seen = []

            def fn(t):
                a = t.get("r/a")
                other.transact(lambda o: (o.put("r/a", b"2"), o.put("r/b", b"2")))  # every run
                seen.append((a, t.get("r/b")))
                return seen[-1]

            sent.clear()
            assert driver.transact(fn, write=False) == (b"2", b"2")
            assert seen == [(b"2", b"2")]  # the first run ended at its second read
            # The first run: its read unwatched, then the second watching both keys and
            # reading the first again, which changed: no half of the other commit is returned.
            assert sent[:2] == [["GET"], ["WATCH", "GET", "GET"]]
            assert sent[2][0] == "MULTI" and sent[2][-2:] == ["EXEC", "WATCH"]  # the second, at once
            assert len(sent) == 3  # its reads answered from that one round trip, and no check
        finally:
            other.close()

    def test_reads_made_apart_are_not_watched_nor_checked(self, driver, url, monkeypatch):
        """A read transaction's reads made ``apart`` (a listing's nodes) are not WATCHed: a
        change to one between round trips runs nothing again, and they cost no closing check;
        the reads around them are watched and checked as before."""
        sent = record_redis_calls(monkeypatch, driver)
        for name in ("n/a", "n/b", "n/c"):
            driver.put(name, b"1")
        other = open_driver(url)
        try:
            runs = []

            def fn(t):
                runs.append(1)
                first = t.read_many([Size("n/a", DATA), Get("n/b", DATA)], apart=True)
                other.put("n/a", b"22")  # every run: nothing apart is checked
                return first, t.read_many([Size("n/a", DATA), Get("n/b", DATA)], apart=True)

            sent.clear()
            assert driver.transact(fn, write=False) == ([1, b"1"], [2, b"1"])
            assert runs == [1]
            assert [c[0] for c in sent] == ["EXISTS", "EXISTS"]  # no WATCH, no MULTI/EXEC

            def mixed(t):  # one watched round trip and one apart: still no check
                return t.get("n/c"), t.read_many([Size("n/a", DATA)], apart=True)

            sent.clear()
            assert driver.transact(mixed, write=False) == (b"1", [2])
            assert [c[:2] for c in sent] == [["GET"], ["EXISTS", "STRLEN"]]

            def watched(t):  # a watched read that changed between round trips runs again
                runs.append(1)
                a = t.get("n/c")
                t.read_many([Size("n/a", DATA)], apart=True)
                if len(runs) == 1:
                    other.put("n/c", b"333")
                return a, t.get("n/b")

            runs.clear()
            assert driver.transact(watched, write=False) == (b"333", b"1")
            assert len(runs) == 2
        finally:
            other.close()

    def test_write_transaction_reads_a_value_once_and_a_change_still_retries(self, driver, url, monkeypatch):
        sent = record_redis_calls(monkeypatch, driver)
        monkeypatch.setattr(driver, "guesses", None)  # reading for real (guessed: the test below)
        driver.put("w/a", b"1")
        other = open_driver(url)
        try:
            seen = []

            def fn(t):
                first = t.get("w/a")
                again = (t.get("w/a"), t.read_many([("get", "w/a", DATA), ("size", "w/a", DATA)]))
                seen.append((first, again))
                if len(seen) == 1:  # another client changes the value after it was read
                    other.put("w/a", b"22")
                t.put("w/b", first + b"!")

            sent.clear()
            driver.transact(fn)
            # first attempt: one read (the second get and the size answered from it), an EXEC
            # that fails; then the retry reads again
            assert seen[0] == (b"1", (b"1", [b"1", 1]))
            assert sent[0] == ["WATCH", "GET"] and sent[1][0] == "MULTI" and sent[2] == ["WATCH", "GET"]
            assert seen[1][0] == b"22"  # the retry read the new value, not a remembered one
            assert driver.get("w/b") == b"22!"
        finally:
            other.close()

    def test_a_guessed_read_another_client_changed_is_found_by_the_commit(self, driver, url, monkeypatch):
        """A write transaction takes the value this driver last saw without reading it
        (``guesses``); the commit's checks find another client's change since: nothing is
        written, and the transaction runs again at once, reading, in the same call."""
        sent = record_redis_calls(monkeypatch, driver)
        driver.put("w/a", b"1")
        other = open_driver(url)
        try:
            seen = []

            def fn(t):
                seen.append(t.get("w/a"))
                if len(seen) == 1:  # another client changes the value after it was taken
                    other.put("w/a", b"22")
                t.put("w/b", seen[-1] + b"!")

            sent.clear()
            driver.transact(fn)
            assert seen == [b"1", b"22"]
            runs = [["WATCH", "EVAL", "MULTI"], ["WATCH", "GET"], ["MULTI", "SET", "ZADD"]]
            assert [c[:3] for c in sent] == runs
            assert driver.get("w/b") == b"22!"
            assert (driver.guesses.holds, driver.guesses.misses) == (0, 1)
            # What the run that read learnt is taken next time: one round trip again, once
            # the transactions that read after a wrong guess are done.
            for _ in range(20):
                sent.clear()
                driver.transact(lambda t: t.put("w/c", t.get("w/a") + b"?"))
                if len(sent) == 1:
                    break
            assert [c[:2] for c in sent] == [["WATCH", "EVAL"]] and driver.get("w/c") == b"22?"
        finally:
            other.close()

    def test_reply_polling_window_adapts(self, driver):
        from zarrfs.backends.redis.link import SPIN

        link = driver._acquire()
        try:
            if not link.fast:
                pytest.skip("replies are read by redis-py here, without polling")
            self._quick_reply_refills(link)
            assert link.spin == SPIN
            link.call([("BLPOP", f"{driver.prefix}:nothing", "0.02")])  # a 20 ms reply
            assert link.spin == SPIN / 2
            link.call([("BLPOP", f"{driver.prefix}:nothing", "0.02")])
            assert link.spin == SPIN / 4
            self._quick_reply_refills(link)  # quick again: the full window is back
            assert link.spin == SPIN
        finally:
            link.busy = False

    @staticmethod
    def _quick_reply_refills(link) -> None:
        """PING until one reply comes within the window.

        A busy machine can delay every reply for a while (a CI run once saw 50 PINGs in a row
        slower than the window), so this keeps trying for a minute, not for a count."""
        from zarrfs.backends.redis.link import SPIN

        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            link.call([("PING",)])
            if link.spin == SPIN:
                return
            time.sleep(0.001)  # let whatever is keeping the machine busy get on

    def test_one_shot_helpers_inside_a_transaction(self, driver):
        driver.put("n/a", b"1")

        def fn(t):
            seen = (t.get("n/a"), driver.get("n/a"), driver.size("n/a"), driver.read("n/a", 0, 1))
            t.put("n/b", b"2")
            seen += (driver.get("n/b"), t.get("n/b"))
            return seen

        assert driver.transact(fn) == (b"1", b"1", 1, b"1", None, b"2")
        assert driver.get("n/b") == b"2"

    def test_reconnects_after_the_server_closed_an_idle_connection(self, driver, redis_server, monkeypatch):
        from zarrfs.backends.redis import link as redis_link

        driver.put("k", b"v")
        (cid,) = driver._oneshot([("CLIENT", "ID")])
        redis_server.client(0).client_kill_filter(_id=cid)
        monkeypatch.setattr(redis_link, "IDLE_CHECK", 0.0)
        assert driver.get("k") == b"v"
        assert driver.transact(lambda t: t.read_many([("get", "k", DATA)]), write=False) == [b"v"]

    def test_the_gets_of_a_batch_of_reads_are_one_mget(self, driver, monkeypatch):
        """A batch of reads sends its GETs as one MGET (a folder's snapshot reads two records
        per child), answers in the plan's order; a lone GET stays a GET."""
        from zarrfs.backends.redis import link as redis_link

        driver.put("a", b"1")
        driver.put("c", b"333", SIDE)
        sent = []
        real = redis_link.Link.call
        monkeypatch.setattr(
            redis_link.Link, "call", lambda s, cmds, *a, **k: sent.append(cmds) or real(s, cmds, *a, **k)
        )
        plan = [("get", "a", DATA), ("size", "a", DATA), ("get", "b", DATA), ("get", "c", SIDE)]
        assert driver.transact(lambda t: t.read_many(plan), write=False) == [b"1", 1, None, b"333"]
        ops = [c[0] for cmds in sent for c in cmds]
        assert ops.count("MGET") == 1 and "GET" not in ops
        sent.clear()
        assert driver.transact(lambda t: t.read_many([("get", "c", SIDE)]), write=False) == [b"333"]
        assert [c[0] for cmds in sent for c in cmds].count("GET") == 1

    def test_a_large_value_is_received_into_its_own_buffer(self, driver, monkeypatch):
        """A lone reply of a large value is read straight into one buffer (not through
        hiredis): exact at, below and above the threshold, whatever the socket hands over at a
        time, and the link goes on serving the next calls."""
        from zarrfs.backends.redis import link as redis_link

        limit = redis_link.BIG_REPLY
        values = {f"v{n}": os.urandom(n) for n in (limit - 1, limit, limit + 1, 3 * limit + 5, 0)}
        for key, value in values.items():
            driver.put(key, value)
        taken = []
        real = redis_link.Link._bulk
        monkeypatch.setattr(redis_link.Link, "_bulk", lambda self, *a: taken.append(a[-1]) or real(self, *a))
        for key, value in values.items():
            assert driver.get(key) == value
            assert driver.read(key, 1, 10) == value[1:11]
        assert taken == [limit, limit + 1, 3 * limit + 5]
        assert driver.get("missing") is None and driver.transact(
            lambda t: t.read_many([("get", "v0", DATA), ("get", f"v{limit}", DATA)]), write=False
        ) == [b"", values[f"v{limit}"]]

    def test_a_commit_of_values_around_the_copying_bound_stores_each_whole(self, driver):
        """Values longer than ``BIG_ARG`` go as buffers of their own, the commit's pieces in
        one ``sendmsg`` (more than the socket's buffer and than ``IOV_MAX`` pieces here)."""
        from zarrfs.backends.redis import link as redis_link

        bound = redis_link.BIG_ARG
        sizes = [0, 1, bound - 1, bound, bound + 1, 4 << 20] + [bound + 7] * (redis_link.IOV_MAX // 2 + 3)
        values = {f"b/{i}": os.urandom(n) for i, n in enumerate(sizes)}

        def fn(t):
            for key, value in values.items():
                t.put(key, memoryview(bytearray(value)) if len(value) % 2 else value)

        driver.transact(fn)
        plan = [("get", k, DATA) for k in values]
        assert driver.transact(lambda t: t.read_many(plan), write=False) == list(values.values())

    def test_only_a_short_commands_long_value_is_a_piece_of_its_own(self):
        """A commit's encoding: the long value of a ``SET`` goes as the caller's own buffer;
        a command of more than ``VALUED`` arguments (the checks' ``EVAL``, a ``WATCH`` of many
        names) is packed whole without looking through its arguments, even one holding a long
        argument (copied, and still the same bytes on the wire)."""
        import hiredis

        from zarrfs.backends.redis import link as redis_link

        value = memoryview(bytearray(os.urandom(redis_link.BIG_ARG + 1)))
        long_arg = os.urandom(redis_link.BIG_ARG + 5)
        names = [b"p:d:a/%d" % i for i in range(redis_link.VALUED + 3)]
        commands = [
            ("WATCH", *names),
            ("EVAL", "return 1", len(names), *names, 7, long_arg),
            ("MULTI",),
            ("SET", b"p:d:a/0", value),
            ("SET", b"p:s:a/0", b"small"),
            ("EXEC",),
        ]
        pieces = redis_link._pack_big(commands)
        assert b"".join(bytes(p) for p in pieces) == b"".join(hiredis.pack_command(c) for c in commands)
        # What comes before the value (the long EVAL with it), the value, what comes after.
        assert len(pieces) == 3 and pieces[1] is value

    def test_pieces_are_sent_in_order_however_much_the_socket_takes_at_once(self):
        from zarrfs.backends.redis import link as redis_link

        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        pieces = [os.urandom(n) for n in (5, 0, 70_000, 1, 3000)] * 400  # > IOV_MAX buffers
        pieces[7] = memoryview(bytearray(b"in a bytearray"))
        want = b"".join(bytes(p) for p in pieces)
        got = bytearray()

        def drain():
            while len(got) < len(want):
                got.extend(b.recv(1 << 16))

        reader = threading.Thread(target=drain)
        reader.start()
        try:
            redis_link._send_pieces(a, pieces)
            reader.join(60)
        finally:
            a.close()
            b.close()
        assert bytes(got) == want

    def test_stale_entries_are_not_listed_from_an_earlier_scan(self, driver, redis_server):
        for k in ("t/1", "t/2", "t/3", "t/2/x"):
            driver.put(k, b"x")
        redis_server.client(0).delete(f"{driver.prefix}:t/2", f"{driver.prefix}:t/2/x")

        def run(t):
            return (
                list(t.scan("t/", "t0", limit=10)),
                list(t.scan("t/2", "t/3")),
                list(t.scan("t/2/", "t/20")),
            )

        assert driver.transact(run, write=False) == ([("t/1", None), ("t/3", None)], [], [])

        r = redis_server.client(0)
        for i in range(60):
            driver.put(f"u/{i:02d}", b"x")
        r.delete(*[f"{driver.prefix}:u/{i:02d}" for i in range(0, 60, 7)])

        def paging(t):
            seen, pos = [], "u/"
            while True:
                page = keys_of(t.scan(pos, "u0", limit=5))
                seen += page
                if len(page) < 5:
                    return seen
                pos = page[-1] + "\0"

        assert driver.transact(paging, write=False) == [f"u/{i:02d}" for i in range(60) if i % 7]

    def test_unix_socket_url(self, driver, redis_server):
        driver.put("via/tcp", b"1")
        other = open_driver(f"unix://{redis_server.unix_socket}?db=0&prefix={driver.prefix}")
        try:
            assert other.get("via/tcp") == b"1"
            other.put("via/unix", b"2")
            assert driver.scan("via/", "via0", fetch=VALUES) == [("via/tcp", b"1"), ("via/unix", b"2")]
        finally:
            other.close()

    def test_password_not_in_messages(self):
        from zarrfs.backends.base import UnavailableError

        with pytest.raises(UnavailableError) as info:
            open_driver("redis://:s3cret@127.0.0.1:1/0")
        assert "s3cret" not in str(info.value)

    def test_unreachable_server(self):
        from zarrfs.backends.base import UnavailableError

        with pytest.raises(UnavailableError):
            open_driver("redis://127.0.0.1:1/0")


class _Closing:
    """Context manager yielding a driver and closing it afterwards."""

    def __init__(self, driver):
        self.driver = driver

    def __enter__(self):
        return self.driver

    def __exit__(self, *exc):
        self.driver.close()


class _SQLiteFull(_Closing):
    """An SQLite database capped with ``PRAGMA max_page_count`` (a full disk, for SQLite)."""

    def __init__(self, url):
        super().__init__(open_driver(url.replace("x.db", "small.db")))
        # The pragma is per connection: this thread's, which the test's transaction uses.
        self.driver._conn().execute("PRAGMA max_page_count = 64")


class _RedisFull(_Closing):
    """The session's Redis with ``maxmemory`` set below its usage, restored afterwards."""

    def __init__(self, url):
        super().__init__(open_driver(url))

    def __enter__(self):
        self.driver.client.config_set("maxmemory", 1)
        return self.driver

    def __exit__(self, *exc):
        self.driver.client.config_set("maxmemory", 0)
        super().__exit__(*exc)


# --- the registry ----------------------------------------------------------------------------------


class TestRegistry:
    """URL scheme -> driver."""

    def test_unknown_scheme_lists_known(self):
        with pytest.raises(DriverNotFoundError) as info:
            open_driver("nosuch://x")
        for scheme in ("lmdb", "sqlite", "redis", "rediss", "unix", "memory"):
            assert scheme in str(info.value)

    def test_builtin_schemes(self):
        assert {"lmdb", "sqlite", "redis", "rediss", "unix", "memory"} <= set(registry.known_schemes())
        assert registry.driver_class("REDISS").__name__ == "RedisDriver"
        assert registry.driver_class("unix").__name__ == "RedisDriver"

    def test_register(self):
        registry.register("mem2", "zarrfs.backends.memory.driver:MemoryDriver")
        d = open_driver("mem2://name")
        assert type(d).__name__ == "MemoryDriver"
        registry.register("mem2", "zarrfs.backends.lmdb.driver:LMDBDriver", clobber=False)
        assert registry.driver_class("mem2").__name__ == "MemoryDriver"
        with pytest.raises(ValueError):
            registry.register("bad", "no-colon")

    def test_missing_dependency_names_pip_package(self, tmp_path, monkeypatch):
        (tmp_path / "zarrfs_needs_dep.py").write_text("import zarrfs_absent_dependency_xyz\nclass D: pass\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        registry.register("needsdep", "zarrfs_needs_dep:D")
        with pytest.raises(DriverNotFoundError, match="pip install zarrfs_absent_dependency_xyz"):
            open_driver("needsdep://x")
        registry.register("needsdep2", "zarrfs_needs_dep:D", pip="zarrfs-extra-dist")
        with pytest.raises(DriverNotFoundError, match="pip install zarrfs-extra-dist"):
            open_driver("needsdep2://x")
        registry.register("nomodule", "zarrfs_no_such_module_at_all:D")
        with pytest.raises(DriverNotFoundError, match="cannot import"):
            open_driver("nomodule://x")

    @pytest.mark.parametrize(("url", "package"), [("/tmp/x.lmdb", "lmdb"), ("redis://localhost/0", "redis")])
    def test_builtin_driver_without_its_dependency(self, url, package):
        import subprocess

        script = (
            f"import sys; sys.modules[{package!r}] = None\n"  # the import of the package now fails
            "from zarrfs.backends import open_driver\n"
            "from zarrfs.backends.base import DriverNotFoundError\n"
            "try:\n"
            f"    open_driver({url!r})\n"
            "except DriverNotFoundError as exc:\n"
            "    print(exc)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
        assert f"pip install {package}" in out

    def test_not_a_driver(self):
        registry.register("notdriver", "json:JSONDecoder")
        with pytest.raises(DriverNotFoundError):
            open_driver("notdriver://x")

    def test_entry_points(self, tmp_path, monkeypatch):
        dist = tmp_path / "zarrfs_plugin-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zarrfs-plugin\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(
            "[zarrfs.backends]\nplugmem = zarrfs.backends.memory.driver:MemoryDriver\n"
            "lmdb = zarrfs.backends.memory.driver:MemoryDriver\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        registry.load_entry_points(force=True)
        assert "plugmem" in registry.known_schemes()
        assert type(open_driver("plugmem://x")).__name__ == "MemoryDriver"
        assert registry.driver_class("lmdb").__name__ == "LMDBDriver"  # a plugin never replaces a built-in

    def test_bad_option(self, tmp_path):
        from zarrfs.backends.base import BackendError

        with pytest.raises(BackendError, match="unknown option"):
            open_driver(f"lmdb://{tmp_path}/d?mapsize=1")

    @pytest.mark.parametrize(
        "query, said",
        [
            ("lmdb:{d}/a.lmdb?map_size=-1", "not a size in bytes"),
            ("lmdb:{d}/a.lmdb?map_size=10**100000000", "not a size in bytes"),  # not minutes of CPU
            ("lmdb:{d}/a.lmdb?map_size=2**65", "not a size in bytes"),
            ("lmdb:{d}/a.lmdb?map_max=-1K", "not a size in bytes"),
            ("sqlite:{d}/a.db?timeout=nan", "not a number of seconds"),
            ("sqlite:{d}/a.db?timeout=inf", "not a number of seconds"),
            ("sqlite:{d}/a.db?timeout=-5", "not a number of seconds"),
            ("sqlite:{d}/a.db?timeout=soon", "not a number of seconds"),
        ],
    )
    def test_sizes_and_times_in_a_url_are_checked(self, tmp_path, query, said):
        from zarrfs.backends.base import BackendError

        with pytest.raises(BackendError, match=said):  # 10**100000000: refused before it is worked out
            open_driver(query.format(d=f"//{tmp_path}"))
        assert list(tmp_path.iterdir()) == []  # nothing made

    def test_sizes_and_times_in_a_url_within_their_ranges_are_taken(self, tmp_path):
        with open_driver(f"lmdb://{tmp_path}/a.lmdb?map_size=2**34&map_max=1T") as d:
            assert d.map_size == 2**34
        with open_driver(f"sqlite://{tmp_path}/a.db?timeout=0.5") as d:
            assert d.timeout == 0.5

    @pytest.mark.parametrize("db", ["\u00b2", "\uff10", "%C2%B2"])
    def test_a_redis_database_number_is_ascii_digits(self, db):
        """``/²`` (a digit to ``str.isdigit``, not to Redis) was taken for database 0."""
        from zarrfs.backends.base import BackendError

        with pytest.raises(BackendError, match="is not a database number"):
            open_driver(f"redis://127.0.0.1:1/{db}")

    def test_a_postgres_table_name_ending_in_a_newline_is_refused(self):
        """The table name is checked before any connection: a plain identifier, whole (a
        pattern's ``$`` would also match before a newline at the end)."""
        from zarrfs.backends.base import BackendError

        with pytest.raises(BackendError, match="not a plain SQL identifier"):
            open_driver("postgresql://127.0.0.1:1/db?table=t%0A")


# --- Redis at scale -------------------------------------------------------------------------------


@pytest.mark.slow
def test_redis_listing_touches_only_the_listed_folder(redis_server):
    """1,000,000 keys written as RedisStore writes them (no index); listing a small folder must
    read only that folder's entries, measured by Redis' own command and keyspace counters."""
    db = 3
    r = redis_server.client(db)
    r.flushdb()
    n, batch = 1_000_000, 20_000
    value = b"x" * 8
    for start in range(0, n, batch):
        r.mset({f"zarr:big/0/{i}": value for i in range(start, start + batch)})
    small = {f"zarr:small/{name}": b"v" * i for i, name in enumerate([".zarray", "0", "1", "2", "sub/0"])}
    r.mset(small)
    assert r.dbsize() == n + len(small)

    d = open_driver(redis_server.url(db))  # builds the index once with SCAN
    try:
        r.config_resetstat()
        listing = d.scan("small/", prefix_stop("small/"), fetch=SIZES)
        stats = r.info("commandstats")
        keyspace = r.info("stats")
        assert listing == [(k.split(":", 1)[1], len(v)) for k, v in sorted(small.items())]
        calls = {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}
        assert calls.get("zrangebylex") == 1
        assert "scan" not in calls and "keys" not in calls
        assert calls.get("strlen") == len(small)
        touched = keyspace["keyspace_hits"] + keyspace["keyspace_misses"]
        assert touched <= 2 * len(small) + 2, touched

        # A page of the huge folder touches only that page.
        r.config_resetstat()
        page = d.scan("big/0/", prefix_stop("big/0/"), limit=10)
        assert len(page) == 10
        keyspace = r.info("stats")
        assert keyspace["keyspace_hits"] + keyspace["keyspace_misses"] <= 10 + 10 + 2
    finally:
        d.close()
        r.flushdb()


# --- zarr-python 2.18 interoperability ----------------------------------------------------------

# The store of argv[1] (its kind) at argv[2] (a path, or "host,port,db,prefix" for Redis).
ZARR2_STORE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import zarr
kind, target = sys.argv[1], sys.argv[2]
if kind == "lmdb":
    store = zarr.LMDBStore(target)
elif kind == "lmdb-file":
    store = zarr.LMDBStore(target, subdir=False)
elif kind == "sqlite":
    store = zarr.SQLiteStore(target)
else:
    host, port, db, prefix = target.split(",")
    store = zarr.RedisStore(prefix=prefix, host=host, port=int(port), db=int(db))
"""

ZARR2_WRITE = ZARR2_STORE + r"""
import numcodecs, numpy as np
root = zarr.group(store=store, overwrite=True)
root.attrs["title"] = "zarrfs interop"
a = root.create_dataset("blosc", shape=(100, 37), chunks=(16, 16), dtype="f8",
                        compressor=numcodecs.Blosc("zstd", 3, shuffle=2))
a[:] = np.arange(3700).reshape(100, 37) * 0.5
a.attrs["units"] = "m"
g = root.create_group("sub/deeper")
z = g.create_dataset("zstd", shape=(50,), chunks=(7,), dtype="i4", compressor=numcodecs.Zstd(5))
z[:] = np.arange(50) ** 2
n = root.create_dataset("nested", shape=(20, 20), chunks=(5, 5), dtype="u2",
                        dimension_separator="/", compressor=None)
n[:] = np.arange(400).reshape(20, 20)
root.create_dataset("filled", shape=(10,), chunks=(5,), dtype="i1", fill_value=7)
if kind != "sqlite":
    # SQLiteStore shares one cursor between iteration and __getitem__, so zarr 2's own
    # consolidate_metadata sees only the first key there: a zarr bug, not ours.
    zarr.consolidate_metadata(store)
dump = {k: bytes(v).hex() for k, v in store.items()}
print(json.dumps(dump))
if hasattr(store, "close"):
    store.close()
"""

ZARR2_READ = ZARR2_STORE + r"""
out = {"keys": sorted(store.keys()), "arrays": {}}
root = zarr.open_consolidated(store, mode="r") if ".zmetadata" in store else zarr.open_group(store, mode="r")
out["attrs"] = dict(root.attrs)
for path, arr in root.arrays(recurse=True):
    out["arrays"][arr.path] = {"dtype": str(arr.dtype), "shape": list(arr.shape),
                                "values": arr[...].ravel().tolist(), "attrs": dict(arr.attrs)}
print(json.dumps(out))
if hasattr(store, "close"):
    store.close()
"""


def _zarr2_target(kind, tmp_path, redis_server, prefix):
    if kind == "lmdb":
        return str(tmp_path / "z2.lmdb"), f"lmdb://{tmp_path}/z2.lmdb"
    if kind == "lmdb-file":
        return str(tmp_path / "z2.mdb"), f"lmdb://{tmp_path}/z2.mdb"
    if kind == "sqlite":
        return str(tmp_path / "z2.sqlite"), f"sqlite://{tmp_path}/z2.sqlite"
    db = 2
    return f"{redis_server.host},{redis_server.port},{db},{prefix}", redis_server.url(db, prefix=prefix)


def _v2_hierarchy():
    """Keys and bytes of a zarr v2 hierarchy written by zarr-python 3, plus the expected arrays."""
    import numcodecs
    import zarr
    from zarr.storage import MemoryStore

    data: dict = {}
    root = zarr.open_group(store=MemoryStore(data), mode="w", zarr_format=2)
    root.attrs["written_by"] = "zarr 3 via zarrfs"
    expected = {}
    a = root.create_array(
        "temp", shape=(30, 40), chunks=(8, 16), dtype="f4", compressors=numcodecs.Blosc("lz4", 5, shuffle=1)
    )
    a[:] = expected["temp"] = np.linspace(0, 1, 1200, dtype="f4").reshape(30, 40)
    b = root.create_group("grp").create_array(
        "counts", shape=(25,), chunks=(10,), dtype="i8", compressors=numcodecs.Zstd(3)
    )
    b[:] = expected["grp/counts"] = np.arange(25, dtype="i8") * 3
    c = root.create_array(
        "nested",
        shape=(6, 6),
        chunks=(3, 3),
        dtype="u1",
        compressors=None,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    c[:] = expected["nested"] = np.arange(36, dtype="u1").reshape(6, 6)
    zarr.consolidate_metadata(root.store)
    keys = {k: v.to_bytes() for k, v in data.items()}
    return keys, expected


ZARR2_KINDS = ["lmdb", "lmdb-file", "sqlite", "redis"]


@pytest.mark.parametrize("kind", ZARR2_KINDS)
def test_zarr2_written_database_reads_key_for_key(kind, tmp_path, redis_server, zarr2_python):
    """What zarr 2.18's LMDBStore / SQLiteStore / RedisStore writes, the driver reads exactly;
    side data the driver adds stays invisible to those classes."""
    prefix = f"z{uuid.uuid4().hex[:8]}"
    target, url = _zarr2_target(kind, tmp_path, redis_server, prefix)
    dump = json.loads(zarr2env.run(zarr2_python, ZARR2_WRITE, kind, target))
    assert ".zgroup" in dump and "nested/0/0" in dump and "sub/deeper/zstd/0" in dump
    d = open_driver(url)
    try:
        got = {k: v.hex() for k, v in d.scan(fetch=VALUES)}
        assert got == dump
        assert keys_of(d.scan()) == sorted(dump)
        assert {k: v for k, v in d.scan(fetch=SIZES)} == {k: len(v) // 2 for k, v in dump.items()}
        for k, v in dump.items():
            assert d.get(k) == bytes.fromhex(v)
        assert keys_of(d.scan("sub/", prefix_stop("sub/"))) == sorted(k for k in dump if k.startswith("sub/"))
        for k in dump:
            d.put(k, b"mtime=1", SIDE)
        d.put("empty/folder/", b"dir", SIDE)
    finally:
        d.close()
    seen = json.loads(zarr2env.run(zarr2_python, ZARR2_READ, kind, target))
    assert seen["keys"] == sorted(dump)  # side data never shows up among zarr's keys
    assert seen["arrays"]["blosc"]["values"][:3] == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("kind", ZARR2_KINDS)
def test_driver_written_database_opens_in_zarr2(kind, tmp_path, redis_server, zarr2_python):
    """A hierarchy copied key by key through the driver (as a mount writes it) opens in zarr 2.18
    with equal values, and zarr 2 lists exactly the data keys."""
    prefix = f"y{uuid.uuid4().hex[:8]}"
    target, url = _zarr2_target(kind, tmp_path, redis_server, prefix)
    if kind == "lmdb-file":  # the driver makes a single-file environment only when the file exists
        import lmdb

        lmdb.open(target, subdir=False).close()
    keys, expected = _v2_hierarchy()
    d = open_driver(url)
    try:
        d.transact(lambda t: [t.put(k, v) for k, v in keys.items()])
        d.put("grp/counts", b"side data", SIDE)
        d.put("zarrfs/epoch", b"1", SIDE)
    finally:
        d.close()
    seen = json.loads(zarr2env.run(zarr2_python, ZARR2_READ, kind, target))
    assert seen["keys"] == sorted(keys)
    assert seen["attrs"] == {"written_by": "zarr 3 via zarrfs"}
    assert set(seen["arrays"]) == set(expected)
    for path, arr in expected.items():
        got = seen["arrays"][path]
        assert got["shape"] == list(arr.shape)
        assert np.array_equal(np.array(got["values"], dtype=arr.dtype), arr.ravel())


def test_zarr2_environment_is_real(zarr2_python):
    """The interop tests above ran against zarr 2.18 itself, not a stand-in."""
    out = zarr2env.run(zarr2_python, "import zarr, sys; print(zarr.__version__, sys.prefix)")
    assert out.startswith("2.18."), out
    assert os.path.realpath(out.split()[1]) != os.path.realpath(sys.prefix)


# --- drivers beyond one machine, and DBM ------------------------------------------------------


class TestPostgres(_Conformance):
    """``postgresql://``, on the session's PostgreSQL server; a fresh table per test."""

    @pytest.fixture
    def url(self, postgres_server):
        return postgres_server.url(table=f"t{uuid.uuid4().hex[:12]}")

    def test_layout_is_sqlitestore_shaped(self, driver, url, postgres_server):
        driver.put("a/.zarray", b"{}")
        driver.put("a", b"side", SIDE)
        table = url.rsplit("table=", 1)[1]
        with postgres_server.connect() as conn:
            rows = conn.execute(f'SELECT k, v FROM "{table}" ORDER BY k').fetchall()
            assert rows == [("a/.zarray", b"{}")]
            cols = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s"
                " ORDER BY ordinal_position",
                (table,),
            ).fetchall()
            assert cols == [("k", "text"), ("v", "bytea")]
            assert conn.execute(f'SELECT k FROM "{table}_side"').fetchall() == [("a",)]

    def test_statfs_without_the_data_directory_is_the_database_size(self, driver, url, postgres_server):
        """A role that may not read the data directory's path: the size of the database is
        what is used, the free space unknown (UNKNOWN_FREE); a superuser gets the disk."""
        from zarrfs.backends.postgres.driver import UNKNOWN_FREE

        role = f"r{uuid.uuid4().hex[:8]}"
        table = url.rsplit("table=", 1)[1]
        with postgres_server.connect() as conn:
            conn.execute(f'CREATE ROLE {role} LOGIN; GRANT SELECT ON "{table}", "{table}_side" TO {role}')
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        assert driver.statfs()["total"] < size + UNKNOWN_FREE  # the superuser's: the disk
        other = open_driver(url.replace(f"{postgres_server.user}@", f"{role}@"), readonly=True)
        try:
            seen = other.statfs()
        finally:
            other.close()
        assert seen["free"] == UNKNOWN_FREE and abs(seen["total"] - UNKNOWN_FREE - size) < 1 << 20, seen

    def test_password_file_and_no_password_in_messages(self, postgres_server, tmp_path):
        secret = tmp_path / "pw"
        secret.write_text("s3cret\n")
        url = postgres_server.url(table="pw", password_file=str(secret))
        d = open_driver(url)  # trust authentication: any password is accepted, it must not show
        assert "s3cret" not in d.where
        d.close()

    def test_a_batch_of_reads_is_a_statement_per_kind_not_per_key(self, driver, tmp_path):
        """A listing's window reads the size, attributes and link pointer of every name (three
        reads a name, thousands a window): the sizes, and the values, of one space are one
        statement each, not one per key (which cost a folder of 10^5 names 70 s to list). The
        statements are counted from libpq's trace of what the client sent."""
        from zarrfs.backends.base import Get, HasPrefix, Size

        n = 300
        driver.transact(lambda t: [t.put(f"a/{i:03d}", b"x" * i) for i in range(0, n, 2)])
        driver.transact(lambda t: [t.put(f"m/{i:03d}", b"s%d" % i, SIDE) for i in range(0, n, 3)])
        plan = [Size(f"a/{i:03d}") for i in range(n)] + [Get(f"m/{i:03d}", SIDE) for i in range(n)]
        plan += [Get("a/004"), Get("a/004"), HasPrefix("a/"), HasPrefix("b/")]
        trace = tmp_path / "trace"

        def run(t):
            driver.conn.pgconn.trace(fd.fileno())
            try:
                return t.read_many(plan)
            finally:
                driver.conn.pgconn.untrace()

        with open(trace, "w") as fd:
            got = driver.transact(run, write=False)
        assert got == [i if i % 2 == 0 else None for i in range(n)] + [
            b"s%d" % i if i % 3 == 0 else None for i in range(n)
        ] + [b"x" * 4, b"x" * 4, True, False]
        sent = [line.split("\t") for line in trace.read_text().splitlines()]  # [time,] F|B, length, message
        statements = [f for f in sent if "F" in f[:2] and ("Parse" in f[:4] or "Query" in f[:4])]
        assert 1 <= len(statements) <= 6, statements  # BEGIN, sizes, values x2 spaces, two prefixes

    @staticmethod
    def _exchanges(driver, monkeypatch) -> list[list[str]]:
        """Record each exchange's statements (their first words) of ``driver``'s transactions."""
        from zarrfs.backends.postgres.txn import PostgresTxn

        sent: list[list[str]] = []
        real = PostgresTxn._exchange

        def exchange(self, conn, query=None, params=None):
            if conn.driver is driver:
                items = self.queued if query is None else [*self.queued, (query, params)]
                texts = [q if isinstance(q, str) else bytes(q).decode() for q, _ in items]
                sent.append([" ".join(t.split("(")[0].split()[:2]) for t in texts])
            return real(self, conn, query, params)

        monkeypatch.setattr(PostgresTxn, "_exchange", exchange)
        return sent

    def test_a_guessed_read_another_client_changed_is_found_by_the_commit(self, driver, url, monkeypatch):
        """A write transaction takes the value this driver last saw without reading it
        (``postgres.guesses``), and sends the check of it with its writes and COMMIT: one
        round trip. Another client's change since fails the check: nothing is written, and
        the transaction runs again at once, reading, in the same call."""
        driver.put("w/a", b"1")
        sent = self._exchanges(driver, monkeypatch)
        driver.transact(lambda t: t.put("w/b", t.get("w/a") + b"."))
        checked = ["BEGIN ISOLATION", "SELECT pg_temp.zarrfs_guessed"]
        assert len(sent) == 1 and sent[0][:2] == checked
        assert sent[0][-1] == "COMMIT" and driver.guesses.holds == 1
        other = open_driver(url)
        try:
            seen = []

            def fn(t):
                seen.append(t.get("w/a"))
                if len(seen) == 1:  # another client changes the value after it was taken
                    other.put("w/a", b"22")
                t.put("w/b", seen[-1] + b"!")

            sent.clear()
            driver.transact(fn)
            assert seen == [b"1", b"22"]
            assert len(sent) == 3 and sent[0][:2] == checked, sent  # failed check
            assert sent[1][:2] == ["BEGIN ISOLATION", "SELECT 0::int2,"]  # read, then the writes
            assert "SELECT pg_temp.zarrfs_guessed" not in sent[2]
            assert driver.get("w/b") == b"22!" and other.get("w/b") == b"22!"
            assert (driver.guesses.holds, driver.guesses.misses) == (1, 1)
            # What the run that read learnt is taken next time: one round trip again, once
            # the transactions that read after a wrong guess are done.
            for _ in range(20):
                sent.clear()
                driver.transact(lambda t: t.put("w/c", t.get("w/a") + b"?"))
                if len(sent) == 1:
                    break
            assert len(sent) == 1 and driver.get("w/c") == b"22?"
        finally:
            other.close()

    def test_an_exclusive_create_on_guessed_answers_raises_what_holds(self, driver, url):
        """A name never seen is guessed absent: made by another client meanwhile, an exclusive
        create of it fails (the check) and raises what the server holds, not a write over it.
        A name seen is guessed there: removed by another client meanwhile, the error raised on
        the guess is not the answer; the run again reads, and creates it."""
        driver.put("n/gone", b"1")
        other = open_driver(url)
        try:
            other.put("n/new", b"theirs")
            other.delete("n/gone")

            def create(name):
                def run(t):
                    if t.get(name) is not None:
                        raise FileExistsError(name)
                    t.put(name, b"mine")

                return run

            with pytest.raises(FileExistsError):
                driver.transact(create("n/new"))
            assert driver.get("n/new") == b"theirs" and driver.guesses.misses == 1
            for _ in range(20):  # past the transactions that read after a wrong guess
                if driver.guesses.wanted():
                    break
            driver.transact(create("n/gone"))
            assert driver.get("n/gone") == b"mine" and other.get("n/gone") == b"mine"
        finally:
            other.close()

    def test_a_folder_guessed_empty_that_another_client_filled_is_read(self, driver, url):
        """Whether a folder holds keys is guessed from a key seen under it, or none; a folder
        another client filled since is found by the check (a removal of an empty folder only
        goes through when it is)."""
        from zarrfs.backends.base import HasPrefix

        assert driver.transact(lambda t: t.read_many([HasPrefix("e/")]), write=False) == [False]
        other = open_driver(url)
        try:
            other.put("e/x", b"1")

            def remove(t):
                if t.read_many([HasPrefix("e/")]) == [True]:
                    return "not empty"
                t.put("e-removed", b"1")
                return "removed"

            assert driver.transact(remove) == "not empty" and driver.get("e-removed") is None
            assert driver.guesses.misses == 1
        finally:
            other.close()

    def test_a_folder_read_full_that_another_client_emptied_is_read(self, driver, url):
        """A folder a read found holding keys (no key under it known) is guessed so, and
        checked by a range of the table: another client's removal of its last key since is
        found by the commit, which runs again reading."""
        from zarrfs.backends.base import HasPrefix

        other = open_driver(url)
        try:
            other.put("n/x", b"1")
            assert driver.transact(lambda t: t.read_many([HasPrefix("n/")]), write=False) == [True]
            assert driver.guesses.prefixes[DATA, b"n/"] is True
            other.delete("n/x")

            def remove(t):
                if t.read_many([HasPrefix("n/")]) == [True]:
                    return "not empty"
                t.put("n-removed", b"1")
                return "removed"

            assert driver.transact(remove) == "removed" and driver.get("n-removed") == b"1"
            assert driver.guesses.misses == 1
        finally:
            other.close()

    def test_the_check_finds_each_kind_of_answer_that_no_longer_holds(self, driver):
        """The commit's check (``postgres.guesses.check``) passes while every answer taken
        holds, and raises ZF001 when any one kind does not: a name absent, a value, a length,
        a folder's witness, a folder empty, a folder holding keys."""
        import psycopg
        from psycopg.sql import SQL

        from zarrfs.backends.base import HasPrefix
        from zarrfs.backends.postgres.guesses import WRONG, PostgresGuesses, Taken, check

        for key, value in [("v", b"val"), ("w/1", b"1"), ("f/1", b"1")]:
            driver.put(key, value)
        driver.put("n", b"12345", SIDE)
        g = PostgresGuesses()
        g.names[DATA, b"v"], g.names[SIDE, b"n"] = b"val", 5
        g.prefixes[DATA, b"w/"], g.prefixes[DATA, b"f/"] = b"w/1", True
        t = Taken()
        plan = [(HasPrefix, b"e/", DATA), (Get, b"x", DATA), (Get, b"v", DATA), (Size, b"n", SIDE),
                (HasPrefix, b"w/", DATA), (HasPrefix, b"f/", DATA)]
        assert t.answer(g, plan) == [False, None, b"val", 5, True, True]

        def holds() -> bool:
            statement, params = check(t, driver.queries, driver.conn)
            try:
                driver.conn.execute(SQL(statement.decode()), params)
                return True
            except psycopg.Error as exc:
                assert exc.sqlstate == WRONG
                return False

        assert holds()
        changes = [(lambda: driver.put("e/1", b"1"), lambda: driver.delete("e/1")),
                   (lambda: driver.put("x", b"1"), lambda: driver.delete("x")),
                   (lambda: driver.put("v", b"vaL"), lambda: driver.put("v", b"val")),
                   (lambda: driver.put("n", b"1234", SIDE), lambda: driver.put("n", b"12345", SIDE)),
                   (lambda: driver.delete("w/1"), lambda: driver.put("w/1", b"1")),
                   (lambda: driver.delete("f/1"), lambda: driver.put("f/1", b"1"))]
        for change, undo in changes:
            change()
            assert not holds()
            undo()
            assert holds()

    def test_each_statement_is_planned_once_and_walks_the_keys_index(self, driver, url, postgres_server):
        """Left to choose, the server plans a read's batch or a commit's check again at each
        run once a table holds some thousands of rows, which costs it more than the run: the
        driver's connections ask for each statement's generic plan (``sql.PLANNING``), one
        that walks the key's index, even when made while the table was too small for the
        index to pay and kept as it grew."""
        table = url.rsplit("table=", 1)[1]
        driver.put("w/a", b"1")
        driver.put("few/1", b"1", SIDE)

        def reads(t, n):
            return t.read_many([("get", f"many/{n}", DATA), ("prefix", f"many/{n}/", DATA),
                                ("get", "few/1", SIDE)])

        def run(n):
            driver.transact(lambda t: t.put(f"w/{n}", t.get("w/a") + b"."))  # the check, guessed
            return driver.transact(lambda t: reads(t, n), write=False)  # a read's batch

        for n in range(1, 7):  # planned on a table of a few rows
            assert run(n) == [None, False, b"1"]
        with postgres_server.connect() as conn:
            rows = "SELECT 'many/' || g, '\\x00' FROM generate_series(1, 5000) g"
            conn.execute(f'INSERT INTO "{table}" {rows}')
        for n in range(1, 7):  # run on thousands
            assert run(n) == [b"\0", False, b"1"]
        assert driver.guesses.holds >= 10
        conn = driver.conn
        rows = conn.execute("SELECT name, statement, generic_plans, custom_plans FROM pg_prepared_statements")
        rows = rows.fetchall()
        kinds = {"zarrfs_guessed": 0, "unnest": 0}
        for _, statement, generic, custom in rows:
            assert custom == 0, (statement, generic, custom)
            for kind in kinds:
                kinds[kind] += kind in statement and generic >= 10
        assert all(kinds.values()), kinds
        batch = next(name for name, text, _, _ in rows if "unnest" in text and "EXISTS" in text)
        explained = conn.execute(f"EXPLAIN EXECUTE {batch}('{{x}}', '{{x/}}', '{{x0}}', '{{x}}')")
        plan = "\n".join(row[0] for row in explained)
        assert "Index" in plan and "Seq Scan" not in plan and "Hash" not in plan, plan

    def test_a_connection_without_the_check_reads_first(self, driver):
        """A connection whose check function is gone (a server that dropped its temporary
        schema) still commits, reading: the check's failure is taken as a wrong guess, and
        guessing stops."""
        driver.put("f/a", b"1")
        driver.conn.execute("DROP FUNCTION pg_temp.zarrfs_guessed(bigint)")
        driver.transact(lambda t: t.put("f/b", t.get("f/a") + b"2"))
        assert driver.get("f/b") == b"12" and not driver.guesses.usable
        driver.transact(lambda t: t.put("f/c", t.get("f/b") + b"3"))
        assert driver.get("f/c") == b"123"

    def test_what_the_feed_reports_changed_is_read_not_guessed(self, driver, url):
        """Keys another client changed (the change feed) are forgotten: the next write
        transaction reads them for real, without a wrong guess."""
        driver.put("c/a", b"1")
        driver.changes(None)
        other = open_driver(url)
        try:
            other.put("c/a", b"2")
            deadline = time.monotonic() + 30
            while ("c/a" not in [k for _, k in driver.changes(0)[1] or []]):
                assert time.monotonic() < deadline, "the feed never reported the change"
                time.sleep(0.02)
            driver.transact(lambda t: t.put("c/b", t.get("c/a") + b"!"))
            assert driver.get("c/b") == b"2!" and driver.guesses.misses == 0
        finally:
            other.close()

    def test_a_table_of_another_collation_lists_in_byte_order(self, postgres_server):
        table = f"t{uuid.uuid4().hex[:12]}"
        with postgres_server.connect() as conn:
            # ICU's root collation sorts "_" and capitals unlike bytes
            conn.execute(f'CREATE TABLE "{table}" (k text COLLATE "und-x-icu" PRIMARY KEY, v bytea)')
        d = open_driver(postgres_server.url(table=table))
        for key in ("a/B", "a/b", "a/_", "a/Z", "a-1"):
            d.put(key, b"")
        assert [k for k, _ in d.scan("a", None)] == sorted(["a/B", "a/b", "a/_", "a/Z", "a-1"])
        d.close()


class TestDBM(_Conformance):
    """``dbm://``: the files of zarr-python 2's DBMStore (whichever dbm module this Python has)."""

    multiprocess = False  # one process at a time: DBM files have no transactions to share

    @pytest.fixture
    def url(self, tmp_path):
        return f"dbm://{tmp_path}/db"

    def test_reopen_sees_what_was_written_and_the_side_file_is_apart(self, tmp_path):
        import dbm

        url = f"dbm://{tmp_path}/x"
        d = open_driver(url)
        d.put("a/.zgroup", b"{}")
        d.put("a/.zgroup", b"attrs", SIDE)
        d.close()
        with dbm.open(str(tmp_path / "x"), "r") as raw:  # what zarr-python 2's DBMStore opens
            assert list(raw.keys()) == [b"a/.zgroup"]
        d = open_driver(url)
        assert d.get("a/.zgroup") == b"{}" and d.get("a/.zgroup", SIDE) == b"attrs"
        d.close()


class TestRedisCluster(_Conformance):
    """``redis+cluster://``, on the session's three-master Redis Cluster; one prefix per test.
    Resharding and failover while a driver works: ``tests/backends/test_cluster.py``."""

    @pytest.fixture
    def url(self, redis_cluster):
        return redis_cluster.url(prefix=f"t{uuid.uuid4().hex[:12]}")

    def fill_to_exhaustion(self, url):
        return _RedisFull(url)

    def test_layout_is_one_hash_tag(self, driver, redis_cluster):
        driver.put("a/b", b"v")
        driver.put("a/b", b"s", SIDE)
        p = driver.prefix
        assert p.startswith("{") and p.endswith("}")
        node = driver.client  # the master owning the hierarchy's slot holds all of it
        names = sorted(node.keys(f"*{p}*"))
        assert names == sorted(f"{n}{p}{k}".encode() for n, k in [
            ("", ":a/b"), ("zarrfs.side.", ":a/b"), ("zarrfs.index.", ""), ("zarrfs.sideindex.", ""),
        ])
        assert {node.execute_command("CLUSTER", "KEYSLOT", n) for n in names} == {driver.slot}
        assert node.get(f"{p}:a/b") == b"v"

    def test_a_prefix_holding_a_hash_tag_is_kept(self, redis_cluster):
        tag = f"z{uuid.uuid4().hex[:8]}"
        with open_driver(redis_cluster.url(prefix=tag)) as bare:
            bare.put("k", b"1")
        # what a zarr-python 2 RedisStore(prefix="{tag}") on a cluster client reads
        assert redis_cluster.client().get(f"{{{tag}}}:k") == b"1"
        with open_driver(redis_cluster.url(prefix=f"%7B{tag}%7D")) as braced:
            assert braced.prefix == f"{{{tag}}}" and braced.get("k") == b"1"

    def test_hierarchies_spread_over_the_masters(self, redis_cluster):
        nodes: dict[str, str] = {}
        for i in range(64):
            d = open_driver(redis_cluster.url(prefix=f"spread{i}"))
            try:
                if d.node not in nodes:
                    d.put("x/.zgroup", b"{}")
                    nodes[d.node] = d.prefix
            finally:
                d.close()
            if len(nodes) == 3:
                break
        assert len(nodes) == 3
        for node, prefix in nodes.items():
            host, port = node.rsplit(":", 1)
            import redis

            assert redis.Redis(host=host, port=int(port)).get(f"{prefix}:x/.zgroup") == b"{}"

    def test_valkey_schemes_are_redis(self, redis_server):
        url = redis_server.url(0, prefix=f"v{uuid.uuid4().hex[:8]}").replace("redis://", "valkey://")
        with open_driver(url) as d:
            d.put("k", b"v")
        assert redis_server.client(0).get(f"{d.prefix}:k") == b"v"
        assert registry.driver_class("valkeys").__name__ == "RedisDriver"
        assert registry.driver_class("valkey+cluster").__name__ == "RedisClusterDriver"


def test_a_limited_scan_skips_a_key_not_utf8_and_reads_as_many_in_its_place(tmp_path):
    """A read transaction's scan with a limit is read as one list (``Txn._decoded_rows``): a
    key that is not UTF-8 (written by another program) is skipped and as many rows after the
    batch read in its place, so a listing never takes a short batch for the folder's end."""
    import lmdb

    path = tmp_path / "foreign.lmdb"
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as t:
        for i in range(10):
            t.put(f"d/a{i}".encode(), b"x" * i)
        t.put(b"d/a4\xff", b"not a key")
    env.close()
    driver = open_driver(f"lmdb://{path}")
    try:
        for limit in (1, 5, 6, 10):
            got = driver.transact(lambda t, n=limit: list(t.scan("d/", "d0", fetch=SIZES, limit=n)), False)
            assert got == [(f"d/a{i}", i) for i in range(limit)], limit
        values = driver.transact(lambda t: list(t.scan("d/a3", "d0", fetch=VALUES, limit=3)), write=False)
        assert values == [("d/a3", b"xxx"), ("d/a4", b"x" * 4), ("d/a5", b"x" * 5)]
    finally:
        driver.close()

"""LMDB keys longer than LMDB's key limit (511 bytes): held in the side environment
(``zarrfs.backends.lmdb.longkeys``), transparently, while the keys that fit stay where zarr-python 2's
``LMDBStore`` reads them."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random

import lmdb
import pytest
import zarr2env
from mounting import Mount

from zarrfs.backends import open_driver
from zarrfs.backends.base import DATA, KEYS, SIDE, SIZES, VALUES, HasPrefix, Size, StorageFullError
from zarrfs.backends.checks import prefix_stop

MARK = b"\xfe"  # the first byte of the long-key store's records (zarrfs.backends.lmdb.longkeys)

SPACES = [DATA, SIDE]


@pytest.fixture
def driver(tmp_path):
    d = open_driver(f"lmdb://{tmp_path}/db.lmdb")
    yield d
    d.close()


def key_of(n: int, head: str = "k/") -> str:
    """A key of ``n`` UTF-8 bytes."""
    return head + "x" * (n - len(head))


def stored(driver, raw: bytes, space) -> bool:
    """Whether ``raw`` is a record of the environment of ``space`` itself."""
    env = driver.env if space is DATA else driver.side.env(False)
    with env.begin() as txn:
        return txn.get(raw) is not None


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("n", [511, 512, 1000, 4000, 9000])
def test_a_key_of_any_length(driver, space, n):
    key = key_of(n)
    assert len(key.encode()) == n
    driver.put(key, b"value", space)
    driver.put("k/other", b"o", space)
    assert driver.get(key, space) == b"value"
    assert driver.size(key, space) == 5
    assert driver.read(key, 1, 3, space) == b"alu"
    assert driver.transact(lambda t: t.exists(key, space), write=False)
    assert [k for k, _ in driver.scan("k/", "k0", space=space)] == sorted([key, "k/other"])
    assert driver.get(key, DATA if space is SIDE else SIDE) is None  # the spaces stay apart
    # A key that fits is where LMDB itself holds it; a longer one is not.
    assert stored(driver, key.encode(), space) == (n <= 511)
    driver.put(key, b"overwritten", space)
    assert driver.get(key, space) == b"overwritten"
    assert driver.transact(lambda t: t.read_many([Size(key, space), HasPrefix(key[:600], space)])) == [
        11,
        True,
    ]
    driver.delete(key, space)
    assert driver.get(key, space) is None and driver.size(key, space) is None
    assert driver.transact(lambda t: t.read_many([Size(key, space), HasPrefix(key[:600], space)])) == [
        None,
        False,
    ]
    assert driver.scan("k/", "k0", space=space) == [("k/other", None)]
    driver.delete(key, space)  # deleting a missing key is no error


def test_long_records_hold_nothing_else(driver):
    """Once every long key is gone, the side environment holds no record of the store."""
    keys = [key_of(600 + i) for i in range(5)]
    for space in SPACES:
        driver.transact(lambda t, space=space: [t.put(k, b"v" * 100, space) for k in keys])
    for space in SPACES:
        driver.transact(lambda t, space=space: [t.delete(k, space) for k in keys])
    with driver.side.env(False).begin() as txn:
        assert not [k for k, _ in txn.cursor() if k.startswith(MARK)]


def _mixed_keys(rng: random.Random) -> list[str]:
    """Short and long keys, many long ones sharing more than the first 440 bytes, some sharing
    exactly 440 bytes and differing after, some prefixes of others, non-ASCII ones."""
    base = "a/" + "d" * 500
    keys = {"a/", "a/b", "b", base[:511], base[:512], base, base + "/", base + "/z"}
    for _ in range(400):
        kind = rng.randrange(5)
        tail = "".join(rng.choice("xy/é") for _ in range(rng.randint(0, 80)))
        if kind == 0:
            keys.add("a/" + tail)
        elif kind == 1:
            keys.add("a/" + "".join(rng.choice("xyz") for _ in range(rng.randint(400, 4000))))
        elif kind == 2:
            keys.add(base + "/" + tail)
        elif kind == 3:
            keys.add("a/" + "d" * 438 + tail)  # 440 bytes, then they differ
        else:
            keys.add("a/" + "d" * rng.randint(400, 520) + tail)
    return sorted(keys)


@pytest.mark.parametrize("space", SPACES)
def test_scans_merge_both_stores_in_key_order(driver, space):
    rng = random.Random(7)
    keys = _mixed_keys(rng)
    assert sum(len(k.encode()) > 511 for k in keys) > 100 and sum(len(k.encode()) <= 511 for k in keys) > 100
    values = {k: rng.randbytes(rng.randint(0, 40)) for k in keys}
    driver.transact(lambda t: [t.put(k, v, space) for k, v in values.items()])
    assert [k for k, _ in driver.scan(space=space)] == keys
    assert dict(driver.scan(space=space, fetch=SIZES)) == {k: len(v) for k, v in values.items()}
    assert dict(driver.scan(space=space, fetch=VALUES)) == values
    bounds = keys + [k[:cut] for k in keys for cut in (439, 440, 441, 511, 512)] + [""]
    for _ in range(300):
        lo, hi = rng.choice(bounds), rng.choice(bounds + [None])
        want = [k for k in keys if k >= lo and (hi is None or k < hi)]
        got = driver.scan(lo, hi, space=space, fetch=KEYS)
        assert [k for k, _ in got] == want, (len(lo), None if hi is None else len(hi))
    for prefix in {k[:cut] for k in rng.sample(keys, 60) for cut in (300, 440, 445, 600)}:
        want = [k for k in keys if k.startswith(prefix)]
        assert [k for k, _ in driver.scan(prefix, prefix_stop(prefix), space=space)] == want
        assert driver.transact(lambda t, p=prefix: t.read_many([HasPrefix(p, space)])) == [bool(want)]
        limited = driver.scan(prefix, prefix_stop(prefix), space=space, limit=3)
        assert [k for k, _ in limited] == want[:3]


@pytest.mark.parametrize("space", SPACES)
def test_writes_while_scanning(driver, space):
    """The caller may write between two pulls of a scan (a folder's rename moves its keys one
    by one): keys written ahead are seen, keys removed ahead are not."""
    rng = random.Random(3)
    keys = _mixed_keys(rng)
    driver.transact(lambda t: [t.put(k, b"1", space) for k in keys])

    def move(t):
        seen = []
        for k, _ in t.scan("a/", "a0", space=space):
            seen.append(k)
            t.put("c" + k[1:], t.get(k, space), space)
            t.delete(k, space)
            if k.endswith("y"):  # remove a key further on, and add one
                later = [x for x in keys if x > k and x.startswith("a/")]
                if later:
                    t.delete(later[-1], space)
                    keys.remove(later[-1])
                t.put(k + "\x7f", b"2", space)
                keys.append(k + "\x7f")
        return seen

    seen = driver.transact(move)
    expected = sorted(k for k in keys if k.startswith("a/"))
    assert seen == expected
    assert [k for k, _ in driver.scan("a/", "a0", space=space)] == []
    assert [k for k, _ in driver.scan("c/", "c0", space=space)] == ["c" + k[1:] for k in expected]


def test_one_outcome_when_the_data_commit_fails(driver, monkeypatch):
    """Long keys of both spaces are side records: committed first, and put back when the data
    commit that follows fails, as the side records of the transaction are."""
    import zarrfs.backends.lmdb.driver as lmdb_driver

    old_long, new_long = key_of(700, "o/"), key_of(3000, "n/")
    driver.transact(
        lambda t: (
            [t.put(old_long, b"before", sp) for sp in SPACES]
            + [t.put("short", b"before", sp) for sp in SPACES]
        )
    )

    class FailingCommit:
        def __init__(self, txn):
            self.txn = txn

        def __getattr__(self, name):
            return getattr(self.txn, name)

        def commit(self):
            self.txn.abort()
            raise lmdb.MapFullError("mdb_txn_commit: MDB_MAP_FULL")

    real_init = lmdb_driver.LMDBTxn.__init__

    def init(self, drv, write):
        real_init(self, drv, write)
        if write:
            self._data = FailingCommit(self._data)

    monkeypatch.setattr(lmdb_driver.LMDBTxn, "__init__", init)

    def change(t):
        for sp in SPACES:
            t.put(old_long, b"after", sp)
            t.put(new_long, b"new", sp)
            t.put("short", b"after", sp)
        t.delete(old_long, SIDE)

    with pytest.raises(StorageFullError):
        driver.transact(change)
    monkeypatch.setattr(lmdb_driver.LMDBTxn, "__init__", real_init)
    again = open_driver(driver.url, readonly=True)
    try:
        for d in (driver, again):
            for sp in SPACES:
                assert d.get(old_long, sp) == b"before", sp
                assert d.get(new_long, sp) is None, sp
                assert d.get("short", sp) == b"before", sp
                assert [k for k, _ in d.scan("n/", "n0", space=sp)] == []
    finally:
        again.close()


def test_the_change_feed_names_long_keys(driver):
    """Another driver's feed reports the long keys themselves, never the records holding them."""
    other = open_driver(driver.url)
    try:
        cursor, _ = other.changes(None)
        long_data, long_side = key_of(800, "d/"), key_of(2000, "s/")
        driver.transact(lambda t: (t.put(long_data, b"1"), t.put(long_side, b"2", SIDE), t.put("s", b"3")))
        cursor, records = other.changes(cursor)
        assert sorted(records) == sorted([(DATA, long_data), (SIDE, long_side), (DATA, "s")])
        driver.delete(long_data)
        cursor, records = other.changes(cursor)
        assert records == [(DATA, long_data)]
    finally:
        other.close()


def test_a_large_value_under_a_long_key(driver):
    key = key_of(1500)
    value = os.urandom(5 << 20)
    driver.put(key, value)
    assert driver.size(key) == len(value)
    assert driver.read(key, 4 << 20, 10) == value[4 << 20 : (4 << 20) + 10]
    assert dict(driver.scan("k/", "k0", fetch=SIZES)) == {key: len(value)}
    assert driver.get(key) == value


ZARR2_KEYS = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import zarr
store = zarr.LMDBStore(sys.argv[1])
print(json.dumps({"keys": sorted(store.keys()), "group": dict(zarr.open_group(store, mode="r").attrs)}))
store.close()
"""


def test_zarr2_lmdbstore_sees_exactly_the_keys_that_fit(tmp_path, zarr2_python):
    target = tmp_path / "z2.lmdb"
    d = open_driver(f"lmdb://{target}")
    fits = {".zgroup": b'{"zarr_format": 2}', ".zattrs": b'{"a": 1}', key_of(511): b"511"}
    longer = {key_of(512): b"512", key_of(1000): b"1000", key_of(4000, "z/"): b"4000"}
    try:
        d.transact(lambda t: [t.put(k, v) for k, v in {**fits, **longer}.items()])
        d.transact(lambda t: [t.put(k, b"side", SIDE) for k in [*fits, *longer]])
        assert keys_of(d.scan()) == sorted([*fits, *longer])
    finally:
        d.close()
    seen = json.loads(zarr2env.run(zarr2_python, ZARR2_KEYS, str(target)))
    assert seen["keys"] == sorted(fits)
    assert seen["group"] == {"a": 1}


def keys_of(rows):
    return [k for k, _ in rows]


# --- through a mount -------------------------------------------------------------------------------


@contextlib.contextmanager
def inside(folder):
    """Work in ``folder``: relative paths name keys of their own length (an absolute path
    would add the mountpoint's to the kernel's PATH_MAX)."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)


def _nested(part: str, count: int) -> str:
    """Make ``count`` folders named ``part``, each in the one before, from the working folder:
    the innermost's relative path."""
    folder = "."
    for _ in range(count):
        folder = os.path.join(folder, part)
        os.mkdir(folder)
    return os.path.normpath(folder)


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_paths_of_4096_bytes_through_a_mount(kind, tmp_path):
    """A path of ~4,000 bytes works through a mount of LMDB as on SQLite: made, written, listed,
    renamed, removed, and still there after a remount; a path argument of PATH_MAX (4,096 bytes
    with its NUL) is ENAMETOOLONG, from the kernel, on both."""
    url = f"lmdb://{tmp_path}/db.lmdb" if kind == "lmdb" else f"sqlite://{tmp_path}/db.sqlite"
    part = "p" * 200
    with Mount(url, tmp_path / "mnt", ["create"]) as m, inside(m.path):
        folder = _nested(part, 19)  # 19 folders of 201 bytes
        leaf = os.path.join(folder, "f" * 180)
        assert len(leaf.encode()) == 19 * 201 + 180
        with open(leaf, "wb") as fh:
            fh.write(b"deep")
        with open(leaf, "rb") as fh:
            assert fh.read() == b"deep"
        assert os.listdir(folder) == ["f" * 180]
        renamed = os.path.join(folder, "g" * 180)
        os.rename(leaf, renamed)
        assert os.listdir(folder) == ["g" * 180]
        # A folder's rename moves every key under it, long ones with it.
        os.rename(os.path.join(part, part), os.path.join(part, "q" * 200))
        moved = os.path.join(part, "q" * 200, os.path.relpath(renamed, os.path.join(part, part)))
        with open(moved, "rb") as fh:
            assert fh.read() == b"deep"
        assert not os.path.exists(os.path.join(part, part))
        # The longest path the kernel passes: PATH_MAX - 1 bytes.
        head = os.path.dirname(moved)
        sub = "s" * (4095 - len(head) - 2 - 200)  # a folder, then a name of 200 bytes
        assert 0 < len(sub) <= 255
        os.mkdir(os.path.join(head, sub))
        top = os.path.join(head, sub, "n" * 200)
        assert len(top.encode()) == 4095
        with open(top, "wb") as fh:
            fh.write(b"top")
        for call in (lambda: open(top + "x", "wb"), lambda: os.stat(top + "x"), lambda: os.mkdir(top + "x")):
            with pytest.raises(OSError) as exc:
                call()
            assert exc.value.errno == errno.ENAMETOOLONG
    m.assert_clean_log()
    with Mount(url, tmp_path / "mnt") as again, inside(again.path):
        with open(moved, "rb") as fh:
            assert fh.read() == b"deep"
        with open(top, "rb") as fh:
            assert fh.read() == b"top"
        assert sorted(os.listdir(head)) == sorted(["g" * 180, sub])
        os.unlink(moved)
        os.unlink(top)
        os.rmdir(os.path.join(head, sub))
        while head:
            os.rmdir(head)
            head = os.path.dirname(head)
        assert os.listdir(".") == []
    again.assert_clean_log()
    if kind == "lmdb":
        d = open_driver(url, readonly=True)
        try:
            assert d.scan() == [] and [k for k, _ in d.scan(space=SIDE) if len(k.encode()) > 511] == []
        finally:
            d.close()


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_path_longer_than_postgresql_indexes_is_enametoolong(postgres_server, tmp_path):
    """PostgreSQL's B-tree entries hold about 2,700 bytes of key once compressed: a path of
    names that do not compress (random hex, as pjdfstest makes) stops fitting near that. Its
    mkdir is ENAMETOOLONG, with nothing stored and no error in the log, not ENOSPC ("index row
    size exceeds"); the paths that fit are made, written, read and removed."""
    url = postgres_server.url(table=f"lk{os.getpid()}")
    rng = random.Random(5)
    with Mount(url, tmp_path / "mnt", ["create"]) as m, inside(m.path):
        folder = "."
        while True:
            deeper = os.path.join(folder, f"{rng.getrandbits(800):0200x}")
            try:
                os.mkdir(deeper)
            except OSError as exc:
                assert exc.errno == errno.ENAMETOOLONG, exc
                break
            folder = deeper
            assert len(folder) < 3000, "a path PostgreSQL's index cannot hold was made"
        folder = os.path.normpath(folder)
        assert len(folder) > 2400
        assert not os.path.exists(deeper)
        leaf = os.path.join(folder, "f")
        with open(leaf, "wb") as fh:
            fh.write(b"deep")
        with open(leaf, "rb") as fh:
            assert fh.read() == b"deep"
        assert os.listdir(folder) == ["f"]
        os.unlink(leaf)
        assert os.listdir(folder) == []
        text = m.log_text()
    assert " ERROR " not in text, text[-4000:]


@pytest.mark.parametrize("space", SPACES)
def test_a_long_key_written_here_is_seen_by_the_next_read(driver, space):
    """What a read learnt of a snapshot without long keys is carried over this driver's own
    commits (``longkeys.Presence.committed``), but not over one that wrote a long key."""
    driver.put("a/short", b"x", space)
    assert driver.transact(lambda t: t.read_many([HasPrefix("b/", space)]), write=False) == [False]
    driver.put(key_of(600, "b/"), b"y", space)
    assert driver.transact(lambda t: t.read_many([HasPrefix("b/", space)]), write=False) == [True]


def test_a_read_after_a_commit_here_seeks_no_long_keys(driver, monkeypatch):
    """A lookup after each close of a file written here: whether the database has long keys
    is known from the read before it, carried over the commit between."""
    from zarrfs.backends.lmdb import longkeys

    seeks: list[object] = []
    real = longkeys.any_in
    monkeypatch.setattr(longkeys, "any_in", lambda side, space: seeks.append(space) or real(side, space))

    def probe() -> list:
        seeks.clear()
        reads = [HasPrefix("x/", DATA), HasPrefix("x/", SIDE)]
        found = driver.transact(lambda t: t.read_many(reads), write=False)
        return [found, len(seeks)]

    driver.put("f/first", b"v")
    assert probe() == [[False, False], 2]  # learnt once
    for i in range(5):
        driver.put(f"f/{i}", b"v")
        assert probe() == [[False, False], 0]
    # A commit's own probes (a close's): answered from the snapshot it follows.
    seeks.clear()
    driver.transact(lambda t: (t.read_many([HasPrefix("x/", DATA)]), t.put("f/last", b"v")))
    assert seeks == []


@pytest.mark.parametrize("write", [False, True])
def test_a_long_key_another_writer_made_is_seen(tmp_path, write):
    """What one driver saw of the long keys is not carried over another writer's commit (here
    a second driver of the database: its own process's commits numbered in between)."""
    url = f"lmdb://{tmp_path}/db.lmdb"
    with open_driver(url) as one, open_driver(url) as other:
        one.put("a/short", b"x")
        assert one.transact(lambda t: t.read_many([HasPrefix("b/", DATA)]), write=False) == [False]
        other.put(key_of(600, "b/"), b"y")
        assert one.transact(lambda t: t.read_many([HasPrefix("b/", DATA)]), write=write) == [True]


def test_a_commit_that_changed_nothing_carries_nothing(tmp_path):
    """A write transaction that only read commits no snapshot: what was seen is not carried to
    its number, which another writer's next commit takes (with a long key, here)."""
    url = f"lmdb://{tmp_path}/db.lmdb"
    with open_driver(url) as one, open_driver(url) as other:
        one.put("a/short", b"x")
        assert one.transact(lambda t: t.read_many([HasPrefix("b/", DATA)]), write=False) == [False]
        one.transact(lambda t: t.read_many([HasPrefix("x/", SIDE)]))  # a write that wrote nothing
        other.put(key_of(600, "b/"), b"y")
        assert one.transact(lambda t: t.read_many([HasPrefix("b/", DATA)]), write=False) == [True]

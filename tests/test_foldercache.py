"""Snapshots of busy folders (zarrfs/foldercache.py): when they are made, what they answer,
and that they answer exactly what a lookup would, on every driver; then through mounts, that
the mount's own changes show at once and another writer's within the snapshot's lifetime."""

from __future__ import annotations

import os
import time

import pytest
from mounting import make_url

from zarrfs.backends import open_driver
from zarrfs.fs.foldercache import FolderCache
from zarrfs.fs.sidedata import LINK_MARK, entry_key
from zarrfs.fs.tree import DIR, FILE, LINK, Node, Tree


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_folder_is_snapshotted_once_it_is_busy_and_until_ttl():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=3, clock=clock)
    built: list[int] = []

    def build(limit: int) -> dict[str, Node]:
        built.append(limit)
        return {"x": "node-x"}  # type: ignore[dict-item]

    assert cache.snapshot("f", build) is None  # the first lookups go to the database
    assert cache.snapshot("f", build) is None
    assert cache.snapshot("f", build) == {"x": "node-x"}  # the third makes it busy
    assert cache.snapshot("f", build) == {"x": "node-x"}
    assert built == [cache.limit]
    clock.now += 1.01  # too old: dropped; the folder must be busy again
    assert cache.snapshot("f", build) is None
    assert built == [cache.limit]


def test_lookups_spread_over_time_never_make_a_snapshot():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=3, clock=clock)
    for _ in range(10):
        assert cache.snapshot("f", lambda limit: {}) is None
        clock.now += 0.6
    assert cache.builds == 0


def test_clear_drops_snapshots_but_remembers_folders_too_large():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock)
    assert cache.snapshot("small", lambda limit: {}) == {}
    assert cache.snapshot("huge", lambda limit: None) is None  # more than `limit` entries
    cache.clear()
    clock.now += 1.01  # after the quiet time that follows a write
    assert cache.snapshot("small", lambda limit: {"new": 1}) == {"new": 1}  # read again
    assert cache.snapshot("huge", lambda limit: pytest.fail("listed again")) is None
    clock.now += 9.5  # "too large" is remembered for ten lifetimes
    assert cache.snapshot("huge", lambda limit: {}) == {}


def test_no_snapshot_is_made_while_the_mount_writes():
    """Each write clears the snapshots; making them again while a folder fills up would read
    the growing folder every few files."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=2, clock=clock)
    for _ in range(10):
        cache.clear()  # a file created through the mount
        assert cache.snapshot("f", lambda limit: pytest.fail("snapshot while writing")) is None
        clock.now += 0.1
    clock.now += 1.0  # quiet for ttl: busy lookups make a snapshot again
    cache.snapshot("f", lambda limit: {})
    assert cache.snapshot("f", lambda limit: {"x": 1}) == {"x": 1}


def test_a_snapshot_that_answered_few_lookups_is_not_made_again():
    """Reading 800 entries to answer a few lookups does not pay: next time the folder is
    looked up name by name (for ten lifetimes); one that answered many is read again."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock)
    many = {str(i): i for i in range(800)}
    assert cache.snapshot("sparse", lambda limit: many) is many
    for _ in range(50):  # fewer than 800 / 8
        cache.snapshot("sparse", lambda limit: pytest.fail("read again"))
    assert cache.snapshot("busy", lambda limit: many) is many
    for _ in range(150):
        cache.snapshot("busy", lambda limit: pytest.fail("read again"))
    clock.now += 1.01
    assert cache.snapshot("sparse", lambda limit: pytest.fail("read again")) is None
    assert cache.snapshot("busy", lambda limit: {"again": 1}) == {"again": 1}
    clock.now += 10.0  # ten lifetimes after it was found not worth it
    assert cache.snapshot("sparse", lambda limit: {"later": 1}) == {"later": 1}


def test_at_most_folders_snapshots_are_kept():
    cache = FolderCache(ttl=1.0, hot=1, folders=2, clock=Clock())
    for name in ("a", "b", "c"):
        cache.snapshot(name, lambda limit, n=name: {n: 1})
    assert cache.snapshot("a", lambda limit: {"a": 2}) == {"a": 2}  # "a" was evicted


@pytest.fixture(params=["lmdb", "sqlite", "redis"])
def tree(request, tmp_path):
    driver = open_driver(make_url(request.param, tmp_path, request))
    yield Tree(driver, uid=1000, gid=1000)
    driver.close()


def test_snapshot_answers_what_each_lookup_answers(tree):
    """Files with and without attributes, a folder from keys, an empty folder from mkdir, a
    symlink, a key hidden by a folder of the same name: each as find() sees it."""
    keys = ["g/a", "g/b/0", "g/hidden", "g/hidden/0", "g/z"]
    tree.driver.transact(lambda t: [t.put(k, b"x" * n) for n, k in enumerate(keys)])
    tree.mkdir("g/empty", 0o750)
    tree.symlink("../a", "g/link", 1000, 1000)
    tree.set_attrs("g/z", mode=0o600)
    names = ("a", "b", "hidden", "empty", "link", "z")
    expected = {name: tree.find(f"g/{name}") for name in names}
    assert [expected[n].kind for n in names] == [FILE, DIR, DIR, DIR, LINK, FILE]
    snapshot = tree.folder_nodes("g", limit=100)
    assert snapshot == expected
    assert tree.folder_nodes("g", limit=5) is None  # six entries
    assert tree.folder_nodes("nothing", limit=5) == {}
    assert tree.driver.get(entry_key("g/link"), "side")[:1] == LINK_MARK


def test_snapshot_of_a_folder_read_in_several_batches(tree):
    tree.driver.transact(lambda t: [t.put(f"big/{i:04d}", b"v" * (i % 7)) for i in range(1500)])
    nodes = tree.folder_nodes("big", limit=2000)
    assert len(nodes) == 1500
    assert all(nodes[f"{i:04d}"].size == i % 7 for i in range(1500))


def test_a_large_folder_read_by_ranges_answers_what_each_lookup_answers(tree, monkeypatch):
    """On a local database the side records of a batch of children are read as ranges:
    attributes, hard links and a symlink as find() sees them; a folder whose subfolders hold
    many records is read name by name instead, with the same answers."""
    from zarrfs.fs import listing

    names = [f"{i:03d}" for i in range(100)]
    tree.driver.transact(lambda t: [t.put(f"g/{n}", b"x" * int(n)) for n in names])
    tree.driver.transact(lambda t: [t.put(f"g/050x/sub{i:03d}", b"y") for i in range(300)])
    for n in names[::7]:
        tree.set_attrs(f"g/{n}", mode=0o600 + int(n) % 64)
    for i in range(300):
        tree.set_attrs(f"g/050x/sub{i:03d}", mode=0o640 if i % 7 == 0 else 0o644)
    tree.link("g/003", "g/zz-link")
    tree.symlink("../003", "g/symlink", 1000, 1000)
    ranged = []
    real = listing.Listings._side_ranges
    monkeypatch.setattr(
        listing.Listings, "_side_ranges", lambda self, *a: ranged.append(real(self, *a)) or ranged[-1]
    )
    for folder in ("g", "g/050x"):
        expected = {name: tree.find(f"{folder}/{name}") for name in tree.folder_nodes(folder, 1000) or {}}
        assert tree.folder_nodes(folder, limit=1000) == expected and len(expected) > 100
    assert expected["sub014"].attrs.mode & 0o777 == 0o640
    taken = [r is not None for r in ranged]
    if not tree.driver.remote:  # LMDB, SQLite
        # g: its subfolder's 300 records fill the range: name by name; g/050x: by ranges.
        assert taken == [False, False, True, True]
    else:
        assert not any(taken)


def test_find_through_the_cache_and_own_writes_drop_it(tree):
    tree.driver.transact(lambda t: [t.put(f"f/{i}", b"v") for i in range(50)])
    tree.folder_cache = cache = FolderCache(ttl=60.0, hot=4)
    for i in range(10):
        assert tree.find(f"f/{i}").size == 1
        assert tree.find(f"f/missing{i}") is None
    assert cache.builds == 1
    # Another writer: not seen while the snapshot lives.
    tree.driver.put("f/new", b"123")
    assert tree.find("f/new") is None
    # A write through the tree drops the snapshots: everything is read anew.
    tree.commit("f/0", b"longer", None)
    assert tree.find("f/0").size == 6
    assert tree.find("f/new").size == 3
    assert tree.find("f").kind == DIR  # the root's snapshot: a folder


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_mount_sees_its_own_changes_at_once_and_others_within_the_lifetime(tmp_path, mount_factory):
    url = f"lmdb://{tmp_path}/db.lmdb"
    m = mount_factory(url, ["create", "cache_timeout=0.2", "dir_cache=0.5"])
    folder = m.path / "f"
    folder.mkdir()
    for i in range(100):
        (folder / str(i)).write_bytes(b"v")
    for i in range(100):  # busy: the folder is snapshotted
        assert os.stat(folder / str(i)).st_size == 1
    (folder / "0").write_bytes(b"own write")
    assert os.stat(folder / "0").st_size == 9  # at once
    os.unlink(folder / "1")
    assert not (folder / "1").exists()
    other = open_driver(url)
    try:
        other.put("f/from-elsewhere", b"12345")
    finally:
        other.close()
    deadline = time.monotonic() + 0.5 + 0.2 + 2.0  # dir_cache + cache_timeout + slack
    while not (folder / "from-elsewhere").exists():
        assert time.monotonic() < deadline, "another writer's file never showed"
        time.sleep(0.05)
    assert (folder / "from-elsewhere").read_bytes() == b"12345"


def test_what_the_snapshots_hold_together_stays_within_the_bound():
    """``entries`` bounds the snapshots together: the oldest go to make room, and a folder
    larger than the bound is never read whole (``-o dir_cache_entries=``)."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock, entries=100)
    assert cache.limit == 100
    built: list[int] = []

    def of(n: int):
        def build(limit: int) -> dict[str, Node] | None:
            built.append(limit)
            return None if n > limit else dict.fromkeys(map(str, range(n)))  # type: ignore[arg-type]

        return build

    assert cache.snapshot("a", of(60)) is not None and cache.held == 60
    assert cache.snapshot("b", of(30)) is not None and cache.held == 90
    assert cache.snapshot("c", of(50)) is not None  # "a" goes to make room
    assert cache.held == 80 and set(cache._snapshots) == {"b", "c"}
    assert cache.snapshot("a", of(60)) is not None  # made again: "b" and "c" go (50 + 60 > 100)
    assert cache.held == 60 and set(cache._snapshots) == {"a"}
    assert cache.snapshot("d", of(40)) is not None and cache.held == 100
    assert cache.snapshot("huge", of(1000)) is None and built[-1] == 100
    cache.forget({"d"})
    assert cache.held == 60
    cache.clear()
    assert cache.held == 0


# -- what a mount following a feed knows of folders (zarrfs.fs.knownfolders) ----------------------


def test_known_folders_stay_a_superset_of_the_names_through_the_mounts_commits():
    from zarrfs.backends.base import DATA, SIDE
    from zarrfs.fs.knownfolders import KnownFolders
    from zarrfs.fs.sidedata import Attrs, attr_key

    known = KnownFolders(entries=10)
    known.listed("a", ["x"])
    assert known.missing("a/y") and not known.missing("a/x") and not known.missing("b/y")
    attrs = Attrs(DIR | 0o755, 0, 0, 1, 1, 1)
    known.made("a/d", Node(DIR, 0, attrs), attrs.pack())
    assert known.node("a/d") is not None and known.missing("a/d/z")
    assert known.record("a/d") == (True, attrs.pack())
    # A commit: a key deep below adds a name to every known folder on its way; a removal
    # leaves the name (its lookup asks the database); the folder's record written replaces it.
    known.wrote([(DATA, "a/d/e/f", b"1"), (DATA, "a/x", None), (SIDE, attr_key("a/d"), b"rec"),
                 (SIDE, entry_key("a/s"), LINK_MARK + b"t")])
    assert known.node("a/d") is None  # forgotten at the next write
    assert not known.missing("a/d/e") and not known.missing("a/x") and not known.missing("a/s")
    assert known.record("a/d") == (True, b"rec")
    known.wrote([(SIDE, entry_key("a/d"), None)])  # the folder's mark removed (rmdir)
    assert not known.missing("a/d/z")
    # Another writer changed something below a: what is known of a and above is dropped.
    known.forget(["a/q"], {"a", ""})
    assert not known.missing("a/y")
    known.listed("big", [str(i) for i in range(11)])  # past the bound: not kept
    assert not known.missing("big/z")
    known.listed("b", [str(i) for i in range(6)])
    known.listed("c", [str(i) for i in range(6)])  # the oldest folder makes room
    assert not known.missing("b/z") and known.missing("c/z")

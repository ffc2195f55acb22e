"""Snapshots of busy folders (zarrfs/foldercache.py): when they are made, what they answer,
and that they answer exactly what a lookup would, on every driver; then through mounts, that
the mount's own changes show at once and another writer's within the snapshot's lifetime."""

from __future__ import annotations

import bisect
import os
import random

import pytest
from mounting import eventually, make_url

from zarrfs.backends import open_driver
from zarrfs.fs.commitoptions import REWRITE
from zarrfs.fs.foldercache import MISS, FolderCache
from zarrfs.fs.sidedata import LINK_MARK, entry_key
from zarrfs.fs.tree import DIR, FILE, LINK, Node, Tree


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def whole(nodes, calls=None):
    """A ``read`` of a folder that holds ``nodes`` (whole, whatever the limit)."""

    def read(_folder, after, limit):
        if calls is not None:
            calls.append((after, limit))
        return nodes, None

    return read


def never(after, limit):
    pytest.fail(f"read at {after!r}")


def test_a_folder_is_snapshotted_once_it_is_busy_and_until_ttl():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=3, clock=clock)
    built: list = []
    read = whole({"x": "node-x"}, built)
    assert cache.find("f", "x", read) is MISS  # the first lookups go to the database
    assert cache.find("f", "x", read) is MISS
    assert cache.find("f", "x", read) == "node-x"  # the third makes it busy
    assert cache.find("f", "y", read) is None  # not in the folder
    assert built == [(None, cache.limit)]
    clock.now += 1.01  # too old: dropped; the folder must be busy again
    assert cache.find("f", "x", read) is MISS
    assert built == [(None, cache.limit)]


def test_lookups_spread_over_time_never_make_a_snapshot():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=3, clock=clock)
    for _ in range(10):
        assert cache.find("f", "x", whole({})) is MISS
        clock.now += 0.6
    assert cache.builds == 0


def test_a_large_folder_is_read_by_pages_around_the_names_looked_up():
    """A folder of a million names is never read whole, nor up to a bound: the first page
    from its first name, then a page from a name no page covers, each of ``limit`` names, and
    each answers the names between its ends (a name after its last is not known absent)."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=2, clock=clock, limit=100)
    folder = [f"{i:07d}" for i in range(0, 2_000_000, 2)]  # even numbers only
    reads: list = []

    def read(_folder, after, limit):
        reads.append(after)
        i = 0 if after is None else bisect.bisect_right(folder, after)
        names = folder[i : i + limit]
        more = names[-1] if i + limit < len(folder) else None
        return {n: f"node-{n}" for n in names}, more

    assert cache.find("big", "0500000", read) is MISS
    assert cache.find("big", "0500002", read) is MISS  # busy: the first page, 0 to 198
    assert reads == [None]
    assert cache.find("big", "0000198", read) == "node-0000198"
    assert cache.find("big", "0000197", read) is None
    assert cache.find("big", "0500004", read) is MISS  # past the page: looked up
    assert cache.find("big", "0500006", read) is MISS  # busy again: a page after this name
    assert reads == [None, "0500006"]
    for i in range(500_008, 500_206, 2):  # all answered by that page
        assert cache.find("big", f"{i:07d}", read) == f"node-{i:07d}"
        assert cache.find("big", f"{i + 1:07d}", read) is None
    assert cache.find("big", "0500006", read) is MISS  # the page starts after it
    assert cache.find("big", "0500208", read) is MISS  # and ends before this one: busy again
    assert reads == [None, "0500006", "0500208"] and cache.held == 300
    cache.clear()
    clock.now += 1.01
    assert cache.find("big", "0000000", read) is MISS
    assert cache.find("big", "0000002", read) is MISS
    assert reads[-1] == "0000002"  # known larger than a page: from the name looked up


def test_a_folder_keeps_a_few_pages_and_one_not_worth_reading_stops_them():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock, limit=10, pages=2)

    def read(_folder, after, limit):
        start = 0 if after is None else int(after) + 1
        return {f"{i:04d}": i for i in range(start, start + limit)}, f"{start + limit - 1:04d}"

    for name in ("0000", "0100", "0200"):
        cache.find("f", name, read)  # each a page: the oldest (0 to 9) goes
    assert cache.held == 20
    assert cache.find("f", "0105", never) == 105 and cache.find("f", "0205", never) == 205
    assert cache.find("f", "0005", read) is MISS and cache.held == 20  # read again, after 0005
    clock.now += 1.01  # the pages expire having answered fewer than a lookup in eight entries
    assert cache.find("f", "0205", never) is MISS and cache.held == 0
    clock.now += 1.9  # within two lifetimes: name by name
    assert cache.find("f", "0210", never) is MISS and cache.held == 0
    clock.now += 0.2  # two lifetimes later
    assert cache.find("f", "0210", read) is MISS and cache.held == 10


def lookups_over(names: list[str], order: list[str], per_second: float = 8000.0) -> tuple[float, float]:
    """Names read by pages, and lookups no page answered, per lookup, when ``order`` (names of
    a folder holding ``names``) is looked up at ``per_second`` through a cache with the
    mount's defaults."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, clock=clock)
    ordered = sorted(names)
    read_names = misses = 0

    def read(_folder, after, limit):
        nonlocal read_names
        i = 0 if after is None else bisect.bisect_right(ordered, after)
        got = ordered[i : i + limit]
        read_names += len(got)
        return dict.fromkeys(got, "node"), (got[-1] if i + limit < len(ordered) else None)

    for name in order:
        clock.now += 1 / per_second
        misses += cache.find("f", name, read) is MISS
    return read_names / len(order), misses / len(order)


def test_names_looked_up_at_random_over_a_large_folder_read_no_page_after_page():
    """Every name of a folder of 20,000 looked up in random order: four pages hold a fifth of
    it, so each page read is pushed out by the next before it answers much. Pages that answer
    too few when pushed out stop the folder's pages for a while: about a name read per lookup,
    not the 25 of a page read every 32 misses. Names looked up in the listing's order (ls -l,
    du) or in numeric order (a loop over chunk numbers) still come from pages."""
    names = [str(i) for i in range(20_000)]
    shuffled = names[:]
    random.Random(1).shuffle(shuffled)
    per_lookup, _ = lookups_over(names, shuffled)
    assert per_lookup < 3, per_lookup
    per_lookup, missed = lookups_over(names, sorted(names))
    assert per_lookup < 1.1 and missed < 0.05, (per_lookup, missed)
    per_lookup, missed = lookups_over(names, names)
    assert per_lookup < 2 and missed < 0.2, (per_lookup, missed)


def test_a_numeric_loop_on_a_loaded_machine_gets_pages_again_for_the_names_that_pay():
    """Names 0, 1, 2, ... of a folder of 20,000 at 3,000 lookups a second (the rate of a
    loaded machine): the pages of the 4-digit names pay least (``1000`` reads ``10000``...
    ``10939`` beside ``1001``...``1093``, which expire unused) and stop the folder's pages;
    the 5-digit names that follow, whose pages pay, must get pages again rather than being
    looked up one by one for the rest of the run (it was ten lifetimes: 0.86 of the lookups
    missed, every 5-digit name among them)."""
    names = [str(i) for i in range(20_000)]
    per_lookup, missed = lookups_over(names, names, per_second=3000.0)
    assert missed < 0.5 and per_lookup < 2, (per_lookup, missed)


def folder_of(n: int, calls: list):
    """A ``read`` of a folder of names ``0`` to ``n - 1``; ``calls`` gets each call's
    arguments. A whole read (third argument) of a larger folder gives no nodes."""
    ordered = sorted(map(str, range(n)))

    def read(_folder, after, limit, whole=False):
        calls.append((after, limit, whole))
        i = 0 if after is None else bisect.bisect_right(ordered, after)
        got = ordered[i : i + limit]
        last = got[-1] if i + limit < len(ordered) else None
        if whole and last is not None:
            return {}, last
        return {name: f"node-{name}" for name in got}, last

    return read


def lookups(cache, clock, folder, names, read, per_second, present=lambda name: True):
    """``names`` looked up in ``folder`` at ``per_second``, as ``Tree.find`` does: a lookup
    no snapshot answered that found its name tells the cache so."""
    for name in names:
        clock.now += 1 / per_second
        if cache.find(folder, name, read) is MISS and present(name):
            cache.found_name(folder)


def test_a_folder_whose_names_are_looked_up_fast_and_found_is_read_whole():
    """A numeric loop over a folder of 20,000 (its names in another order than the folder's):
    the lookups that made it busy found their names and came fast, so the whole folder is read
    at once (after a scan of its names only, within the bound) and answers every later one,
    where pages from each name looked up would answer few."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, clock=clock)
    calls: list = []
    read = folder_of(20_000, calls)
    lookups(cache, clock, "f", map(str, range(20_000)), read, per_second=30_000)
    assert calls == [(None, 32768, True)], calls[:3]
    assert cache.hits == 20_000 - 32 and cache.held == 20_000
    clock.now += 1.01  # past its lifetime, the loop again: read whole again
    lookups(cache, clock, "f", map(str, range(100)), read, per_second=30_000)
    assert calls == [(None, 32768, True)] * 2


def test_names_looked_up_and_not_found_never_read_a_folder_whole():
    """A zarr client probing chunks that are not there: the page from the name looked up, as
    before (a name past the folder's last one reads nothing and answers every later one)."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, clock=clock)
    calls: list = []
    lookups(cache, clock, "f", [f"missing{i}" for i in range(5000)], folder_of(20_000, calls),
            per_second=15_000, present=lambda name: False)
    assert [c[2] for c in calls] == [False] * len(calls) and calls[0][0] is None
    assert cache.hits > 4800  # after the first page (from the first name) and one from a name


def test_names_found_slowly_get_pages_and_a_folder_too_large_is_scanned_once():
    """Lookups at 3,000 a second pay for 18,000 names read in a lifetime: the folder of 20,000
    is found larger by a scan of its names, then read by pages, and not scanned again until the
    lookups come fast enough to pay for twice that (or the bound). A folder larger than the
    whole bound is scanned once (the bound), then read by pages."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, clock=clock)
    calls: list = []
    lookups(cache, clock, "f", map(str, range(20_000)), folder_of(20_000, calls), per_second=3000)
    wholes = [c for c in calls if c[2]]
    assert wholes == [(None, 17999, True)] or wholes == [(None, 18000, True)], wholes
    assert len(calls) > 2 and all(c[1] == cache.limit for c in calls if not c[2])
    calls.clear()  # a little faster: not scanned again until the lookups would pay for twice

    def later():  # past the pages' lifetime and the name-by-name spell their retirement starts
        clock.now += 1.01
        cache.find("f", "0", never)
        clock.now += 2.01

    later()
    lookups(cache, clock, "f", map(str, range(2000)), folder_of(20_000, calls), per_second=5000)
    assert calls and not any(c[2] for c in calls)
    later()  # fast enough for the bound: the whole folder
    lookups(cache, clock, "f", map(str, range(2000)), folder_of(20_000, calls), per_second=15_000)
    assert [c for c in calls if c[2]] == [(None, 32768, True)] and cache.held == 20_000
    calls.clear()
    lookups(cache, clock, "big", map(str, range(20_000)), folder_of(100_000, calls), per_second=15_000)
    assert [c for c in calls if c[2]] == [(None, 32768, True)]


def test_a_whole_read_is_bounded_by_the_snapshots_bound():
    """A whole read holds at most half of what the snapshots may hold together; with a bound
    below two pages, none is made (the first page is the whole folder or a page)."""
    assert FolderCache(ttl=1.0, clock=Clock(), entries=10_000).whole == 5000
    clock = Clock()
    cache = FolderCache(ttl=1.0, clock=clock, entries=100)
    calls: list = []
    lookups(cache, clock, "f", map(str, range(500)), folder_of(20_000, calls), per_second=30_000)
    assert cache.whole == cache.limit == 100 and calls and not any(c[2] for c in calls)


def test_clear_drops_snapshots_but_remembers_what_it_knows_of_folders():
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock, limit=10)
    assert cache.find("small", "a", whole({"a": 1})) == 1
    assert cache.find("huge", "0005", lambda _folder, after, limit: ({"0005": 5}, "0009")) == 5
    cache.clear()
    assert cache.find("small", "a", never) is MISS and cache.held == 0
    clock.now += 1.01  # after the quiet time that follows a write
    assert cache.find("small", "new", whole({"new": 1})) == 1  # read again
    got: list = []
    cache.find("huge", "0005", lambda _folder, after, limit: got.append(after) or ({}, "0020"))
    assert got == ["0005"]  # known larger than a page


def test_no_snapshot_is_made_while_the_mount_writes():
    """Each write clears the snapshots; making them again while a folder fills up would read
    the growing folder every few files."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=2, clock=clock)
    for _ in range(10):
        cache.clear()  # a file created through the mount
        assert cache.find("f", "x", never) is MISS
        clock.now += 0.1
    clock.now += 1.0  # quiet for ttl: busy lookups make a snapshot again
    cache.find("f", "x", whole({}))
    assert cache.find("f", "x", whole({})) is None


def test_a_snapshot_that_answered_few_lookups_is_not_made_again():
    """Reading 800 entries to answer a few lookups does not pay: next time the folder is
    looked up name by name (for two lifetimes); one that answered many is read again."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock)
    many = {str(i): i for i in range(800)}
    assert cache.find("sparse", "1", whole(many)) == 1
    for _ in range(50):  # fewer than 800 / 8
        cache.find("sparse", "2", never)
    assert cache.find("busy", "1", whole(many)) == 1
    for _ in range(150):
        cache.find("busy", "2", never)
    clock.now += 1.01
    assert cache.find("sparse", "1", never) is MISS
    assert cache.find("busy", "again", whole({"again": 1})) == 1
    clock.now += 2.0  # two lifetimes after it was found not worth it
    assert cache.find("sparse", "later", whole({"later": 1})) == 1


def test_at_most_folders_snapshots_are_kept():
    cache = FolderCache(ttl=1.0, hot=1, folders=2, clock=Clock())
    for name in ("a", "b", "c"):
        cache.find(name, name, whole({name: 1}))
    assert cache.folders_held == 2
    assert cache.find("a", "a", whole({"a": 2})) == 2  # "a" was evicted


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


def test_a_page_of_a_folder_is_exactly_the_names_between_its_ends(tree):
    """A page read after any name holds the next names in name order, each as the whole
    folder's snapshot has it, though key order is not name order (``foo/`` keys sort after
    ``foo-max``'s and ``foo.bar``'s)."""
    keys = ["g/foo/0", "g/foo-max", "g/foo.bar", "g/foo bar/1", "g/a", "g/b/0/0", "g/b0", "g/c"]
    tree.driver.transact(lambda t: [t.put(k, b"x" * n) for n, k in enumerate(keys)])
    tree.mkdir("g/empty", 0o750)
    full = tree.folder_nodes("g", limit=100)
    names = sorted(full)
    assert names == ["a", "b", "b0", "c", "empty", "foo", "foo bar", "foo-max", "foo.bar"]
    for size in (1, 2, 3):
        for i, after in enumerate([None, *names]):
            nodes, last = tree.listings.folder_page("g", after, size)
            want = names[i : i + size]
            assert nodes == {n: full[n] for n in want}, (after, size)
            assert last == (want[-1] if i + size < len(names) else None), (after, size)


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
    tree.store([("f/0", b"longer", None, REWRITE)])
    assert tree.find("f/0").size == 6
    assert tree.find("f/new").size == 3
    assert tree.find("f").kind == DIR  # the root's snapshot: a folder


def test_a_loop_over_a_folders_names_in_another_order_reads_it_whole(tree):
    """Through the tree, on each driver: lookups that find their names tell the cache, which
    reads the folder (larger than a page) whole at once; a whole read of a folder larger than
    asked gives no nodes, only where it stopped."""
    tree.driver.transact(lambda t: [t.put(f"n/{i}", b"v" * (i % 5)) for i in range(3000)])
    tree.folder_cache = cache = FolderCache(ttl=60.0, hot=8, limit=100)
    for i in range(3000):
        assert tree.find(f"n/{i}").size == i % 5
    assert cache.builds == 1 and cache.hits == 3000 - 8 and cache.held == 3000
    nodes, last = tree.listings.folder_page("n", None, 100, True)
    assert nodes == {} and last == sorted(map(str, range(3000)))[99]


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
    # Once the snapshot (0.5 s) and the kernel's entries (0.2 s) lapse: a generous deadline, a
    # bound on a snapshot kept for good, not on how soon.
    eventually(lambda: (folder / "from-elsewhere").exists(), "another writer's file")
    assert (folder / "from-elsewhere").read_bytes() == b"12345"


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("kind", ["lmdb", "redis"])
def test_a_stat_loop_reads_a_local_folder_whole_and_a_servers_by_pages(
    kind, tmp_path, request, mount_factory
):
    """1,500 files (more than a page) looked up in numeric order through a fresh mount: on LMDB
    one read of the whole folder; on a server by pages (a whole read each lifetime cost a Redis
    mount's stat loop in numeric order 40-50% of its rate)."""
    import json
    import subprocess
    import sys

    url = make_url(kind, tmp_path, request)
    m = mount_factory(url, ["create"])
    (m.path / "f").mkdir()
    for i in range(1500):
        (m.path / "f" / str(i)).write_bytes(b"v")
    m.stop()
    # Snapshots live a minute: on a busy machine the loop may take longer than the default
    # second, and the rate a whole read needs falls to a few lookups a second.
    m = mount_factory(url, ["dir_cache=60"])
    for i in range(1500):
        assert os.stat(m.path / "f" / str(i)).st_size == 1
    command = [sys.executable, "-m", "zarrfs", "status", "--json", str(m.path)]
    status = subprocess.run(command, check=True, capture_output=True, text=True)
    snapshots = json.loads(status.stdout)["folder_snapshots"]
    if kind == "lmdb":
        assert snapshots["built"] == 1 and snapshots["entries"] == 1500, snapshots
    else:
        assert snapshots["built"] >= 2 and snapshots["entries"] <= 2048, snapshots


def test_what_the_snapshots_hold_together_stays_within_the_bound():
    """``entries`` bounds the snapshots together: the oldest go to make room, and no page is
    larger than the bound (``-o dir_cache_entries=``)."""
    clock = Clock()
    cache = FolderCache(ttl=1.0, hot=1, clock=clock, entries=100, limit=1000)
    assert cache.limit == 100
    built: list[int] = []

    def of(n: int):
        def read(_folder, after, limit):
            built.append(limit)
            names = list(map(str, range(min(n, limit))))
            return dict.fromkeys(names), (names[-1] if n > limit else None)

        return read

    assert cache.find("a", "0", of(60)) is None and cache.held == 60
    assert cache.find("b", "0", of(30)) is None and cache.held == 90
    cache.find("c", "0", of(50))  # "a" goes to make room
    assert cache.held == 80 and cache.folders_held == 2
    assert cache.find("a", "0", of(60)) is None  # made again: "b" and "c" go (50 + 60 > 100)
    assert cache.held == 60 and cache.folders_held == 1
    assert cache.find("d", "0", of(40)) is None and cache.held == 100
    cache.find("huge", "0", of(1000))  # a page of 100: every other goes
    assert built[-1] == 100 and cache.held == 100 and cache.folders_held == 1
    cache.forget({"huge"})
    assert cache.held == 0
    cache.find("d", "0", of(40))
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

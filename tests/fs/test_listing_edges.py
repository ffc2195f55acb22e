"""Listings at the edges of their batches, on every driver, at every batch size in play.

Every layer that lists in batches resumes after the last key or name of a batch: the folder
listing's scans (``zarrfs.fs.listing.SCAN_BATCH``, 256; ``ZARRFS_LISTING_BATCH`` for a mount),
a readdir's windows (128 entries, then 4 times more up to 4096), the reads of a whole folder
(512), the drivers' own round trips (PostgreSQL 512 rows, the Redis index 1000 members),
``zarrfs.store`` (1000 keys) and ``zarrfs copy`` (256). A wrong resume point (after
``last + "~"`` instead of ``last + "\\0"``, or at ``last`` again) loses or repeats exactly the
names that extend the last one. So the folders here are chains of such names: ``n0042``,
``n0042!``, ``n0042!0``, ... twelve deep, with characters below '/', above it and beyond
ASCII, some of them folders; wherever a batch ends (except before the first name of a chain),
the next name extends the last. Each listing must give every name once, in order.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from mounting import DRIVERS, Mount, make_url

from zarrfs.backends import open_driver
from zarrfs.fs import listing as listing_module
from zarrfs.fs.listing import DirListing
from zarrfs.fs.tree import Tree

# Characters a chain extends a name with: below '/' (where a name's folder sorts after the
# names extending it), above it, beyond ASCII; '~' too, which a resume at last + "~" finds.
EXTEND = [" ", "0", "!", "_", "-", "a", ".", "~", "\u00e9", "A", "\U0001f600", "}"]
# Only characters above '/': no name waits for a later batch to tell whether a folder of a
# shorter name sorts after it, so every batch ends where its scan ended.
PLAIN = ["0", "_", "a", "A", "}", "\u00e9", "b", "~", "1", "\U0001f600", "z", "9"]
CHAIN = 12


def chains(
    count: int, folders_every: int = 0, extend: list[str] = EXTEND, chain: int = CHAIN
) -> tuple[list[str], list[str]]:
    """(names in order, keys): ``count`` names in chains of ``chain``, each extending the one
    before by a character of ``extend``; with ``folders_every``, every such name is a folder
    (one key below it)."""
    names: list[str] = []
    base = 0
    while len(names) < count:
        name = f"n{base:04d}"
        for depth in range(chain):
            if len(names) == count:
                break
            if depth:
                name += extend[(base + depth) % len(extend)]
            names.append(name)
        base += 1
    every = folders_every or len(names) + 1
    keys = [f"{n}/k" if i % every == every - 1 else n for i, n in enumerate(names)]
    return sorted(names), keys


def _fill(driver, folder: str, keys: list[str]) -> None:
    for i in range(0, len(keys), 2000):
        part = keys[i : i + 2000]
        driver.transact(lambda t, part=part: [t.put(f"{folder}/{k}", b"v") for k in part])


def _expect(listed: list[str], names: list[str], what: str) -> None:
    if listed == names:
        return
    seen = set(listed)
    missing = [n for n in names if n not in seen]
    repeated = sorted({n for n in listed if listed.count(n) > 1}) if len(listed) != len(seen) else []
    out_of_order = next((i for i in range(1, len(listed)) if listed[i - 1] >= listed[i]), None)
    raise AssertionError(
        f"{what}: {len(listed)} names listed, {len(names)} expected; missing {missing[:5]}, "
        f"repeated {repeated[:5]}, first out of order at {out_of_order}"
    )


def _tree_listings(tree: Tree, folder: str, names: list[str], limits: list[int]) -> None:
    """Every in-process way of listing the folder."""
    _expect([n for n, _, _ in tree.list_dir(folder, limit=len(names) + 10)], names, "list_dir, whole")
    for limit in limits:  # resumed by token, ``limit`` names at a time
        got, after = [], None
        while True:
            part = tree.list_dir(folder, after=after, limit=limit)
            got += [n for n, _, _ in part]
            if len(part) < limit:
                break
            after = part[-1][2]
        _expect(got, names, f"list_dir by {limit}")
    listing = DirListing(tree.listings, folder)
    _expect([n for n, _, _ in listing.entries(0)][2:], names, "readdir windows")
    nodes = tree.folder_nodes(folder, len(names) + 10)
    assert nodes is not None
    _expect(sorted(nodes), names, "folder_nodes")


VARIANTS = {"files": (0, EXTEND), "folders": (1, EXTEND), "mixed": (3, EXTEND), "plain": (1, PLAIN)}


@pytest.fixture(params=["memory", *DRIVERS])
def url(request, tmp_path) -> str:
    if request.param == "memory":
        import uuid

        return f"memory://{uuid.uuid4().hex}"
    return make_url(request.param, tmp_path, request)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_real_batch_sizes(url, variant):
    """7,000 names: past every real batch (the fourth readdir window ends at 6,784 entries)."""
    names, keys = chains(7000, *VARIANTS[variant])
    with open_driver(url) as driver:
        _fill(driver, "big", keys)
        tree = Tree(driver, uid=0, gid=0)
        _tree_listings(tree, "big", names, [128, 256, 512, 1000, 4096])
        scanned = [k for k, _ in driver.scan("big/", "big0")]  # the driver's own batches
        _expect(scanned, sorted(f"big/{k}" for k in keys), "driver scan")


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 7, 16])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_small_batch_sizes(url, variant, batch, monkeypatch):
    """The listing's own batches made small: every name sits at a batch's edge somewhere."""
    monkeypatch.setattr(listing_module, "SCAN_BATCH", batch)
    monkeypatch.setattr(listing_module, "FIRST_BATCH", batch)
    monkeypatch.setattr(listing_module, "MAX_BATCH", batch * 4)
    monkeypatch.setattr(listing_module, "FOLDER_BATCH", batch)
    # Chains longer than a batch: a batch of one chain's names alone resumes after its last.
    names, keys = chains(150, *VARIANTS[variant], chain=20)
    with open_driver(url) as driver:
        _fill(driver, "d", keys)
        _tree_listings(Tree(driver, uid=0, gid=0), "d", names, [1, batch, batch + 1])


def test_store_and_copy(url, tmp_path):
    """``zarrfs.store`` (1000 keys a batch) and ``zarrfs copy`` (256) across their batches."""
    import zarrfs
    from zarrfs.store import DatabaseStore

    names, keys = chains(2600, 3)
    with open_driver(url) as driver:
        _fill(driver, "s", keys)
    store = DatabaseStore(url)

    async def listed():
        return [k async for k in store.list_prefix("s/")], [k async for k in store.list_dir("s/")]

    try:
        prefix, children = asyncio.run(listed())
    finally:
        store.close()
    _expect(sorted(prefix), sorted(f"s/{k}" for k in keys), "store list_prefix")
    _expect(sorted(children), names, "store list_dir")  # in key order: a folder after "name!"
    if not url.startswith("memory:"):
        zarrfs.copy(url, str(tmp_path / "copied"))
        root = tmp_path / "copied"
        copied = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
        _expect(sorted(copied), sorted(f"s/{k}" for k in keys), "copy")


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
@pytest.mark.parametrize("batch", [None, 3])
def test_through_a_mount(db_url, tmp_path, batch, monkeypatch):
    """``ls`` (getdents in the kernel's windows) and ``scandir`` of 7,000 chained names, with
    the real batch size and with ``ZARRFS_LISTING_BATCH=3``."""
    names, keys = chains(7000 if batch is None else 400, 3)
    with open_driver(db_url) as driver:
        _fill(driver, "big", keys)
    if batch is not None:
        monkeypatch.setenv("ZARRFS_LISTING_BATCH", str(batch))
    with Mount(db_url, tmp_path / "mnt", ["create", "validate=off"]) as m:
        _expect(sorted(os.listdir(m.path / "big")), names, "listdir")
        _expect(os.listdir(m.path / "big"), names, "listdir order")
        with os.scandir(m.path / "big") as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        _expect([n for n, _ in entries], names, "scandir")
        folders = {k[:-2] for k in keys if k.endswith("/k")}
        assert {n for n, d in entries if d} == folders
        m.assert_clean_log()



@pytest.mark.parametrize("batch", [3, 256])
@pytest.mark.parametrize("variant", ["files", "mixed"])
def test_a_listings_sizes_are_each_files_stored_size(url, variant, batch, monkeypatch):
    """A listing reads each file's size with its names (what READDIRPLUS replies with): from
    its scans once a batch held files alone, and for a first batch of files alone from one
    scan of that batch's range, which passes no other key. Every file listed has its stored
    size, at every batch edge and resume; on SQLite a listing of 600 files costs a few
    statements, not one a file."""
    from zarrfs.fs.node import FILE

    monkeypatch.setattr(listing_module, "SCAN_BATCH", batch)
    names, keys = chains(600, *VARIANTS[variant])
    values = {k: b"v" * (i % 50) for i, k in enumerate(keys)}
    want = {k: len(v) for k, v in values.items() if "/" not in k}
    with open_driver(url) as driver:
        driver.transact(lambda t: [t.put(f"d/{k}", v) for k, v in values.items()])
        tree = Tree(driver, uid=0, gid=0)
        statements: list[str] = []
        sqlite = url.startswith("sqlite")
        for limit in (7, 128, 1000):
            if sqlite and limit > 7:  # the statements of the listings by 128 and 1000
                driver.conns.get().set_trace_callback(statements.append)
            got, after = {}, None
            while True:
                sizes: dict[str, int] = {}
                part = tree.list_dir("d", after=after, limit=limit, sizes=sizes)
                got.update((name, sizes.get(name)) for name, kind, _ in part if kind == FILE)
                if len(part) < limit:
                    break
                after = part[-1][2]
            assert sorted(got) == sorted(want), limit
            known = {name: size for name, size in got.items() if size is not None}
            assert known == {name: want[name] for name in known}, limit
            if variant == "files":
                assert len(known) == len(want), limit  # every size read with the names
        if sqlite:
            driver.conns.get().set_trace_callback(None)
        if sqlite and batch == 256 and variant == "files":
            # 600 names by 128 and by 1000: 6 listings of a few scans each, not a read a file
            assert len(statements) < 100, len(statements)

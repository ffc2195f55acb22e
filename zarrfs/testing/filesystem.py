"""Filesystem semantics every driver must give, as a test class a driver's own tests subclass.

Subclass :class:`FilesystemConformance` in a test module and give it a ``driver_url`` fixture: a
fresh, empty database for each test (``f"mydb://{tmp_path}/db"``). Its name does not start with
``Test``, so pytest collects only the subclasses. Everything goes through
:class:`zarrfs.fs.tree.Tree` and :class:`zarrfs.fs.listing.DirListing` (the filesystem without
FUSE): folders derived from keys, listings (exact for every name, across batches and
resumptions), mkdir markers, symlinks, rename and link, attributes, open files; hard links
(:mod:`zarrfs.testing.links`).
"""

from __future__ import annotations

import errno
import os
import random
import stat
import time
from functools import partial

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.base import DATA, SIDE
from zarrfs.fs import listing as listing_module
from zarrfs.fs.api import Operations
from zarrfs.fs.commitoptions import CREATE, CommitOptions
from zarrfs.fs.errors import FsError
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.listing import DirListing
from zarrfs.fs.sidedata import DIR_MARK, LINK_MARK, attr_key, entry_key
from zarrfs.fs.tree import DIR, FILE, LINK, RENAME_EXCHANGE, RENAME_NOREPLACE, Tree
from zarrfs.testing.links import LinkConformance


def put(tree: Tree, *keys: str, value: bytes = b"v") -> None:
    """Store ``keys`` directly in the database (as another writer would), each set to ``value``."""
    tree.driver.transact(lambda t: [t.put(k, value) for k in keys])


def names(tree: Tree, key: str) -> list[tuple[str, int]]:
    """``(name, kind)`` of every entry of folder ``key`` as ``readdir`` lists it (no . and ..)."""
    return [(n, k) for n, k, _ in DirListing(tree.listings, key).entries(0)][2:]


def errno_of(fn) -> int:
    """The errno of the :class:`FsError` that ``fn()`` raises."""
    with pytest.raises(FsError) as info:
        fn()
    return info.value.errno


def _take(it, n):
    for i, item in enumerate(it):
        if i >= n:
            return
        yield item


# Characters around '/' in sort order (' ', '!', '-', '.' sort before it; '0', '_', '~' after),
# and characters of two, three and four UTF-8 bytes: names built from them are prefixes of one
# another with every kind of character following the prefix.
_ALPHABET = [" ", "!", "-", ".", "0", "_", "~", "a", "\u00e9", "\u2603", "\U0001f600"]
_TRICKY = ["foo", "foo-max", "foo.bar", "foo bar", "foo!", "foo0", "foo_", "foo~", "fo", "foo\u00e9"]


class _Held:
    """The nodes a kernel holds, by key (``fs.listing.Held``): a listing gives their names
    without attributes."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.added = 0  # grows with each key held (``fs.listing.Held.added``)

    def hold(self, key: str) -> None:
        self.keys.add(key)
        self.added += 1

    def holds(self, key: str, kind: int) -> bool:
        return key in self.keys

    def holds_none(self, keys: list[str]) -> bool:
        return self.keys.isdisjoint(keys)


def _random_names(rng: random.Random, count: int) -> list[str]:
    """Names, many of them prefixes of others."""
    pool: list[str] = []
    while len(pool) < count:
        if pool and rng.random() < 0.6:  # extend a name: the two sort around each other's folder
            pool.append(rng.choice(pool) + "".join(rng.choices(_ALPHABET, k=rng.randint(1, 2))))
        else:
            pool.append("".join(rng.choices(_ALPHABET, k=rng.randint(1, 3))))
    return sorted(set(pool))


def _expected_children(keys: list[str], folder: str) -> set[str]:
    """The names ``keys`` give ``folder``: not ``.`` nor ``..``, which no path reaches (a listing
    has its own)."""
    prefix = folder + "/" if folder else ""
    below = [k[len(prefix) :] for k in keys if k.startswith(prefix) and len(k) > len(prefix)]
    return {rest.partition("/")[0] for rest in below} - {".", ".."}


class FilesystemConformance(LinkConformance):
    """Filesystem semantics over one driver; subclasses provide the ``driver_url`` fixture (a
    fresh, empty database for each test)."""

    @pytest.fixture
    def driver_url(self) -> str:
        """The URL of a fresh, empty database; a subclass overrides this fixture."""
        raise NotImplementedError("a FilesystemConformance subclass provides the driver_url fixture")

    @pytest.fixture
    def tree(self, driver_url):
        """A tree over a fresh database."""
        driver = open_driver(driver_url)
        yield Tree(driver, uid=1000, gid=1000)
        driver.close()

    def test_folders_derive_from_keys(self, tree):
        put(tree, "g/a/0.0", "g/a/.zarray", "g/.zgroup")
        assert tree.lookup("g").kind == DIR
        assert tree.lookup("g/a").kind == DIR
        node = tree.lookup("g/a/0.0")
        assert (node.kind, node.size) == (FILE, 1)
        assert errno_of(lambda: tree.lookup("g/b")) == errno.ENOENT
        assert names(tree, "g") == [(".zgroup", FILE), ("a", DIR)]

    def test_listing_orders_like_keys_and_skips_subtrees(self, tree):
        # '.' sorts before '/', so the file "0.0" comes between folder "0"'s key and its children.
        put(tree, "a/0/0", "a/0/1", "a/0.0", "a/1", "a/10", "a/1/x")
        listed = names(tree, "a")
        assert sorted(listed) == sorted([("0", DIR), ("0.0", FILE), ("1", DIR), ("10", FILE)])
        assert len(listed) == 4  # "1" is a folder: the key "a/1" is hidden, not listed twice

    def test_a_key_is_hidden_by_its_folder_whatever_sorts_between_them(self, tree):
        # "1.0" sorts between the key "1" and its folder's "1/x"; "20" follows "2", which has none.
        put(tree, "b/1", "b/1.0", "b/1/x", "b/2", "b/20", "b/3", "b/3-a", "b/30")
        assert sorted(names(tree, "b")) == sorted(
            [("1", DIR), ("1.0", FILE), ("2", FILE), ("20", FILE), ("3", FILE), ("3-a", FILE), ("30", FILE)]
        )
        assert tree.folder_nodes("b", 100)["1"].kind == DIR

    def test_listing_resumes_across_batches(self, tree):
        keys = [f"big/{i:05d}" for i in range(3000)] + [f"big/n{i}/0" for i in range(300)]
        put(tree, *keys)
        listing = DirListing(tree.listings, "big")
        first = list(_take(listing.entries(0), 500))
        rest = list(listing.entries(first[-1][2]))
        got = [n for n, _, _ in first + rest][2:]
        assert len(got) == 3300 and len(set(got)) == 3300
        again = [n for n, _, _ in listing.entries(0)][2:]  # rewind
        assert again == got

    def test_a_listing_read_ahead_lists_what_it_would_have_read(self, tree):
        """Windows read ahead between a listing's requests (``DirListing.read_ahead``: what a
        mount does while the kernel takes a reply in) are taken as read, and the listing is the
        one read without them: the same entries, offsets and nodes, across windows, files of
        every size, subfolders and a side record."""
        keys = [f"r/{i:05d}" for i in range(3000)] + [f"r/{i:05d}.d/0" for i in range(0, 3000, 97)]
        tree.driver.transact(lambda t: [t.put(k, b"x" * (i % 29)) for i, k in enumerate(keys)])
        tree.set_attrs("r/00100", mode=0o600)

        def walk(ahead: bool) -> list:
            listing = DirListing(tree.listings, "r")
            listing.plus = True
            out, offset = [], 2
            while rows := listing.rows(offset, 700):
                for name, kind, at in rows:
                    node = listing.node(name)
                    out.append((name, kind, at, node.kind, node.size, node.attrs.mode))
                offset = rows[-1][2]
                while ahead and listing.read_ahead(offset, 700):
                    pass
            return out

        listings = tree.listings
        read, taken = listings.read_ahead, listings.taken
        plain = walk(False)
        assert (listings.read_ahead, listings.taken) == (read, taken)
        assert walk(True) == plain and len(plain) == 3000 + len(range(0, 3000, 97))
        assert listings.taken - taken == listings.read_ahead - read > 0

    def test_a_window_read_ahead_beside_a_request_of_the_same_listing(self, tree):
        """With request threads the window read ahead and a request of the same listing may
        run by turns, each letting the other in while it waits on the server: a read ahead
        inside a request's read of a window, and a request that reads a window inside a read
        ahead. Either way the listing gives each name once, in order."""
        names = [f"{i:05d}" for i in range(6000)]
        put(tree, *(f"w/{n}" for n in names))
        listings = tree.listings
        during: list = []  # what runs while the next read of the listing "waits on the server"
        real = listings.list_dir

        def list_dir(*args, **kwargs):
            if during:
                during.pop()()
            return real(*args, **kwargs)

        listings.list_dir = list_dir
        try:
            for inner in ("read ahead inside a request", "request inside a read ahead"):
                assert self._walk_by_turns(DirListing(listings, "w"), during, inner) == names, inner
        finally:
            del listings.list_dir

    @staticmethod
    def _walk_by_turns(listing: DirListing, during: list, inner: str) -> list[str]:
        listing.plus = True
        got: list[str] = []

        def step(offset: int) -> int | None:  # a READDIRPLUS request
            rows = listing.rows(offset, 700)
            got.extend(name for name, _, _ in rows)
            for name, _, _ in rows:
                assert listing.node(name) is not None, name
            return rows[-1][2] if rows else None

        def ahead(offset: int) -> None:  # what the loop does between requests
            while listing.read_ahead(offset, 700):
                pass

        def requests(offset: int, moved: list) -> None:  # until one reads a window
            start = listing.window_start
            while offset is not None and listing.window_start == start:
                offset = step(offset)
            moved.append(offset)

        offset = step(2)
        while offset is not None:
            if inner == "read ahead inside a request":
                during[:] = [partial(ahead, offset)]
                offset = step(offset)
            else:
                moved: list = []
                during[:] = [partial(requests, offset, moved)]
                ahead(offset)
                offset = moved[0] if moved else step(offset)
            during.clear()
        return got

    def test_a_window_read_ahead_before_a_change_is_read_again(self, tree):
        """A window read ahead and then changed (a write through the tree; another writer's,
        told as the change feed tells it: ``Listings.changed``) is read again when a request
        reaches it: the listing shows the new name and the new attributes."""
        put(tree, *(f"s/{i:05d}" for i in range(2000)))
        for change in ("write here", "another writer"):
            listing = DirListing(tree.listings, "s")
            listing.plus = True
            first = listing.rows(2, 1000)
            offset = first[-1][2]
            while listing.read_ahead(offset, 2000):
                pass
            if change == "write here":
                tree.set_attrs("s/01500", mode=0o640)
            else:
                put(tree, "s/01500x")
                tree.listings.told({"s", ""})
            rows, nodes = [], {}
            while more := listing.rows(offset, 1000):
                rows += more
                nodes |= {name: listing.node(name) for name, _, _ in more}
                offset = more[-1][2]
            if change == "write here":
                assert nodes["01500"].attrs.mode & 0o777 == 0o640
            else:
                assert "01500x" in nodes

    def test_a_window_being_given_is_read_again_after_another_writers_change(self, tree):
        """Nodes of the window a listing is giving, read before another writer's change that
        the change feed told of since (``Listings.told``), are read again for the entries
        given after it: the kernel was told of the change before it met those names, and
        would keep the window's attributes. A change told of another folder reads nothing."""
        put(tree, *(f"t/{i:03d}" for i in range(100)))
        listing = DirListing(tree.listings, "t")
        listing.plus = True
        rows = listing.rows(2, 50)
        assert listing.node(rows[0][0]).size == 1
        put(tree, "t/080", value=b"zz")
        tree.listings.told({"elsewhere"})
        assert listing.node("080").size == 1  # as read: nothing told of this folder
        tree.listings.told({"t", ""})
        rest = listing.rows(rows[-1][2], 100)
        assert [name for name, _, _ in rest][0] == "050"
        assert listing.node("080").size == 2
        # Told of more folders than are kept apart (a commit of chunks each in a folder of its
        # own): every folder counts as told, and none is kept.
        generation = tree.listings.generation
        tree.listings.told({f"f{i}" for i in range(listing_module.TOLD_FOLDERS + 1)})
        assert tree.listings.told_since("t", generation)

    def test_a_folder_another_writer_removed_is_no_node_of_the_window_being_given(self, tree):
        """A folder of the window a listing is giving, removed whole by another writer (its
        last key deleted) and told by the change feed, has no node when the window's nodes
        are read again: the listing's scan saw a folder, and the kernel, told of the change
        already, would keep a folder that is not there for its entry timeout. A folder
        still there is one, a folder that became a file is that file, and a symlink or
        FIFO removed has no node either (it was given as one with an empty target)."""
        put(tree, *(f"t/{i:03d}" for i in range(100)), "t/085d/deep/x", "t/086d/y", "t/087d/z")
        tree.symlink("somewhere", "t/088l")
        tree.mknod("t/089p", stat.S_IFIFO | 0o644, 0, 0, 0)
        listing = DirListing(tree.listings, "t")
        listing.plus = True
        rows = listing.rows(2, 50)
        assert listing.node("085d").kind == DIR and listing.node("088l").kind == LINK

        def change(t):  # another writer's
            t.delete("t/085d/deep/x")
            t.delete("t/087d/z")
            t.put("t/087d", b"abc")
            t.delete(entry_key("t/088l"), SIDE)
            t.delete(entry_key("t/089p"), SIDE)

        tree.driver.transact(change)
        tree.listings.told({"t", "t/085d", "t/085d/deep", "t/087d", ""})
        listing.rows(rows[-1][2], 100)
        assert listing.node("085d") is None
        assert listing.node("086d").kind == DIR
        assert (listing.node("087d").kind, listing.node("087d").size) == (FILE, 3)
        assert listing.node("088l") is None and listing.node("089p") is None

    def test_a_window_being_given_reads_again_the_names_this_mount_changed(self, tree):
        """Nodes of the window a listing is giving, read before this mount changed some of its
        names (``Listings.wrote``), are read again for those names, and only those: the
        kernel, which held the nodes it wrote through, may have forgotten them by the time the
        names are given, and would keep the window's attributes (a name removed here would
        be found again). A name whose node the caller holds stays unread."""
        put(tree, *(f"u/{i:03d}" for i in range(100)), "u/085d/deep/x")
        listing = DirListing(tree.listings, "u")
        listing.plus = True
        rows = listing.rows(2, 50)
        assert listing.node("080").size == 1 and listing.node("081").attrs.mode & 0o777 != 0o600
        assert listing.node("085d").kind == DIR
        tree.store([("u/080", b"zz", None, CommitOptions())])
        tree.set_attrs("u/081", mode=0o600)
        tree.unlink("u/082")
        tree.rename("u/085d", "v")  # a folder's keys move: it is gone from here
        tree.mkdir("elsewhere", 0o755)  # another folder's change reads nothing here
        before = listing.nodes
        rest = listing.rows(rows[-1][2], 100)
        assert [name for name, _, _ in rest][0] == "050"
        assert listing.node("080").size == 2
        assert listing.node("081").attrs.mode & 0o777 == 0o600
        assert listing.node("082") is None  # given without attributes
        assert listing.node("085d") is None
        assert listing.nodes is before and listing.node("083").size == 1  # the others as read
        # A commit of more keys than are kept apart (a folder's rename moves each key below
        # it) counts every name as written: kept whole, the keys would be a folder's size.
        listings = tree.listings
        generation = listings.generation
        listings.wrote([(DATA, f"v/{i:05d}", None) for i in range(listing_module.WROTE_KEYS + 1)])
        assert listings.written("u", generation) is None
        generation = listings.generation
        listings.wrote([(DATA, "u/083", b"")])
        assert listings.written("u", generation) == {"083"}

    @pytest.mark.parametrize("seed", range(int(os.environ.get("ZARRFS_KIT_SEEDS") or 16)))
    def test_random_changes_beside_a_listing_never_give_an_old_node(self, tree, monkeypatch, seed):
        """A listing walked a reply at a time in tiny windows, read ahead at random, while
        files of its folder are written, chmod'ed, removed and made, and subfolders made and
        removed whole, by this mount and by another writer (told as the change feed tells),
        and the kernel forgets nodes at random: every name given with attributes (one the
        kernel does not hold) has the size and mode stored now, a folder is one, and a name
        removed is given without any."""
        rng = random.Random(seed)
        monkeypatch.setattr(listing_module, "SCAN_BATCH", rng.choice([2, 3, 5]), raising=False)
        monkeypatch.setattr(listing_module, "FIRST_BATCH", rng.choice([2, 3]), raising=False)
        monkeypatch.setattr(listing_module, "MAX_BATCH", 8, raising=False)
        names_ = [f"{i:02d}" for i in range(30)]
        sizes = {n: rng.randrange(5) for n in names_}
        folders = {f"{i:02d}d" for i in range(0, 30, 3)}  # each a key below it, r/NNd/x
        tree.driver.transact(
            lambda t: [t.put(f"r/{n}", b"x" * size) for n, size in sizes.items()]
            + [t.put(f"r/{f}/x", b"") for f in folders]
        )
        modes: dict[str, int] = {}
        held = _Held()  # the nodes the kernel holds
        listing, offset = None, 2
        for step in range(200):
            action = rng.choice(
                ["request"] * 4 + ["ahead", "write", "chmod", "remove", "other", "folder", "forget"]
            )
            name = rng.choice(names_)
            key = f"r/{name}"
            if action == "request":
                if listing is None:
                    listing, offset = DirListing(tree.listings, "r"), 2
                    listing.plus = True
                listing.held = held
                rows = listing.rows(offset, rng.randint(1, 3))
                if not rows:
                    listing = None
                    continue
                offset = rows[-1][2]
                for listed, kind, _ in rows:
                    if held.holds(f"r/{listed}", kind):
                        continue  # given without attributes
                    node = listing.node(listed)
                    context = (seed, step, listed)
                    if kind == DIR:  # (or given without attributes: the kernel looks it up)
                        assert node is None or (listed in folders and node.kind == DIR), context
                        continue
                    if listed not in sizes:
                        assert node is None, context
                        continue
                    if node is None:
                        continue  # given without attributes: the kernel looks it up
                    assert node.size == sizes[listed], context
                    if listed in modes:
                        assert node.attrs.mode & 0o777 == modes[listed], context
                    held.hold(f"r/{listed}")
            elif action == "ahead" and listing is not None:
                listing.read_ahead(offset, rng.randint(1, 8))
            elif action == "write":
                sizes[name] = rng.randrange(6, 12)
                tree.store([(key, b"y" * sizes[name], None, CommitOptions())])
                held.hold(key)  # written through the kernel, which holds the node
            elif action == "chmod" and name in sizes:
                modes[name] = rng.choice([0o600, 0o640, 0o604])
                tree.set_attrs(key, mode=modes[name])
                held.hold(key)
            elif action == "remove" and name in sizes:
                tree.unlink(key)
                del sizes[name]
                modes.pop(name, None)
                held.keys.discard(key)
            elif action == "other":
                if name in sizes and rng.random() < 0.3:
                    tree.driver.delete(key)
                    del sizes[name]
                    modes.pop(name, None)
                else:
                    sizes[name] = rng.randrange(12, 20)
                    tree.driver.put(key, b"z" * sizes[name])
                tree.listings.told({"r"})  # the feed tells; the kernel drops what it held
                held.keys.discard(key)
            elif action == "folder":  # made or removed whole, here or by another writer
                folder = f"{name}d"
                inner = f"r/{folder}/x"
                here = rng.random() < 0.5
                if folder in folders:
                    folders.discard(folder)
                    if here:  # as rm -r does: the folder stays when its last file goes
                        tree.unlink(inner)
                        tree.rmdir(f"r/{folder}")
                    else:
                        tree.driver.delete(inner)
                else:
                    folders.add(folder)
                    if here:
                        tree.store([(inner, b"", None, CommitOptions())])
                    else:
                        tree.driver.put(inner, b"")
                if here and folder in folders:
                    held.hold(f"r/{folder}")  # made through the kernel, which holds it
                else:
                    held.keys.discard(f"r/{folder}")
                if not here:
                    tree.listings.told({"r", f"r/{folder}"})
            elif action == "forget":  # memory pressure: most of what the kernel holds
                held.keys = {k for k in held.keys if rng.random() < 0.2}

    def test_a_listings_nodes_are_those_lookups_find(self, tree):
        """The nodes READDIRPLUS replies with, read with each window of names (on a remote
        database their side records as ranges sent with the window's scans), are what a
        lookup finds: across windows, with attribute records on some names, hard links, a
        symlink and a folder marker, and a subfolder whose many descendants' records fill the
        ranges before the names after it are reached (those are then read one by one)."""
        files = [f"w/{i:04d}" for i in range(300)]
        tree.driver.transact(lambda t: [t.put(k, b"x" * (i % 23)) for i, k in enumerate(files)])
        deep = [f"w/0040m/{j:03d}" for j in range(300)]
        put(tree, *deep)
        for i, key in enumerate(files + deep):  # every deep key: the first window's ranges fill
            if i % 3 == 0 or key in deep:
                tree.set_attrs(key, mode=0o600 | (i % 8) << 6, uid=1000 + i)
        tree.link("w/0007", "w/0008l")
        tree.symlink("some/target", "w/0009s")
        tree.mkdir("w/0200d", 0o700)
        listing = DirListing(tree.listings, "w")
        listing.plus = True
        seen = []
        for name, kind, at in listing.entries(0):
            if at <= 2:
                continue
            node = listing.node(name)  # of the window the entry is in
            want = tree.lookup("w/" + name)
            def shown(n):
                return n.kind, n.size, n.attrs.mode, n.attrs.uid, n.nlink, n.target

            assert shown(node) == shown(want), name
            assert kind == want.kind
            seen.append(name)
        assert seen == sorted(["0040m", "0008l", "0009s", "0200d", *(k[2:] for k in files)])

    def test_listing_of_many_subfolders_across_batch_ends(self, tree):
        """zarr's c/0/0, c/1/0, ...: subfolders of one key each, of many keys (a batch ends inside
        one), files and a hidden key among them, and empty folders made with mkdir; listed whole,
        resumed after each entry, and snapshotted with sizes, each the same."""
        keys = [f"c/{i}/0" for i in range(300)] + [f"c/7/{j}" for j in range(1, 600)]
        keys += ["c/7.zarray", "c/150", "c/a", "c/b", "c/b.0"]  # "c/150" is hidden by folder "150"
        put(tree, *keys)
        tree.mkdir("c/empty", 0o755)
        tree.mkdir("c/150/sub", 0o755)
        expected = sorted(
            [(str(i), DIR) for i in range(300)]
            + [("7.zarray", FILE), ("a", FILE), ("b", FILE), ("b.0", FILE)]
            + [("empty", DIR)]
        )
        listed = names(tree, "c")
        assert sorted(listed) == expected and len(listed) == len(expected)
        listing = DirListing(tree.listings, "c")
        entries = list(listing.entries(0))[2:]
        resumed = [next(iter(listing.entries(prev[2])))[0] for prev in entries[:-1]]
        assert resumed == [n for n, _, _ in entries[1:]]
        nodes = tree.folder_nodes("c", 1000)
        assert sorted((n, node.kind) for n, node in nodes.items()) == expected
        assert nodes["a"].size == 1 and nodes["7"].kind == DIR

    def test_folder_snapshot_sizes_across_flat_runs_and_subfolders(self, tree):
        """Each file's size in a snapshot is its own, whether it came with the scan (a run of
        files) or was looked up (a batch that also held subfolders' keys)."""
        sizes = {f"f/{i:04d}": i % 37 for i in range(700)}  # flat: sizes come with later scans
        sizes |= {f"f/{i:04d}.x": 5 + i % 11 for i in range(300, 310)}
        sizes |= {f"f/d{i:04d}/0": 3 for i in range(400)}  # then a run of subfolders
        sizes |= {f"f/z{i:04d}": i % 13 for i in range(600)}  # then files again
        tree.driver.transact(lambda t: [t.put(k, b"s" * n) for k, n in sizes.items()])
        nodes = tree.folder_nodes("f", 10_000)
        files = {f"f/{n}": node.size for n, node in nodes.items() if node.kind == FILE}
        assert files == {k: n for k, n in sizes.items() if k.count("/") == 1}
        assert sum(node.kind == DIR for node in nodes.values()) == 400

    def test_mkdir_markers_and_parent_kept(self, tree):
        tree.mkdir("d", 0o755)
        tree.mkdir("d/e", 0o700)
        assert names(tree, "d") == [("e", DIR)]
        assert names(tree, "") == [("d", DIR)]
        assert errno_of(lambda: tree.mkdir("d", 0o755)) == errno.EEXIST
        assert errno_of(lambda: tree.mkdir("x/y", 0o755)) == errno.ENOENT
        put(tree, "k/sub/f")
        tree.unlink("k/sub/f")
        assert tree.lookup("k/sub").kind == DIR  # only rmdir removes a folder
        assert errno_of(lambda: tree.rmdir("k")) == errno.ENOTEMPTY
        tree.rmdir("k/sub")
        tree.rmdir("k")
        assert errno_of(lambda: tree.lookup("k")) == errno.ENOENT

    def test_rename_folder_moves_everything_atomically(self, tree):
        put(tree, "src/a/0.0", "src/.zarray")
        tree.set_attrs("src/.zarray", mode=0o600)
        tree.mkdir("src/empty", 0o755)
        tree.rename("src", "dst")
        assert errno_of(lambda: tree.lookup("src")) == errno.ENOENT
        assert tree.lookup("dst/a/0.0").kind == FILE
        assert tree.lookup("dst/empty").kind == DIR
        assert tree.lookup("dst/.zarray").attrs.mode & 0o777 == 0o600
        assert tree.driver.get("src/a/0.0") is None

    def test_rename_flags_and_errors(self, tree):
        put(tree, "a", value=b"A")
        put(tree, "b", value=b"B")
        assert errno_of(lambda: tree.rename("a", "b", RENAME_NOREPLACE)) == errno.EEXIST
        tree.rename("a", "b", RENAME_EXCHANGE)
        assert (tree.driver.get("a"), tree.driver.get("b")) == (b"B", b"A")
        tree.mkdir("d", 0o755)
        assert errno_of(lambda: tree.rename("a", "d")) == errno.EISDIR
        assert errno_of(lambda: tree.rename("d", "a")) == errno.ENOTDIR
        assert errno_of(lambda: tree.rename("d", "d/x")) == errno.EINVAL
        assert errno_of(lambda: tree.rename("nope", "z")) == errno.ENOENT

    def test_link_stores_the_new_name_or_fails_with_eexist(self, tree):
        put(tree, "tmp", value=b"meta")
        tree.link("tmp", "zarr.json")
        assert tree.driver.get("zarr.json") == b"meta"
        assert errno_of(lambda: tree.link("tmp", "zarr.json")) == errno.EEXIST

    def test_symlink_is_side_data(self, tree):
        tree.symlink("target/path", "ln")
        node = tree.lookup("ln")
        assert node.kind == LINK and tree.readlink("ln") == "target/path"
        assert tree.driver.get("ln") is None  # never a Zarr key
        assert names(tree, "") == [("ln", LINK)]

    def test_attrs_default_and_persist(self, tree):
        put(tree, "f")
        a = tree.lookup("f").attrs
        assert (a.uid, a.gid, a.mode & 0o777) == (1000, 1000, 0o644)
        tree.set_attrs("f", mode=0o600, uid=5, gid=-1, mtime=123)
        b = tree.lookup("f").attrs
        assert (b.mode & 0o777, b.uid, b.gid, b.mtime) == (0o600, 5, 1000, 123)
        assert Tree(tree.driver).epoch == tree.epoch  # the default time is stable across mounts

    def test_handles_commit_all_or_nothing(self, tree):
        tree.mkdir("d", 0o755)
        handles = HandleTable(tree, spill_threshold=1024)
        fh = handles.create("d/f", 0o644, os.O_WRONLY, 0, 0)
        handles.write(fh, b"x" * 5000, 0)  # spills to a temporary file
        assert tree.driver.get("d/f") is None  # nothing visible before the commit
        assert handles.pending("d/f").size == 5000
        handles.flush(fh)
        assert tree.driver.get("d/f") == b"x" * 5000
        handles.write(fh, b"y", 10)
        handles.release(fh)
        assert tree.driver.get("d/f")[9:12] == b"xyx"

    def test_decoded_view_encodes_a_temporary_file_renamed_onto_a_chunk(self, tree):
        import json
        import zlib

        import numpy as np

        from zarrfs.format.hooks import FormatHooks

        tree.hooks = FormatHooks(view="decoded")
        meta = {
            "zarr_format": 2,
            "shape": [8],
            "chunks": [4],
            "dtype": "<i4",
            "order": "C",
            "compressor": {"id": "zlib", "level": 1},
            "fill_value": 0,
            "filters": None,
        }
        tree.mkdir("arr", 0o755)
        tree.store([("arr/.zarray", json.dumps(meta).encode(), None, CREATE)])
        raw = np.arange(4, dtype="<i4").tobytes()
        tree.store([("arr/.0.tmp", raw, None, CREATE)])  # a temporary file: stored as written
        assert tree.driver.get("arr/.0.tmp") == raw
        tree.rename("arr/.0.tmp", "arr/0")
        stored = tree.driver.get("arr/0")
        assert zlib.decompress(stored) == raw  # encoded on arrival, as a write in place would be
        assert tree.read_value("arr/0") == raw
        tree.rename("arr", "moved")  # moving the whole array keeps the stored bytes as they are
        assert tree.driver.get("moved/0") == stored

    # ------------------------------------------------------------------ listings, every name
    def test_a_folder_named_as_a_prefix_of_its_siblings_is_listed_once(self, tree, driver_url):
        """``foo`` beside ``foo-max``, ``foo.bar``, ``foo bar``, ``foo!``: in the database
        ``foo-max/...`` sorts before ``foo/...`` ('-' < '/'), while the mkdir markers sort by
        name. Each is listed once, whole, resumed after each entry, and after a remount."""
        tricky = ["foo", "foo-max", "foo.bar", "foo bar", "foo!", "fo", "foo0"]
        tree.mkdir("g", 0o755)
        for name in tricky:
            tree.mkdir(f"g/{name}", 0o755)
            tree.store([(f"g/{name}/zarr.json", b"{}", None, CREATE)])
        tree.mkdir("g/foo-", 0o755)  # an empty folder: a marker alone
        tree.symlink("foo", "g/foo.link")
        put(tree, "g/foo.txt")
        expected = {n: DIR for n in [*tricky, "foo-"]} | {"foo.link": LINK, "foo.txt": FILE}
        for _remount in range(2):
            listed = names(tree, "g")
            assert len(listed) == len(expected), listed
            assert dict(listed) == expected
            got, after = [], None
            while True:  # one entry per call: every resume token
                part = tree.list_dir("g", after=after, limit=1)
                if not part:
                    break
                got.append(part[0][0])
                after = part[0][2]
            assert sorted(got) == sorted(expected)
            assert {n: node.kind for n, node in tree.folder_nodes("g", 100).items()} == expected
            tree.driver.close()  # and after a remount
            tree = Tree(open_driver(driver_url), uid=1000, gid=1000)
        tree.driver.close()

    def test_special_files_are_side_entries_listed_and_looked_up(self, tree):
        tree.mkdir("a", 0o2775, 5, 6)  # setgid: its group passes on
        tree.mknod("a/c", stat.S_IFCHR | 0o600, os.makedev(1, 3), 7, 8)
        tree.mknod("a/p", stat.S_IFIFO | 0o644, 0, 7, 8)
        assert names(tree, "a") == [("c", stat.S_IFCHR), ("p", stat.S_IFIFO)]
        nodes = tree.folder_nodes("a", 100)
        for node in (nodes["c"], tree.find("a/c")):
            assert (node.kind, node.rdev, node.size, node.attrs.uid, node.attrs.gid) == (
                stat.S_IFCHR,
                os.makedev(1, 3),
                0,
                7,
                6,
            )
        assert tree.driver.transact(lambda t: list(t.scan_prefix("")), write=False) == []
        assert errno_of(lambda: tree.mknod("a/d", stat.S_IFDIR | 0o755)) == errno.EINVAL

    def test_a_name_added_or_removed_changes_its_folder(self, tree):
        tree.mkdir("d", 0o755)
        stamps = []
        for change in (
            lambda: tree.mkdir("d/s", 0o755),
            lambda: tree.symlink("x", "d/l"),
            lambda: tree.rename("d/l", "d/m"),
            lambda: tree.unlink("d/m"),
            lambda: tree.rmdir("d/s"),
            lambda: tree.store([("d/f", b"1", None, CommitOptions(create=True, added=time.time_ns()))]),
        ):
            change()
            stamps.append(tree.find("d").attrs.mtime)
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        tree.set_attrs("d", mtime=1)  # after the file below was made: its commit leaves it
        tree.store([("d/g", b"1", None, CommitOptions(create=True, added=time.time_ns() - 10**9))])
        assert tree.find("d").attrs.mtime == 1

    def test_files_committed_together_are_stored_as_each_alone(self, tree):
        """``Tree.store`` (closes served together): new files in two folders, one
        existing file rewritten, in one transaction, each stored as its own commit stores it,
        and each folder's time is the latest of its new files'. One refused (a name in a folder
        that is not there) refuses them all, as ``Refused``: nothing of any is stored."""
        from zarrfs.fs.errors import Refused

        tree.mkdir("p", 0o755)
        tree.mkdir("q", 0o755)
        tree.store([("p/old", b"old", None, CREATE)])
        tree.set_attrs("p", mtime=1)
        tree.set_attrs("q", mtime=1)
        born = time.time_ns()
        # made in the opposite order to the commit's: the folder's time stays the latest
        items = [(f"p/{i}", bytes([i]) * (i + 1), None, CommitOptions(create=True, added=born + 4 - i))
                 for i in range(5)]
        items += [("q/a", b"qa", None, CommitOptions(create=True, added=born + 10))]
        items += [("p/old", b"new", tree.lookup("p/old").attrs, CommitOptions())]
        tree.store(items)
        for key, value, _, _ in items:
            assert tree.read_range(key, 0, 100) == value
            assert tree.lookup(key).size == len(value)
        assert tree.lookup("p").attrs.mtime == born + 4
        assert tree.lookup("q").attrs.mtime == born + 10
        before = sorted(k for k, _ in tree.driver.scan(""))
        bad = [("p/x", b"x", None, CREATE), ("nowhere/y", b"y", None, CREATE)]
        with pytest.raises(Refused) as refused:
            tree.store(bad)
        assert refused.value.errno == errno.ENOENT
        assert sorted(k for k, _ in tree.driver.scan("")) == before

    def test_unstored_files_are_listed_once(self, tree):
        """Files created through the mount and not stored yet come after the stored entries;
        one stored meanwhile (or by another writer) is listed once, as stored."""
        put(tree, "u/a", "u/b", "u/c/0")
        listing = DirListing(tree.listings, "u", extra=["a", "c", "new", "zz"])
        assert [(n, k) for n, k, _ in listing.entries(0)][2:] == [
            ("a", FILE),
            ("b", FILE),
            ("c", DIR),
            ("new", FILE),
            ("zz", FILE),
        ]

    def test_a_folder_holding_a_temporary_file_is_not_empty(self, tree):
        """A held temporary file (``*.partial``, stored at its rename) is in its folder: rmdir
        and a rename onto the folder fail as for a stored file."""
        ops = Operations(tree, HandleTable(tree))
        tree.mkdir("d", 0o755)
        tree.mkdir("e", 0o755)
        ops.release(ops.create("d/x.partial", 0o644, os.O_WRONLY | os.O_CREAT, 0, 0))
        assert tree.find("d/x.partial") is None  # held, not stored
        assert errno_of(lambda: ops.rmdir("d")) == errno.ENOTEMPTY
        assert errno_of(lambda: ops.rename("e", "d")) == errno.ENOTEMPTY
        ops.rename("d/x.partial", "d/x")
        assert tree.driver.get("d/x") == b"" and names(tree, "") == [("d", DIR), ("e", DIR)]

    def test_a_temporary_file_renamed_onto_a_symlink_takes_none_of_its_records(self, tree):
        """A held temporary file stored by its rename onto a symlink replaces the symlink as a
        node: none of the symlink's records stay, its extended attributes neither."""
        ops = Operations(tree, HandleTable(tree))
        tree.symlink("target", "l")
        tree.set_xattr("l", b"trusted.note", b"of the symlink")
        fh = ops.create("l.partial", 0o644, os.O_WRONLY | os.O_CREAT, 0, 0)
        ops.handles.write(fh, b"data", 0)
        ops.release(fh)
        ops.rename("l.partial", "l")
        assert tree.lookup("l").kind == FILE and tree.read_value("l") == b"data"
        assert tree.xattrs("l") == {}

    def test_an_unlinked_open_file_keeps_and_changes_its_attributes(self, tree):
        ops = Operations(tree, HandleTable(tree))
        tree.store([("f", b"v", None, CREATE)])
        tree.set_attrs("f", mode=0o600, uid=7, gid=8)
        fh = ops.handles.open("f", os.O_RDONLY)
        ops.unlink("f")
        node = ops.handles.open_node(fh)
        assert (stat.S_IMODE(node.attrs.mode), node.attrs.uid, node.nlink) == (0o600, 7, 0)
        ops.set_open_attrs(fh, mode=0o640, gid=9, mtime=5)
        node = ops.handles.open_node(fh)
        assert (stat.S_IMODE(node.attrs.mode), node.attrs.gid, node.attrs.mtime) == (0o640, 9, 5)
        ops.release(fh)
        assert tree.find("f") is None and tree.driver.get(attr_key("f"), SIDE) is None

    def test_an_open_file_replaced_by_a_rename_keeps_its_content(self, tree):
        ops = Operations(tree, HandleTable(tree))
        tree.store([("a", b"old", None, CREATE)])
        tree.set_attrs("a", mode=0o600)
        fh = ops.handles.open("a", os.O_RDONLY)  # nothing read yet
        tree.store([("b", b"new", None, CREATE)])
        ops.rename("b", "a")
        assert bytes(ops.handles.read(fh, 10, 0)) == b"old"
        node = ops.handles.open_node(fh)
        assert (node.nlink, stat.S_IMODE(node.attrs.mode)) == (0, 0o600)
        ops.release(fh)
        assert tree.driver.get("a") == b"new"

    @pytest.mark.parametrize("seed", range(6))
    def test_random_folders_are_listed_exactly(self, tree, monkeypatch, seed):
        """Random keys, mkdir markers and symlinks (conflicting ones too) with names that are
        prefixes of one another, listed with tiny batches: every folder lists each child once,
        none missing, of the kind a lookup gives, whole or resumed at any token or offset; a
        snapshot of the folder says the same; names of unstored files are listed once."""
        rng = random.Random(seed)
        scan_batch = rng.choice([1, 2, 3, 5])
        monkeypatch.setattr(listing_module, "SCAN_BATCH", scan_batch, raising=False)
        monkeypatch.setattr(listing_module, "FIRST_BATCH", rng.choice([1, 2, 3]), raising=False)
        monkeypatch.setattr(listing_module, "MAX_BATCH", 4, raising=False)
        pool = _random_names(rng, 14) + rng.sample(_TRICKY, 4)
        keys = ["/".join(rng.choices(pool, k=rng.choice([1, 1, 2, 2, 3]))) for _ in range(40)]
        marks = ["/".join(rng.choices(pool, k=rng.choice([1, 1, 2]))) for _ in range(12)]
        put(tree, *keys)

        def side(t):
            for i, k in enumerate(marks):
                t.put(entry_key(k), DIR_MARK if i % 3 else LINK_MARK + b"target", SIDE)

        tree.driver.transact(side)
        everything = keys + marks
        folders = {""} | {"/".join(k.split("/")[:i]) for k in everything for i in range(1, k.count("/") + 1)}
        for folder in sorted(folders):
            if tree.lookup(folder).kind != DIR:  # a symlink's marker wins over keys below it
                continue
            prefix = folder + "/" if folder else ""
            children = _expected_children(everything, folder)
            expected = {n: tree.lookup(prefix + n).kind for n in children}
            unstored = set(rng.sample(pool, 3)) - {".", ".."}  # no program makes those
            extra = sorted(unstored | set(rng.sample(sorted(children), min(2, len(children)))))
            self._check_listing(tree, folder, expected, extra, rng)

    @staticmethod
    def _check_listing(tree, folder, expected, extra, rng) -> None:
        context = f"folder {folder!r}"
        listed = names(tree, folder)
        assert len(listed) == len({n for n, _ in listed}), (context, listed)
        assert dict(listed) == expected, context
        with_extra = [(n, k) for n, k, _ in DirListing(tree.listings, folder, extra=extra).entries(0)][2:]
        assert len(with_extra) == len({n for n, _ in with_extra}), (context, extra, with_extra)
        assert dict(with_extra) == {n: FILE for n in extra} | expected, context
        for limit in (1, 2, 3):
            got, after = [], None
            while True:
                part = tree.list_dir(folder, after=after, limit=limit)
                got += [n for n, _, _ in part]
                if len(part) < limit:
                    break
                after = part[-1][2]
            assert sorted(got) == sorted(expected), (context, limit)
        listing = DirListing(tree.listings, folder, extra=extra)
        whole = list(listing.entries(0))
        for _ in range(4):  # the kernel resumes at the offset of the last entry it kept
            offset = rng.randrange(len(whole))
            assert list(listing.entries(offset)) == whole[offset:], context
        nodes = tree.folder_nodes(folder, 10_000)
        assert {n: node.kind for n, node in nodes.items()} == expected, context
        assert nodes == {n: tree.find((folder + "/" if folder else "") + n) for n in expected}

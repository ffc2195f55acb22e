"""The tree, the listing and the open-file table, without FUSE, over every driver: the
conformance class of :mod:`zarrfs.testing.filesystem` run on memory, LMDB, SQLite, Redis,
PostgreSQL and a Redis Cluster, plus what is specific to one driver."""

from __future__ import annotations

import contextlib
import errno
import uuid

import pytest
from conftest import record_redis_calls

from zarrfs.backends import open_driver
from zarrfs.fs.commitoptions import CREATE
from zarrfs.fs.errors import to_errno
from zarrfs.fs.spill import SpillBuffer
from zarrfs.fs.tree import Tree
from zarrfs.testing.filesystem import FilesystemConformance


class TestMemory(FilesystemConformance):
    @pytest.fixture
    def driver_url(self):
        return f"memory://{uuid.uuid4().hex}"


class TestLMDB(FilesystemConformance):
    @pytest.fixture
    def driver_url(self, tmp_path):
        return f"lmdb://{tmp_path}/t.lmdb"


class TestSQLite(FilesystemConformance):
    @pytest.fixture
    def driver_url(self, tmp_path):
        return f"sqlite://{tmp_path}/t.sqlite"


class TestRedis(FilesystemConformance):
    @pytest.fixture
    def driver_url(self, redis_server):
        return redis_server.url(0, prefix=f"tree{uuid.uuid4().hex[:12]}")


class TestPostgres(FilesystemConformance):
    @pytest.fixture
    def driver_url(self, postgres_server):
        return postgres_server.url(table=f"tree{uuid.uuid4().hex[:12]}")


class TestRedisCluster(FilesystemConformance):
    @pytest.fixture
    def driver_url(self, redis_cluster):
        return redis_cluster.url(prefix=f"tree{uuid.uuid4().hex[:12]}")


def test_spill_buffer_random_access():
    buf = SpillBuffer(b"abc", threshold=8)
    buf.write(6, b"XYZ")  # crosses the threshold: now a temporary file
    assert buf.read(0, 100) == b"abc\0\0\0XYZ"
    buf.truncate(4)
    assert bytes(buf.view()) == b"abc\0"
    buf.truncate(20)
    assert buf.size == 20 and buf.read(18, 5) == b"\0\0"
    buf.close()


def test_new_file_on_redis_commits_in_one_round_trip(redis_server, monkeypatch):
    """The probe of the name and its folder and the metadata the format layer validates
    against are answered from what the driver read and wrote before (the folder and its
    metadata made here; a new name guessed absent) and checked by the commit, with the writes:
    one round trip. A driver that saw none of them reads them first: two, none wasted."""
    from zarrfs.format.hooks import FormatHooks

    driver = open_driver(redis_server.url(0, prefix=f"rt{uuid.uuid4().hex[:8]}"))
    try:
        tree = Tree(driver, uid=0, gid=0, hooks=FormatHooks())
        zarray = (
            b'{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i4", "compressor": null,'
            b' "fill_value": 0, "order": "C", "filters": null}'
        )
        tree.mkdir("g", 0o755)
        tree.store([("g/.zgroup", b'{"zarr_format": 2}', None, CREATE)])
        tree.mkdir("g/a", 0o755)
        tree.store([("g/a/.zarray", zarray, None, CREATE)])
        sent = record_redis_calls(monkeypatch)
        tree.store([("g/a/1", b"\0" * 8, None, CREATE)])
        assert len(sent) == 1, sent
        assert sent[0][:3] == ["WATCH", "EVAL", "MULTI"] and sent[0][-1] == "EXEC"
        with pytest.raises(Exception) as info:  # and validation still happens: out of the grid
            tree.store([("g/a/7", b"\0" * 8, None, CREATE)])
        assert to_errno(info.value) == errno.EINVAL
        assert driver.get("g/a/1") == b"\0" * 8 and driver.get("g/a/7") is None
        fresh = open_driver(redis_server.url(0, prefix=driver.prefix))
        try:
            other = Tree(fresh, uid=0, gid=0, hooks=FormatHooks())
            sent.clear()
            other.store([("g/a/0", b"\1" * 8, None, CREATE)])
            assert len(sent) == 2 and sent[1][0] == "MULTI", sent
        finally:
            fresh.close()
        assert driver.get("g/a/0") == b"\1" * 8
    finally:
        driver.close()


def test_names_probed_together_on_lmdb_read_as_far_as_each_answer_needs_and_agree(tmp_path):
    """On a database where a batch of reads saves no round trip (LMDB), ``probe_many`` reads
    each name only as far as its answer needs (``probe``); it finds what the whole batch of
    reads finds, for every kind of name: files (one linked), folders with keys below them or
    only a marker, symlinks, special files, a key hidden by a folder of its name, names
    missing, in a missing folder, and the root."""
    import stat

    driver = open_driver(f"lmdb://{tmp_path}/p.lmdb")
    try:
        tree = Tree(driver, uid=1000, gid=1000)
        assert not driver.batched
        tree.mkdir("d", 0o755)
        tree.store([("d/f", b"12345", None, CREATE), ("d/g", b"", None, CREATE)])
        tree.link("d/g", "d/g2")
        tree.mkdir("d/empty", 0o750)
        tree.mkdir("e", 0o700)
        tree.symlink("../d/f", "d/ln")
        tree.mknod("d/fifo", stat.S_IFIFO | 0o644)
        driver.transact(lambda t: (t.put("h", b"hidden"), t.put("h/x", b"below"), t.put("k/0", b"c")))
        keys = [
            "d", "d/f", "d/g", "d/g2", "d/empty", "e", "d/ln", "d/fifo", "h", "h/x", "k", "k/0",
            "missing", "d/missing", "nowhere/x",
        ]  # fmt: skip
        lookups = tree.lookups

        def both(t):
            return lookups.probe_many(t, keys), lookups._probe_many_reading(t, keys)[1]

        alone, batch = driver.transact(both, write=False)
        assert alone == batch
        assert [p is None for p in alone] == [k in ("missing", "d/missing", "nowhere/x") for k in keys]
        assert alone[keys.index("d/g2")][4] is not None and alone[keys.index("h")][0] == stat.S_IFDIR
        assert driver.transact(lambda t: lookups.probe_many(t, ["", "d"]), write=False)[0][0] == stat.S_IFDIR
    finally:
        driver.close()


def test_the_nodes_a_commit_leaves_are_its_last_attempts_and_a_failed_write_leaves_none(tmp_path):
    """``Transactions.leave``: a mount that keeps nodes (as one following a server's feed
    does) keeps those the committed attempt left, once its writes are applied; an attempt the
    driver ran again leaves nothing of its own, and a write that failed leaves no node (what
    it may have stored is unknown: every kept node is dropped)."""
    from zarrfs.backends.errors import RetryableError
    from zarrfs.fs.knownfolders import KnownFolders
    from zarrfs.fs.node import FILE, Node
    from zarrfs.fs.sidedata import Attrs

    driver = open_driver(f"lmdb://{tmp_path}/n.lmdb")
    try:
        tree = Tree(driver, uid=1000, gid=1000)
        known = tree.lookups.known = KnownFolders()
        tree.writes.keeps_nodes = True
        assert tree.writes.leaving
        attempts: list[Node] = []

        def change(t):
            node = Node(FILE, len(attempts) + 1, Attrs(0o100644, 1000, 1000, 1, 1, 1))
            attempts.append(node)
            t.put(f"a{len(attempts)}", b"x" * node.size)
            tree.writes.leave(f"a{len(attempts)}", node)
            if len(attempts) == 1:
                raise RetryableError("run it again")

        tree.writes.run(change)
        assert len(attempts) == 2
        assert known.node("a1") is None and known.node("a2") is attempts[1]

        def fails(t):
            t.put("b", b"y")
            tree.writes.leave("b", Node(FILE, 1, Attrs(0o100644, 1000, 1000, 1, 1, 1)))
            raise OSError(5, "lost on the way")

        with pytest.raises(OSError):
            tree.writes.run(fails)
        assert known.node("b") is None and known.node("a2") is None
    finally:
        driver.close()


def test_a_listings_nodes_on_redis_are_neither_watched_nor_checked(redis_server, monkeypatch):
    """A listing's node reads are made apart (``read_many(..., apart=True)``): redis-server
    compares each name a WATCH adds with every one watched, so a listing that watched each of
    its names cost the server the square of them. Only the folder's own probe is watched,
    and the listing's round trips need no closing MULTI/EXEC."""
    from zarrfs.fs.node import DIR, FILE

    driver = open_driver(redis_server.url(0, prefix=f"ls{uuid.uuid4().hex[:8]}"))
    try:
        tree = Tree(driver, uid=0, gid=0)
        tree.mkdir("d", 0o755)
        tree.mkdir("d/sub", 0o755)
        names = [f"f{i:03}" for i in range(300)]
        tree.store([(f"d/{n}", b"x" * 5, None, CREATE) for n in names])
        sent = record_redis_calls(monkeypatch, driver)
        nodes = tree.listings.nodes_of("d", [(n, FILE) for n in names] + [("sub", DIR)])
        assert sorted(nodes) == [*names, "sub"] and nodes["f007"].size == 5
        assert sent and not [c for c in sent if "WATCH" in c or "MULTI" in c], sent
        sent.clear()
        got: dict = {}
        listed = tree.listings.list_dir("d", limit=400, nodes=got)
        assert len(listed) == 301 and len(got) == 301
        assert sum("WATCH" in c for c in sent) <= 1 and not [c for c in sent if "MULTI" in c], sent
    finally:
        driver.close()


def test_files_of_one_folder_stored_together_probe_the_folder_once(redis_server, monkeypatch):
    """Closes waiting together are stored in one transaction (``Tree.store``); each file's
    probe named its folder again, and the batch asked the server the same five reads of it
    once a file. Read for real, as a driver that guesses none (``redis.guesses``) does; one
    that does stores them all in one round trip."""
    driver = open_driver(redis_server.url(0, prefix=f"gs{uuid.uuid4().hex[:8]}"))
    try:
        tree = Tree(driver, uid=0, gid=0)
        tree.mkdir("d", 0o755)
        sent = record_redis_calls(monkeypatch, driver)
        tree.store([(f"d/g{i}", b"x" * 5, None, CREATE) for i in range(5)])
        assert [c[:2] for c in sent] == [["WATCH", "EVAL"]], sent
        sent.clear()
        monkeypatch.setattr(driver, "guesses", None)
        tree.store([(f"d/f{i}", b"x" * 5, None, CREATE) for i in range(5)])
        probes = [c for c in sent if "EXISTS" in c]
        assert len(probes) == 1 and probes[0].count("EXISTS") == 6, sent  # d, and d/f0 .. d/f4
        assert [tree.lookup(f"d/{n}{i}").size for n in "fg" for i in range(5)] == [5] * 10
    finally:
        driver.close()


def test_a_symlink_or_fifo_removed_during_a_listing_is_left_out(redis_server, monkeypatch):
    """Redis has no read snapshot: a symlink or FIFO a listing's scan saw, removed through
    another mount before the listing read its entry record, was made a node of an empty
    target (a FIFO's device 0). Now a missing record counts as the name gone, as a file's
    missing size does."""
    from zarrfs.fs.listing import Listings

    with two_trees(redis_server) as (tree, theirs):
        tree.mkdir("d", 0o755)
        tree.store([("d/f", b"12345", None, CREATE)])
        tree.symlink("somewhere", "d/l")
        tree.mknod("d/p", 0o10644)
        read_nodes = Listings._read_nodes
        done = []

        def removed_meanwhile(self, *args, **kwargs):
            if not done:
                done.append(1)
                theirs.unlink("d/l")  # after the listing's scan, before its nodes' reads
                theirs.unlink("d/p")
            return read_nodes(self, *args, **kwargs)

        monkeypatch.setattr(Listings, "_read_nodes", removed_meanwhile)
        nodes: dict = {}
        listed = tree.listings.list_dir("d", nodes=nodes)
        assert done and [name for name, _, _ in listed] == ["f", "l", "p"]
        assert sorted(nodes) == ["f"], {name: (n.kind, n.target) for name, n in nodes.items()}


@contextlib.contextmanager
def two_trees(redis_server):
    """A tree on a fresh Redis keyspace, and another writer's tree on the same."""
    url = redis_server.url(0, prefix=f"tt{uuid.uuid4().hex[:8]}")
    driver, other = open_driver(url), open_driver(url)
    try:
        yield Tree(driver, uid=0, gid=0), Tree(other, uid=0, gid=0)
    finally:
        driver.close()
        other.close()


def test_a_name_that_leaves_its_link_group_during_a_listing_is_never_shown_alone(redis_server, monkeypatch):
    """Redis has no read snapshot, and a listing's scans are not checked against later changes:
    a name listed, then unlinked through another mount before the listing read its link
    group, was made a node of one link (a second mount's observer saw ``l51`` with the
    inode of ``s`` and one link). Now such a name is probed again with its group: gone, it is
    left out; still there, it has its links."""
    from zarrfs.fs import hardlinks

    with two_trees(redis_server) as (tree, theirs):
        tree.mkdir("d", 0o755)
        tree.store([("d/s", b"12345", None, CREATE)])
        tree.link("d/s", "d/l1")
        tree.link("d/s", "d/l2")
        load = hardlinks.load
        done = []

        def unlinked_meanwhile(t, key, pointer):
            if key == "d/l1" and not done:
                done.append(1)
                theirs.unlink("d/l1")  # after the listing's scan, before its group read
            return load(t, key, pointer)

        monkeypatch.setattr(hardlinks, "load", unlinked_meanwhile)
        nodes, _ = tree.listings.folder_page("d", None, 100)
        assert done
        assert "l1" not in nodes or nodes["l1"].nlink >= 2, nodes["l1"]
        assert nodes["s"].nlink >= 2 and nodes["l2"].nlink >= 2

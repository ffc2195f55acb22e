"""The tree, the listing and the open-file table, without FUSE, over real drivers."""

from __future__ import annotations

import errno
import os
import uuid

import pytest

from zarrfs.backends import open_driver
from zarrfs.fs.errors import FsError, to_errno
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.listing import DirListing
from zarrfs.fs.namespace import DIR, FILE, LINK, RENAME_EXCHANGE, RENAME_NOREPLACE, Tree
from zarrfs.fs.spill import SpillBuffer


@pytest.fixture(params=["memory", "lmdb"])
def tree(request, tmp_path):
    url = f"memory://{uuid.uuid4().hex}" if request.param == "memory" else f"lmdb://{tmp_path}/t.lmdb"
    driver = open_driver(url)
    yield Tree(driver, uid=1000, gid=1000)
    driver.close()


def put(tree: Tree, *keys: str, value: bytes = b"v") -> None:
    tree.driver.transact(lambda t: [t.put(k, value) for k in keys])


def names(tree: Tree, key: str) -> list[tuple[str, int]]:
    return [(n, k) for n, k, _ in DirListing(tree, key).entries(0)][2:]


def errno_of(fn) -> int:
    with pytest.raises(FsError) as info:
        fn()
    return info.value.errno


def test_folders_derive_from_keys(tree):
    put(tree, "g/a/0.0", "g/a/.zarray", "g/.zgroup")
    assert tree.lookup("g").kind == DIR
    assert tree.lookup("g/a").kind == DIR
    node = tree.lookup("g/a/0.0")
    assert (node.kind, node.size) == (FILE, 1)
    assert errno_of(lambda: tree.lookup("g/b")) == errno.ENOENT
    assert names(tree, "g") == [(".zgroup", FILE), ("a", DIR)]


def test_listing_orders_like_keys_and_skips_subtrees(tree):
    # '.' sorts before '/', so the file "0.0" comes between folder "0"'s key and its children.
    put(tree, "a/0/0", "a/0/1", "a/0.0", "a/1", "a/10", "a/1/x")
    listed = names(tree, "a")
    assert sorted(listed) == sorted([("0", DIR), ("0.0", FILE), ("1", DIR), ("10", FILE)])
    assert len(listed) == 4  # "1" is a folder: the key "a/1" is hidden, not listed twice


def test_a_key_is_hidden_by_its_folder_whatever_sorts_between_them(tree):
    # "1.0" sorts between the key "1" and its folder's "1/x"; "20" follows "2", which has none.
    put(tree, "b/1", "b/1.0", "b/1/x", "b/2", "b/20", "b/3", "b/3-a", "b/30")
    assert sorted(names(tree, "b")) == sorted(
        [("1", DIR), ("1.0", FILE), ("2", FILE), ("20", FILE), ("3", FILE), ("3-a", FILE), ("30", FILE)]
    )
    assert tree.folder_nodes("b", 100)["1"].kind == DIR


def test_listing_resumes_across_batches(tree):
    keys = [f"big/{i:05d}" for i in range(3000)] + [f"big/n{i}/0" for i in range(300)]
    put(tree, *keys)
    listing = DirListing(tree, "big")
    first = list(_take(listing.entries(0), 500))
    rest = list(listing.entries(first[-1][2]))
    got = [n for n, _, _ in first + rest][2:]
    assert len(got) == 3300 and len(set(got)) == 3300
    again = [n for n, _, _ in listing.entries(0)][2:]  # rewind
    assert again == got


def test_listing_of_many_subfolders_across_batch_ends(tree):
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
    listing = DirListing(tree, "c")
    entries = list(listing.entries(0))[2:]
    resumed = [next(iter(listing.entries(prev[2])))[0] for prev in entries[:-1]]
    assert resumed == [n for n, _, _ in entries[1:]]
    nodes = tree.folder_nodes("c", 1000)
    assert sorted((n, node.kind) for n, node in nodes.items()) == expected
    assert nodes["a"].size == 1 and nodes["7"].kind == DIR


def test_folder_snapshot_sizes_across_flat_runs_and_subfolders(tree):
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


def _take(it, n):
    for i, item in enumerate(it):
        if i >= n:
            return
        yield item


def test_mkdir_markers_and_parent_kept(tree):
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


def test_rename_folder_moves_everything_atomically(tree):
    put(tree, "src/a/0.0", "src/.zarray")
    tree.set_attrs("src/.zarray", mode=0o600)
    tree.mkdir("src/empty", 0o755)
    tree.rename("src", "dst")
    assert errno_of(lambda: tree.lookup("src")) == errno.ENOENT
    assert tree.lookup("dst/a/0.0").kind == FILE
    assert tree.lookup("dst/empty").kind == DIR
    assert tree.lookup("dst/.zarray").attrs.mode & 0o777 == 0o600
    assert tree.driver.get("src/a/0.0") is None


def test_rename_flags_and_errors(tree):
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


def test_link_copies_or_fails_with_eexist(tree):
    put(tree, "tmp", value=b"meta")
    tree.link("tmp", "zarr.json")
    assert tree.driver.get("zarr.json") == b"meta"
    assert errno_of(lambda: tree.link("tmp", "zarr.json")) == errno.EEXIST


def test_symlink_is_side_data(tree):
    tree.symlink("target/path", "ln")
    node = tree.lookup("ln")
    assert node.kind == LINK and tree.readlink("ln") == "target/path"
    assert tree.driver.get("ln") is None  # never a Zarr key
    assert names(tree, "") == [("ln", LINK)]


def test_attrs_default_and_persist(tree):
    put(tree, "f")
    a = tree.lookup("f").attrs
    assert (a.uid, a.gid, a.mode & 0o777) == (1000, 1000, 0o644)
    tree.set_attrs("f", mode=0o600, uid=5, gid=-1, mtime=123)
    b = tree.lookup("f").attrs
    assert (b.mode & 0o777, b.uid, b.gid, b.mtime) == (0o600, 5, 1000, 123)
    assert Tree(tree.driver).epoch == tree.epoch  # the default time is stable across mounts


def test_handles_commit_all_or_nothing(tree):
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


def test_spill_buffer_random_access():
    buf = SpillBuffer(b"abc", threshold=8)
    buf.write(6, b"XYZ")  # crosses the threshold: now a temporary file
    assert buf.read(0, 100) == b"abc\0\0\0XYZ"
    buf.truncate(4)
    assert bytes(buf.view()) == b"abc\0"
    buf.truncate(20)
    assert buf.size == 20 and buf.read(18, 5) == b"\0\0"
    buf.close()


def test_decoded_view_encodes_a_temporary_file_renamed_onto_a_chunk(tree):
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
    tree.commit("arr/.zarray", json.dumps(meta).encode(), None, create=True)
    raw = np.arange(4, dtype="<i4").tobytes()
    tree.commit("arr/.0.tmp", raw, None, create=True)  # a temporary file: stored as written
    assert tree.driver.get("arr/.0.tmp") == raw
    tree.rename("arr/.0.tmp", "arr/0")
    stored = tree.driver.get("arr/0")
    assert zlib.decompress(stored) == raw  # encoded on arrival, as a write in place would be
    assert tree.read_value("arr/0") == raw
    tree.rename("arr", "moved")  # moving the whole array keeps the stored bytes as they are
    assert tree.driver.get("moved/0") == stored


def test_new_file_on_redis_commits_in_two_round_trips(redis_server, monkeypatch):
    """The probe of the name and its folder and the metadata the format layer validates
    against travel in one round trip; MULTI/EXEC is the other."""
    from zarrfs.backends import redis as redis_driver
    from zarrfs.format.hooks import FormatHooks

    driver = open_driver(redis_server.url(0, prefix=f"rt{uuid.uuid4().hex[:8]}"))
    try:
        tree = Tree(driver, uid=0, gid=0, hooks=FormatHooks())
        zarray = (
            b'{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i4", "compressor": null,'
            b' "fill_value": 0, "order": "C", "filters": null}'
        )
        tree.mkdir("g", 0o755)
        tree.commit("g/.zgroup", b'{"zarr_format": 2}', None, create=True)
        tree.mkdir("g/a", 0o755)
        tree.commit("g/a/.zarray", zarray, None, create=True)
        sent = []
        call = redis_driver._Link.call

        def counting(link, commands, big=False):
            sent.append([c[0] for c in commands])
            return call(link, commands, big)

        monkeypatch.setattr(redis_driver._Link, "call", counting)
        tree.commit("g/a/1", b"\0" * 8, None, create=True)
        assert len(sent) == 2, sent
        assert sent[1][0] == "MULTI"
        with pytest.raises(Exception) as info:  # and validation still happens: out of the grid
            tree.commit("g/a/7", b"\0" * 8, None, create=True)
        assert to_errno(info.value) == errno.EINVAL
        assert driver.get("g/a/1") == b"\0" * 8 and driver.get("g/a/7") is None
    finally:
        driver.close()

"""Files stored in parts (zarrfs.fs.parts), in-process over each file driver and Redis: the
manifest under the data key, sizes, reads by range, rename, hard links, unlink, truncation,
orphans found and removed by ``zarrfs check``, the zarr-python 3 store and ``zarrfs copy``."""

from __future__ import annotations

import os
import uuid

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.base import KEYS, SIDE
from zarrfs.fs.api import Operations
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.manifest import MAGIC, MANIFEST_SIZE, PART
from zarrfs.fs.tree import Tree
from zarrfs.tools.orphans import find_orphans

ABOVE = 10_000  # parts of 10 000 bytes


@pytest.fixture(params=["memory", "lmdb", "sqlite", "redis"])
def driver(request, tmp_path):
    url = {
        "memory": lambda: f"memory://{uuid.uuid4().hex}",
        "lmdb": lambda: f"lmdb://{tmp_path}/t.lmdb",
        "sqlite": lambda: f"sqlite://{tmp_path}/t.sqlite",
        "redis": lambda: request.getfixturevalue("redis_server").url(0, prefix=f"p{uuid.uuid4().hex[:8]}"),
    }[request.param]()
    d = open_driver(url)
    yield d
    d.close()


@pytest.fixture
def ops(driver):
    tree = Tree(driver)
    return Operations(tree, HandleTable(tree, spill_threshold=4096, parts_above=ABOVE))


def parts_of(driver) -> list[str]:
    return [k for k, _ in driver.scan(PART, PART[:-1] + chr(ord(PART[-1]) + 1), space=SIDE, fetch=KEYS)]


def write(ops, key: str, data: bytes, offset: int = 0, create: bool = True) -> None:
    fh = ops.create(key, 0o644, os.O_WRONLY, 0, 0) if create else ops.handles.open(key, os.O_WRONLY)
    for start in range(0, len(data), 4096):
        ops.handles.write(fh, data[start : start + 4096], offset + start)
    ops.flush(fh)
    ops.release(fh)


def read(ops, key: str) -> bytes:
    fh = ops.handles.open(key, os.O_RDONLY)
    out = bytearray()
    while piece := ops.handles.read(fh, 3000, len(out)):
        out += piece
    ops.release(fh)
    return bytes(out)


def test_a_large_file_is_a_manifest_and_parts(ops, driver):
    data = os.urandom(35_000)
    write(ops, "big", data)
    stored = driver.get("big")
    assert len(stored) == MANIFEST_SIZE and stored.startswith(MAGIC)
    assert len(parts_of(driver)) == 4
    assert ops.tree.lookup("big").size == 35_000
    assert ops.tree.folder_nodes("", 100)["big"].size == 35_000
    assert read(ops, "big") == data
    assert ops.tree.read_value("big") == data
    assert ops.tree.read_range("big", 9_990, 30) == data[9_990:10_020]
    write(ops, "small", b"x" * 100)
    assert driver.get("small") == b"x" * 100  # small files stay ordinary keys


def test_rewrite_in_the_middle_replaces_the_parts(ops, driver):
    data = bytearray(os.urandom(35_000))
    write(ops, "big", bytes(data))
    before = set(parts_of(driver))
    write(ops, "big", b"Z" * 5000, offset=12_000, create=False)
    data[12_000:17_000] = b"Z" * 5000
    assert read(ops, "big") == bytes(data)
    after = set(parts_of(driver))
    assert len(after) == 4 and not (after & before)  # the old version's parts are gone


def test_rename_link_unlink_and_truncate(ops, driver):
    data = os.urandom(25_000)
    write(ops, "a", data)
    ops.tree.mkdir("d", 0o755)
    ops.tree.rename("a", "d/b")
    assert read(ops, "d/b") == data and len(parts_of(driver)) == 3
    ops.tree.link("d/b", "c")
    assert read(ops, "c") == data and ops.tree.lookup("c").nlink == 2
    ops.tree.unlink("d/b")
    assert read(ops, "c") == data and len(parts_of(driver)) == 3  # one name left: parts kept
    ops.handles.truncate("c", 0)
    assert ops.tree.lookup("c").size == 0 and parts_of(driver) == []
    write(ops, "e", data)
    write(ops, "f", b"small")
    ops.tree.rename("f", "e")  # the replaced file's parts go
    assert parts_of(driver) == [] and read(ops, "e") == b"small"
    write(ops, "g", data)
    ops.tree.unlink("g")
    assert parts_of(driver) == []


def test_a_writer_that_is_not_zarrfs_wins(ops, driver):
    write(ops, "big", os.urandom(25_000))
    driver.put("big", b"theirs")
    assert ops.tree.lookup("big").size == 6 and read(ops, "big") == b"theirs"


def test_orphans_are_reported_and_removed(ops, driver):
    from zarrfs.fs import parts

    write(ops, "big", os.urandom(25_000))
    def fill(offset, into):  # bytes that are not zeros (a part of zeros is a hole, not stored)
        into[:] = b"\1" * len(into)
        return len(into)

    orphan = parts.store(driver, 30_000, fill, ABOVE)  # as a crash leaves
    found = find_orphans(driver)
    assert [p.id for p in found.orphans] == [orphan.id] and found.parts == 6
    find_orphans(driver, repair=True)
    assert find_orphans(driver).orphans == [] and len(parts_of(driver)) == 3


def test_a_side_key_is_a_part_only_with_ascii_digits_after_its_id():
    from zarrfs.fs.manifest import PART, id_of_part

    ident = "0123456789abcdef" * 2
    assert id_of_part(f"{PART}{ident}/12") == ident
    # str.isdigit takes these: "zarrfs check --repair" would have removed them as orphans.
    assert id_of_part(f"{PART}{ident}/\u00b2") is None
    assert id_of_part(f"{PART}{ident}/\uff11") is None


def test_store_and_copy_read_parted_values(ops, driver, tmp_path):
    from zarrfs.store import DatabaseStore
    from zarrfs.tools.copy import copy

    data = os.urandom(25_000)
    write(ops, "big", data)
    if driver.url.startswith("memory"):
        return
    store = DatabaseStore(driver.url, read_only=True)
    assert store.get_sync("big").to_bytes() == data
    copy(driver.url, str(tmp_path / "out"))
    assert (tmp_path / "out" / "big").read_bytes() == data


def test_a_commit_whose_parts_a_repair_deleted_fails_and_stores_nothing(ops, driver):
    """``zarrfs check --repair`` beside a writing mount may take the parts of a commit in
    progress for orphans: that commit then fails (EIO) instead of storing a manifest whose
    parts are gone, and the file keeps its version."""
    import errno

    from zarrfs.fs.errors import FsError

    old = os.urandom(25_000)
    write(ops, "big", old)
    tree = ops.tree
    real_store = tree.store

    def store_after_a_repair(*args, **kwargs):
        find_orphans(driver, repair=True)  # the new parts are not referenced yet
        return real_store(*args, **kwargs)

    tree.store = store_after_a_repair
    with pytest.raises(FsError) as failed:
        write(ops, "big", os.urandom(30_000), create=False)
    assert failed.value.errno == errno.EIO
    tree.store = real_store
    fresh = Operations(Tree(driver), HandleTable(Tree(driver), spill_threshold=4096, parts_above=ABOVE))
    assert read(fresh, "big") == old and len(parts_of(driver)) == 3


def count_reads(monkeypatch, driver) -> list[str]:
    """Have every transaction of ``driver`` record the reads it is asked for (the real driver
    answers them); return the list they append to."""
    calls: list[str] = []
    transact = driver.transact

    def counting(fn, *args, **kwargs):
        def run(t):
            for name in ("get", "size", "read", "read_many", "scan"):
                real = getattr(t, name)

                def counted(*a, _real=real, _name=name, **k):
                    calls.append(_name)
                    return _real(*a, **k)

                setattr(t, name, counted)
            return fn(t)

        return transact(run, *args, **kwargs)

    monkeypatch.setattr(driver, "transact", counting)
    return calls


def test_a_range_of_an_ordinary_value_is_one_read(ops, driver, monkeypatch, request):
    from conftest import record_redis_calls

    data = os.urandom(5000)
    write(ops, "plain", data)
    calls = count_reads(monkeypatch, driver)
    sent = record_redis_calls(monkeypatch, driver) if "redis" in request.node.callspec.id else None
    assert ops.tree.read_range("plain", 100, 200) == data[100:300]
    assert calls == ["read"]
    if sent is not None:
        assert len(sent) == 1, sent  # one round trip
    calls.clear()
    assert ops.tree.read_range("plain", 4990, 100) == data[4990:]  # a short read, not 49 bytes
    assert ops.tree.read_range("plain", 0, 0) == b""
    assert calls == ["read"] * 2
    calls.clear()
    # Nothing past the end: a parted file's manifest ends there too, so its size is asked.
    assert ops.tree.read_range("plain", 9000, 100) == b""
    assert calls == ["read", "size"]


def test_ranges_of_parted_and_manifest_sized_values(ops, driver):
    data = os.urandom(35_000)
    write(ops, "big", data)
    for offset, size in [
        (0, 10),
        (0, 49),
        (0, 4096),
        (20, 29),
        (40, 20),
        (49, 100),
        (9_990, 30),
        (34_990, 100),
        (35_000, 10),
        (40_000, 100),
        (0, 0),
    ]:
        assert ops.tree.read_range("big", offset, size) == data[offset : offset + size], (offset, size)
    # Values of a manifest's size that are not one: ordinary bytes, the magic, a manifest
    # whose attribute record does not name it (another writer copied it), shown as they are.
    other = os.urandom(MANIFEST_SIZE)
    manifest = driver.get("big")
    fake = MAGIC + os.urandom(MANIFEST_SIZE - len(MAGIC))
    for key, value in [("o", other), ("m", fake), ("copy", manifest)]:
        driver.put(key, value)
        for offset, size in [(0, 10), (0, 49), (0, 100), (5, 44), (20, 100), (48, 1), (49, 10), (60, 5)]:
            assert ops.tree.read_range(key, offset, size) == value[offset : offset + size], (key, offset)
    assert ops.tree.read_range("missing", 0, 10) == b""


def test_the_store_deletes_the_parts_of_a_value_it_replaces(ops, driver):
    """``DatabaseStore`` writing or deleting over a file a mount stored in parts deletes its
    parts after the commit, as a mount does: ``zarrfs check`` finds no orphans. A set writes every
    name of a hard link group, so the group's parts go with it."""
    import asyncio

    from zarr.core.buffer import default_buffer_prototype

    from zarrfs.store import DatabaseStore

    if driver.url.startswith("memory"):
        return  # a memory database is the driver's own: a store would open another
    data = os.urandom(25_000)
    ops.tree.mkdir("d", 0o755)
    for key in ("a", "b", "c", "d/x", "d/y", "linked"):
        write(ops, key, data)
    ops.tree.link("linked", "other")
    assert len(parts_of(driver)) == 18
    store = DatabaseStore(driver.url)
    small = default_buffer_prototype().buffer.from_bytes(b"small")
    store.set_sync("a", small)
    store.delete_sync("b")
    asyncio.run(store._set_many([("c", small)]))
    asyncio.run(store.delete_dir("d"))
    store.set_sync("linked", small)  # the file's every name: "other" too
    store.close()
    assert find_orphans(driver).orphans == []
    assert parts_of(driver) == []
    assert read(ops, "other") == b"small" and read(ops, "a") == b"small" and read(ops, "linked") == b"small"


def test_copy_streams_a_parted_value_part_by_part(ops, driver, tmp_path):
    """``zarrfs copy`` reads a parted value a part at a time and writes it so: to a folder, and
    to a database as parts of the same size; the copy never holds the value whole (traced
    allocations stay far below its size). A copy over parted values at the destination frees
    their parts."""
    import tracemalloc

    from zarrfs.tools.copy import copy

    if driver.url.startswith("memory"):
        return
    data = os.urandom(4 << 20)
    write(ops, "big", data)
    assert len(parts_of(driver)) == 420
    dest = f"sqlite://{tmp_path}/dest.sqlite"
    # Modules imported at their first use are not the copy's memory: this test may run alone.
    open_driver(f"sqlite://{tmp_path}/first.sqlite").close()
    tracemalloc.start()
    try:
        copy(driver.url, str(tmp_path / "out"))
        copy(driver.url, dest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (tmp_path / "out" / "big").read_bytes() == data
    assert peak < len(data) // 4, peak
    copied = open_driver(dest)
    try:
        assert copied.get("big").startswith(MAGIC) and len(parts_of(copied)) == 420
        assert Tree(copied).read_value("big") == data
        copy(str(tmp_path / "out"), dest)  # whole values over the parted one
        assert parts_of(copied) == [] and find_orphans(copied).orphans == []
        assert Tree(copied).read_value("big") == data
        copy(driver.url, dest)  # and parts over it again
        assert len(parts_of(copied)) == 420 and find_orphans(copied).orphans == []
    finally:
        copied.close()

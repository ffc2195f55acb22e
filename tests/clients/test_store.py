"""The zarr-python 3 store over zarrfs' drivers: zarr's own conformance class for each driver,
byte compatibility with zarr-python 2's store classes and with a mount of the same database."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import uuid

import numpy as np
import pytest
import zarr
from mounting import make_url
from numpy.testing import assert_array_equal
from test_clients import (
    ZARR2_READ_DB,
    ZARR2_WRITE_DB,
    db_location,
    files_under,
    fill_sample,
    run_zarr2,
    sample_data,
)
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.testing.store import StoreTests

from zarrfs.backends.base import SIDE
from zarrfs.format import FormatError
from zarrfs.fs.sidedata import attr_key
from zarrfs.store import DatabaseStore


class _DatabaseStoreTests(StoreTests[DatabaseStore, cpu.Buffer]):
    """zarr-python 3's ``StoreTests`` with the value set and read behind the store's back,
    through the driver it holds."""

    store_cls = DatabaseStore
    buffer_cls = cpu.Buffer

    async def set(self, store: DatabaseStore, key: str, value: Buffer) -> None:
        store._db().put(key, value.to_bytes())

    async def get(self, store: DatabaseStore, key: str) -> Buffer:
        return self.buffer_cls.from_bytes(store._db().get(key))

    def test_store_repr(self, store: DatabaseStore) -> None:
        assert repr(store) == f"DatabaseStore({store.url!r}, read_only=False)"

    def test_store_supports_writes(self, store: DatabaseStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: DatabaseStore) -> None:
        assert store.supports_listing


class TestMemory(_DatabaseStoreTests):
    @pytest.fixture
    def store_kwargs(self) -> dict:
        return {"url": f"memory://{uuid.uuid4().hex}"}


class TestLMDB(_DatabaseStoreTests):
    @pytest.fixture
    def store_kwargs(self, tmp_path) -> dict:
        return {"url": f"lmdb://{tmp_path}/db.lmdb"}


class TestSQLite(_DatabaseStoreTests):
    @pytest.fixture
    def store_kwargs(self, tmp_path) -> dict:
        return {"url": f"sqlite://{tmp_path}/db.sqlite"}


class TestPostgres(_DatabaseStoreTests):
    @pytest.fixture
    def store_kwargs(self, postgres_server) -> dict:
        return {"url": postgres_server.url(table=f"s{uuid.uuid4().hex[:12]}")}


class TestRedis(_DatabaseStoreTests):
    @pytest.fixture
    def store_kwargs(self, redis_url) -> dict:
        return {"url": f"{redis_url}?prefix=s{uuid.uuid4().hex[:12]}"}


@pytest.fixture(params=["lmdb", "sqlite", "redis"])
def url(request, tmp_path) -> str:
    """A fresh database of each driver."""
    return make_url(request.param, tmp_path, request)


async def _names(aiter) -> list[str]:
    return [x async for x in aiter]


async def test_list_dir_names_each_child_once_whatever_sorts_between(url):
    # Key order is not folder order: "a-1/..." and "a.0" sort between the key "a" and "a/...".
    store = await DatabaseStore.open(url)
    buf = cpu.Buffer.from_bytes(b"x")
    for key in ("g/a", "g/a-1/x", "g/a.0", "g/a/b", "g/a/c/d", "g/a!", "g/a0", "g/b/x", "h"):
        await store.set(key, buf)
    listed = await _names(store.list_dir("g"))
    assert sorted(listed) == ["a", "a!", "a-1", "a.0", "a0", "b"]
    assert await _names(store.list_dir("")) == ["g", "h"]
    assert await _names(store.list_dir("g/a")) == ["b", "c"]
    store.close()


async def test_listings_stream_past_one_batch(url, monkeypatch):
    monkeypatch.setattr("zarrfs.store.BATCH", 7)
    store = await DatabaseStore.open(url)
    buf = cpu.Buffer.from_bytes(b"")
    keys = [f"a/{i:03d}" for i in range(30)] + [f"a/{i:03d}/deep/{j}" for i in range(5, 9) for j in range(9)]
    await store._set_many((k, buf) for k in keys)
    assert await _names(store.list_prefix("a/")) == sorted(keys)
    assert await _names(store.list()) == sorted(keys)
    listed = await _names(store.list_dir("a"))
    assert listed == [f"{i:03d}" for i in range(30)]
    store.close()


async def test_delete_dir_is_one_transaction_and_takes_side_records(url):
    store = await DatabaseStore.open(url)
    buf = cpu.Buffer.from_bytes(b"v")
    await store._set_many((k, buf) for k in ("a/zarr.json", "a/c/0", "a-b/zarr.json", "ab"))
    db = store._db()
    assert db.get(attr_key("a/c/0"), SIDE) is not None  # a set records the file's attributes
    await store.delete_dir("a")
    assert await _names(store.list()) == ["a-b/zarr.json", "ab"]
    assert db.get(attr_key("a/c/0"), SIDE) is None and db.get(attr_key("ab"), SIDE) is not None
    store.close()


async def test_the_empty_key_is_absent_as_in_zarrs_own_stores(url):
    # zarr's MemoryStore answers the empty key as a missing one (LocalStore's get too); so
    # must this store (it raised InvalidKeyError from the driver).
    from zarr.storage import MemoryStore

    proto = default_buffer_prototype()

    async def answers(store) -> list:
        await store.set("a/b", cpu.Buffer.from_bytes(b"v"))
        out = [await store.get("", proto), await store.exists(""),
               await store.get_partial_values(proto, [("", None)]), await store.delete("")]
        with pytest.raises(FileNotFoundError):
            await store.getsize("")
        out.append((await store.get("a/b", proto)).to_bytes())
        return out

    expected = [None, False, [None], None, b"v"]
    assert await answers(await MemoryStore.open()) == expected
    store = await DatabaseStore.open(url)
    assert await answers(store) == expected
    store.close()


async def test_set_if_not_exists_checks_and_writes_in_one_transaction(url):
    store = await DatabaseStore.open(url)
    await store.set_if_not_exists("k", cpu.Buffer.from_bytes(b"first"))
    await store.set_if_not_exists("k", cpu.Buffer.from_bytes(b"second"))
    got = await store.get("k", default_buffer_prototype())
    assert got.to_bytes() == b"first"
    store.close()


async def test_validate_refuses_bad_metadata_and_stores_nothing(tmp_path):
    store = await DatabaseStore.open(f"lmdb://{tmp_path}/db.lmdb", validate="strict")
    with pytest.raises(FormatError, match="zarray"):
        await store.set("arr/.zarray", cpu.Buffer.from_bytes(b'{"chunks": [0]}'))
    assert not await store.exists("arr/.zarray")
    root = zarr.open_group(store, mode="w", zarr_format=2)
    root.create_array("x", shape=(4,), chunks=(2,), dtype="i2")[:] = 3
    assert await store.exists("x/.zarray")
    store.close()


def test_zarr3_writes_a_database_zarr2_store_classes_read(url, zarr2_python, tmp_path):
    data = sample_data()
    npz = tmp_path / "data.npz"
    np.savez(npz, **data)
    store = DatabaseStore(url)
    g = zarr.open_group(store, mode="w", zarr_format=2, attributes={"title": "through the store"})
    fill_sample(g, data)
    store.close()
    kind, where = db_location(url)
    out = json.loads(run_zarr2(zarr2_python, ZARR2_READ_DB, kind, where, str(npz)))
    assert out["attrs"] == {"title": "through the store"} and out["sub"] == {"level": 1}
    assert "sub/u1/0/0/0" in out["keys"]


def test_zarr3_reads_what_zarr2_store_classes_wrote(url, zarr2_python, tmp_path):
    data = sample_data()
    npz = tmp_path / "data.npz"
    np.savez(npz, **data)
    kind, where = db_location(url)
    keys = json.loads(run_zarr2(zarr2_python, ZARR2_WRITE_DB, kind, where, str(npz)))
    store = DatabaseStore(url, read_only=True)
    g = zarr.open_group(store, mode="r", zarr_format=2)
    assert dict(g.attrs)["title"].startswith("written by zarr 2.18")
    assert_array_equal(g["f8"][:], data["f8"])
    assert_array_equal(g["i4"][:], data["i4"])
    assert_array_equal(g["sub/u1"][:], data["u1"])
    assert_array_equal(g["sub/b1"][:], data["b1"])
    store.close()
    assert "sub/u1/2/1/1" in keys


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_store_and_mount_see_each_other(url, mount_factory):
    store = DatabaseStore(url)
    g = zarr.open_group(store, mode="w", zarr_format=3)
    g.create_array("a", data=np.arange(12, dtype="i4").reshape(3, 4), chunks=(2, 2))
    store.close()
    m = mount_factory(url)
    assert "a/zarr.json" in files_under(m.path)
    assert_array_equal(zarr.open_array(m.path / "a", mode="r")[:], np.arange(12).reshape(3, 4))
    b = zarr.open_group(m.path, mode="a").create_array("b", shape=(5,), chunks=(5,), dtype="u1")
    b[:] = 7
    m.stop()
    store = DatabaseStore(url, read_only=True)
    assert_array_equal(zarr.open_array(store, path="b", mode="r")[:], np.full(5, 7, "u1"))
    store.close()


def test_a_set_through_the_store_updates_every_name_of_a_link_group(url, mount_factory):
    """A file with two names (``ln`` through a mount), then replaced through the store under one
    name: the other name reads the new content too, as after a write through a mount, and both
    names keep one file's attributes."""
    m = mount_factory(url, ["create"])
    (m.path / "f").write_bytes(b"old content")
    os.link(m.path / "f", m.path / "g")
    m.stop()
    store = DatabaseStore(url)
    store.set_sync("f", cpu.Buffer.from_bytes(b"new"))
    assert store.get_sync("g").to_bytes() == b"new"
    store.close()
    m = mount_factory(url)
    assert (m.path / "g").read_bytes() == b"new"
    f, g = os.stat(m.path / "f"), os.stat(m.path / "g")
    assert (f.st_ino, f.st_nlink, f.st_size, f.st_mtime_ns) == (g.st_ino, 2, 3, g.st_mtime_ns)



def test_a_name_deleted_through_the_store_leaves_its_link_group(url, mount_factory):
    """A file with three names (``ln`` through a mount), two of them deleted through the store
    (``delete``, ``delete_dir``) as an unlink removes a name, then made again there: the new
    files are not names of the old one, so the name left has one link, and a write to it
    leaves them as they are."""
    m = mount_factory(url, ["create"])
    (m.path / "f").write_bytes(b"linked")
    os.link(m.path / "f", m.path / "g")
    (m.path / "d").mkdir()
    os.link(m.path / "f", m.path / "d" / "h")
    m.stop()
    store = DatabaseStore(url)
    store.delete_sync("g")
    asyncio.run(store.delete_dir("d"))
    store.set_sync("g", cpu.Buffer.from_bytes(b"new g"))
    store.set_sync("d/h", cpu.Buffer.from_bytes(b"new h"))
    store.close()
    m = mount_factory(url)
    assert os.stat(m.path / "f").st_nlink == 1
    (m.path / "f").write_bytes(b"written to f")
    assert (m.path / "g").read_bytes() == b"new g"
    assert (m.path / "d" / "h").read_bytes() == b"new h"
    assert os.stat(m.path / "g").st_ino != os.stat(m.path / "f").st_ino


def test_a_delete_through_the_store_leaves_no_records_for_a_new_file(url, mount_factory):
    """Extended attributes and folder records are a node's, not a name's: a file deleted and
    a folder emptied through the store (``delete``, ``delete_dir``), then made again under
    the same names, come back without the old extended attributes or the old folder's mode."""
    m = mount_factory(url, ["create"])
    (m.path / "f").write_bytes(b"old")
    (m.path / "d").mkdir()
    (m.path / "d" / "x").write_bytes(b"old")
    os.setxattr(m.path / "f", "user.note", b"of the old file")
    os.setxattr(m.path / "d" / "x", "user.note", b"of the old file")
    os.setxattr(m.path / "d", "user.note", b"of the old folder")
    os.chmod(m.path / "d", 0o700)
    m.stop()
    store = DatabaseStore(url)
    store.delete_sync("f")
    asyncio.run(store.delete_dir("d"))
    store.set_sync("f", cpu.Buffer.from_bytes(b"new"))
    store.set_sync("d/x", cpu.Buffer.from_bytes(b"new"))
    store.close()
    m = mount_factory(url)
    for path in (m.path / "f", m.path / "d" / "x", m.path / "d"):
        assert os.listxattr(path) == [], path
    assert stat.S_IMODE(os.stat(m.path / "d").st_mode) == 0o755
    assert (m.path / "d" / "x").read_bytes() == b"new"

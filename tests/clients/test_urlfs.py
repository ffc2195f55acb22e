"""The fsspec filesystems (``zarrfs.urlfs``): zarr-python 3's own ``StoreTests`` over an
``FsspecStore`` on them, xarray and dask round trips by URL on every driver, the URL beside a
mount of the same database, and the URLs' paths, secrets and errors."""

from __future__ import annotations

import errno
import pickle
import time
import uuid

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.core.buffer import Buffer, cpu
from zarr.storage import FsspecStore
from zarr.storage._fsspec import _make_async
from zarr.testing.store import StoreTests

from zarrfs.urlfs import BY_SCHEME
from zarrfs.urlfs.schemes import LMDBFileSystem, RedisFileSystem


def _fs(url: str, **options):
    fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **options)
    return fs, path


class TestFsspecStoreOverLMDB(StoreTests[FsspecStore, cpu.Buffer]):
    """zarr's conformance class for its ``FsspecStore``, over the LMDB filesystem, values set and
    read behind the store's back through the filesystem (with no format checks: the class stores
    arbitrary bytes under metadata names)."""

    store_cls = FsspecStore
    buffer_cls = cpu.Buffer

    @pytest.fixture
    def store_kwargs(self, tmp_path):
        url = f"lmdb://{tmp_path}/db.lmdb/root"
        fs, path = fsspec.core.url_to_fs(url, validate="off", consolidate="off")
        yield {"fs": _make_async(fs), "path": path}
        fs.close()

    async def set(self, store: FsspecStore, key: str, value: Buffer) -> None:
        store.fs.sync_fs.pipe_file(f"{store.path}/{key}", value.to_bytes())

    async def get(self, store: FsspecStore, key: str) -> Buffer:
        return self.buffer_cls.from_bytes(store.fs.sync_fs.cat_file(f"{store.path}/{key}"))

    def test_store_repr(self, store: FsspecStore) -> None:
        assert repr(store) == f"<FsspecStore(AsyncFileSystemWrapper, {store.path})>"
        assert type(store.fs.sync_fs) is LMDBFileSystem

    def test_store_supports_writes(self, store: FsspecStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: FsspecStore) -> None:
        assert store.supports_listing


# --- every driver: a dataset written and read back by URL, the path inside the database -------


def _dataset() -> xr.Dataset:
    t = np.arange(24, dtype="f8").reshape(4, 6)
    return xr.Dataset({"t": (("x", "y"), t)}, coords={"x": [10, 20, 30, 40]}, attrs={"title": "by URL"})


def _at(url: str, path: str) -> str:
    """``url`` with ``path`` inside the database, before the options."""
    base, q, query = url.partition("?")
    return f"{base.rstrip('/')}/{path}" + (f"?{query}" if q else "")


def _url(kind: str, tmp_path, request) -> str:
    tag = f"u{uuid.uuid4().hex[:12]}"
    if kind in ("lmdb", "sqlite", "icechunk"):
        return f"{kind}://{tmp_path}/db.{kind}"
    if kind == "dbm":
        return f"dbm://{tmp_path}/db"
    if kind == "redis":
        return f"{request.getfixturevalue('redis_url')}?prefix={tag}"
    if kind == "cluster":
        return request.getfixturevalue("redis_cluster").url(prefix=tag)
    if kind == "postgres":
        return request.getfixturevalue("postgres_server").url(table=tag)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis", "cluster", "postgres", "dbm", "icechunk"])
def test_xarray_and_dask_round_trip_by_url(kind, tmp_path, request):
    import dask.array as da

    url = _at(_url(kind, tmp_path, request), "run1")
    ds = _dataset()
    # xarray takes a scheme of letters and digits only for a URL ("redis+cluster://" would be a
    # local path to it): the store fsspec makes of the URL, then
    where = FsspecStore.from_url(url) if "+" in kind or kind == "cluster" else url
    ds.to_zarr(where, mode="w", zarr_format=3)
    back = xr.open_zarr(where)
    xr.testing.assert_identical(back.load(), ds)
    t = da.from_zarr(_at(url, "t"))
    assert t.sum().compute(scheduler="threads") == ds.t.values.sum()
    (t * 2).to_zarr(_at(url, "t2"))  # dask writes chunks from its threads
    np.testing.assert_array_equal(zarr.open_array(_at(url, "t2"), mode="r")[:], ds.t.values * 2)
    with fsspec.open(_at(url, "t/zarr.json")) as f:
        assert b'"shape"' in f.read()
    # consolidated metadata kept true: a new array shows in the root's consolidated document
    zarr.open_group(url, mode="a").create_array("late", shape=(2,), dtype="u1")
    consolidated = zarr.open_group(url, mode="r", use_consolidated=True).metadata.consolidated_metadata
    assert "late" in consolidated.metadata
    fsspec.core.url_to_fs(url)[0].close()  # an Icechunk branch commits here, not at the exit


def test_dask_workers_in_processes_open_their_own_connections(tmp_path):
    """Worker processes forked from a parent that holds the database open: the tasks carry the
    filesystem as its class and options, and each worker opens its own connection."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import dask
    import dask.array as da

    url = f"sqlite://{tmp_path}/x.zarrdb/a"
    arr = zarr.open_array(url, mode="w", shape=(40,), chunks=(5,), dtype="i4")
    arr[:] = np.arange(40)  # the parent's connection is open when the workers fork
    fs, _ = _fs(url)
    maker, args = fs.__reduce__()  # what crosses to a worker: the class and its options
    assert pickle.loads(pickle.dumps(fs)).storage_options == fs.storage_options
    assert str(args) == str((type(fs), (), fs.storage_options)) and "DatabaseStore" not in str(args)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        with dask.config.set(scheduler="processes", pool=pool):
            (da.from_zarr(url) + 1).to_zarr(f"sqlite://{tmp_path}/x.zarrdb/b")
    np.testing.assert_array_equal(zarr.open_array(f"sqlite://{tmp_path}/x.zarrdb/b")[:], np.arange(1, 41))


def test_a_zip_archive_reads_by_url_and_refuses_writes(tmp_path):
    archive = tmp_path / "data.zip"
    with zarr.storage.ZipStore(archive, mode="w") as store:
        _dataset().to_zarr(store, group="run1", zarr_format=3, consolidated=False)
    url = f"zip://{archive}/run1"
    xr.testing.assert_identical(xr.open_zarr(url, consolidated=False).load(), _dataset())
    fs, path = _fs(url)
    with pytest.raises(PermissionError) as err:
        fs.pipe_file(f"{path}/new", b"x")
    assert err.value.errno == errno.EROFS and "read-only" in str(err.value)
    # fsspec's own chained form stays fsspec's
    inner = fsspec.filesystem("zip", fo=str(archive))
    assert type(inner).__module__ == "fsspec.implementations.zip" and inner.exists("run1/t/zarr.json")


def test_read_only_refuses_writes_and_a_read_creates_nothing(tmp_path):
    fs, path = _fs(f"lmdb://{tmp_path}/x.lmdb", read_only=True)
    with pytest.raises(PermissionError) as err:
        fs.pipe_file(f"{path}/k", b"v")
    assert err.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{path}/k")
    fs, path = _fs(f"lmdb://{tmp_path}/y.lmdb")
    assert not fs.exists(f"{path}/k") and not (tmp_path / "y.lmdb").exists()
    (tmp_path / "text").write_text("not a database")
    with pytest.raises(ValueError, match="not an LMDB database"):
        _fs(f"lmdb://{tmp_path}/text/k")[0].pipe_file(f"{tmp_path}/text/k", b"v")
    assert (tmp_path / "text").read_text() == "not a database"


def test_an_unknown_option_is_named_with_the_known_ones(tmp_path):
    fs, path = _fs(f"lmdb://{tmp_path}/x.lmdb?mapsize=1G")
    with pytest.raises(Exception, match="unknown option.*mapsize.*known: .*map_size") as err:
        fs.pipe_file(f"{path}/k", b"v")
    assert err.value.__cause__ is None and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="validate=.*strict, warn, off"):
        _fs(f"lmdb://{tmp_path}/x.lmdb", validate="yes")


def test_paths_follow_the_database_and_carry_no_secret(tmp_path, monkeypatch):
    fs, path = _fs("redis://:s3cret@127.0.0.1:6390/2/run1/t?prefix=zarr")
    assert type(fs) is RedisFileSystem and path == "127.0.0.1:6390/2/run1/t"
    assert fs.password == "s3cret" and fs.options == {"prefix": "zarr"}
    assert fs._split(path) == ("127.0.0.1:6390/2", "run1/t")
    # A database number is ASCII digits; "²" (a digit to str.isdigit) is a folder's name.
    assert fs._split("127.0.0.1:6390/\u00b2/t") == ("127.0.0.1:6390", "\u00b2/t")
    assert fs.unstrip_protocol(path) == "redis://127.0.0.1:6390/2/run1/t"
    pg, path = _fs("postgresql://me:pw@db.example:5432/science/run1?table=zarr")
    assert path == "me@db.example:5432/science/run1" and "pw" not in path
    assert pg._split(path) == ("me@db.example:5432/science", "run1")
    cluster, path = _fs("redis+cluster://h1:7000,h2:7001/run1?prefix=p")
    assert cluster._split(path) == ("h1:7000,h2:7001", "run1")
    (tmp_path / "a").mkdir()  # the first name that is not a folder is the database
    lm, path = _fs(f"lmdb://{tmp_path}/a/b.lmdb/run1/t/zarr.json")
    assert isinstance(lm, LMDBFileSystem) and lm._split(path) == (f"{tmp_path}/a/b.lmdb", "run1/t/zarr.json")
    assert {"lmdb", "sqlite", "dbm", "zip", "icechunk", "redis+cluster", "postgres"} <= BY_SCHEME.keys()


def test_a_server_error_never_shows_the_password(redis_server):
    fs, path = _fs(f"redis://:s3cret@127.0.0.1:{redis_server.port}/0/run1?prefix=p&bogus=1")
    with pytest.raises(Exception) as err:
        fs.cat_file(f"{path}/k")
    assert "bogus" in str(err.value) and "s3cret" not in str(err.value)


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_mount_and_a_url_writer_see_each_other(tmp_path, mount_factory):
    url = f"lmdb://{tmp_path}/db.lmdb"
    m = mount_factory(url, ["create"])
    zarr.open_group(str(m.path), mode="a").create_array("m", data=np.arange(6, dtype="u2"), chunks=(3,))
    np.testing.assert_array_equal(zarr.open_array(_at(url, "m"), mode="r")[:], np.arange(6))
    arr = zarr.open_group(url, mode="a").create_array("u", shape=(4,), chunks=(2,), dtype="i8")
    arr[:] = [5, 6, 7, 8]
    deadline = time.monotonic() + 30
    while not (m.path / "u" / "c" / "1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "u"), mode="r")[:], [5, 6, 7, 8])
    assert sorted(zarr.open_group(url, mode="r").array_keys()) == ["m", "u"]


def test_threads_making_a_new_database_at_once_make_one(tmp_path):
    """Threads' first writes to a database that is not there yet (zarr writes a new array's
    keys from several at once): each one's walk of the path must not see the LMDB folder
    another is making, without its data file yet, as a folder to make another database in."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    start = threading.Barrier(8)

    def put(db: str, i: int) -> None:
        fs, path = fsspec.core.url_to_fs(f"lmdb://{tmp_path}/{db}/run1/k{i}")  # an instance per thread
        start.wait()
        fs.pipe_file(path, b"v")

    dbs = [f"new{n}.lmdb" for n in range(12)]
    with ThreadPoolExecutor(8) as pool:
        for db in dbs:
            list(pool.map(put, [db] * 8, range(8)))
    for db in dbs:
        assert not (tmp_path / db / "run1").exists(), f"a database made inside {db}"
        fs, path = _fs(f"lmdb://{tmp_path}/{db}/run1")
        assert len(fs.find(path)) == 8


def test_one_key_by_fsspec_open_over_a_unix_socket(redis_server):
    url = f"unix://{redis_server.unix_socket}/run1/note.txt?db=0&prefix=u{uuid.uuid4().hex[:12]}"
    with fsspec.open(url, "wb") as f:
        f.write(b"through a socket")
    with fsspec.open(url, "rb") as f:
        assert f.read() == b"through a socket"
    fs, path = fsspec.core.url_to_fs(url)
    assert fs._split(path) == (redis_server.unix_socket, "run1/note.txt")
    assert fs.info(path)["size"] == 16 and fs.ls(path.rpartition("/")[0], detail=False) == [path]


def test_a_process_keeps_a_bounded_number_of_databases_open(tmp_path, monkeypatch):
    """Each LMDB environment maps its whole map size: a process that opened a few hundred
    databases by URL ran out of address space (``Cannot allocate memory``)."""
    from zarrfs.urlfs import filesystem

    monkeypatch.setattr(filesystem, "MAX_OPEN", 4)
    urls = [f"lmdb://{tmp_path}/db{i}.lmdb/k" for i in range(7)]
    for i, url in enumerate(urls):
        with fsspec.open(url, "wb") as f:
            f.write(b"%d" % i)
    opened = [s for ident, s in filesystem._STORES.items() if str(tmp_path) in ident[0]]
    kept = [ident for ident in filesystem._STORES if ident[1] != "icechunk"]  # icechunk: never closed so
    assert len(kept) <= 4 and len(opened) >= 1 and all(s._driver is not None for s in opened)
    assert [fsspec.open(url).open().read() for url in urls] == [b"%d" % i for i in range(7)]
    fsspec.core.url_to_fs(urls[0])[0].close()


def test_what_a_url_writes_zarr2_sqlitestore_reads(zarr2_python, tmp_path):
    import json

    from test_clients import ZARR2_READ_DB, fill_sample, run_zarr2, sample_data

    data = sample_data()
    np.savez(tmp_path / "data.npz", **data)
    url = f"sqlite://{tmp_path}/x.zarrdb"
    g = zarr.open_group(url, mode="w", zarr_format=2, attributes={"title": "through the URL"})
    fill_sample(g, data)
    fsspec.core.url_to_fs(url)[0].close()
    out = json.loads(
        run_zarr2(
            zarr2_python, ZARR2_READ_DB, "sqlite", str(tmp_path / "x.zarrdb"), str(tmp_path / "data.npz")
        )
    )
    assert out["attrs"] == {"title": "through the URL"} and out["sub"] == {"level": 1}
    assert "sub/u1/0/0/0" in out["keys"]

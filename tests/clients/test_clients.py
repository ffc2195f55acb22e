"""Real Zarr clients through real mounts of every driver: zarr-python 3 (``LocalStore``),
zarr-python 2.18 (``DirectoryStore``, ``NestedDirectoryStore``, and its ``LMDBStore`` /
``SQLiteStore`` / ``RedisStore`` writing the databases directly), xarray and tensorstore.

zarr 2 cannot share this environment with zarr 3: its scripts run with the interpreter of the
zarr-2 venv (``zarr2_python`` fixture, ``zarr2env.run``). Every check compares values with numpy.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs
from mounting import DRIVERS, make_url, needs_fuse
from zarr2env import run as run_zarr2

pytestmark = needs_fuse


@pytest.fixture(params=[*DRIVERS, "spread"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every driver, and a Redis Cluster hierarchy spread over its masters (``?spread=1``)."""
    return make_url(request.param, tmp_path, request)


# --- helpers ---------------------------------------------------------------------------------


def files_under(root: Path) -> set[str]:
    """Relative paths of every file below ``root`` ('/'-separated: they are the Zarr keys)."""
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            out.add(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return out


def assert_no_temp_files(root: Path) -> None:
    """zarr's ``*.partial`` temp files must all have been renamed or unlinked."""
    left = sorted(p for p in files_under(root) if ".partial" in p)
    assert not left, f"temp files left behind: {left}"


METADATA_NAMES = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}


def chunk_keys(array_dir: Path) -> set[str]:
    """The chunk files of one array (every file but its metadata)."""
    return {k for k in files_under(array_dir) if k not in METADATA_NAMES}


def chunk_file(array_dir: Path, zarr_format: int, *index: int) -> Path:
    """Path of one chunk with zarr's default chunk key encoding of each format."""
    if zarr_format == 2:
        return array_dir / ".".join(map(str, index))
    return array_dir.joinpath("c", *map(str, index))


def assert_array_equal(actual, expected) -> None:
    actual = np.asarray(actual)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (actual, expected)
    np.testing.assert_array_equal(actual, expected)


def compressors_for(zarr_format: int) -> list:
    """Three different compressions (one per array) in the form each format takes."""
    if zarr_format == 2:
        return [
            numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE),
            numcodecs.Zstd(level=3),
            numcodecs.GZip(level=6),
        ]
    return [
        zarr.codecs.BloscCodec(cname="zstd", clevel=5, shuffle="bitshuffle"),
        zarr.codecs.ZstdCodec(level=3),
        zarr.codecs.GzipCodec(level=6),
    ]


def saved_sample(folder: Path) -> tuple[dict[str, np.ndarray], Path]:
    """:func:`sample_data`, and the ``.npz`` file in ``folder`` it was saved to (for another
    interpreter to load)."""
    data = sample_data()
    npz = folder / "data.npz"
    np.savez(npz, **data)
    return data, npz


def fill_sample(g, data) -> None:
    """Write :func:`sample_data` as zarr-python 3 arrays into the group ``g`` (Zarr format 2,
    with a subgroup, a nested chunk key encoding and an uncompressed array)."""
    g.create_array("f8", data=data["f8"], chunks=(5, 4), fill_value=np.nan)
    g.create_array("i4", data=data["i4"], chunks=(10,))
    sub = g.create_group("sub", attributes={"level": 1})
    sub.create_array(
        "u1", data=data["u1"], chunks=(2, 3, 4), chunk_key_encoding={"name": "v2", "separator": "/"}
    )
    sub.create_array("b1", data=data["b1"], chunks=(4, 4), compressors=None)


def sample_data() -> dict[str, np.ndarray]:
    """Arrays with edge chunks, NaNs, negative ints and booleans."""
    rng = np.random.default_rng(42)
    f8 = rng.normal(size=(23, 17))
    f8[3, 4] = np.nan
    return {
        "f8": f8,
        "i4": (np.arange(101, dtype="i4") - 50) * 7,
        "u1": rng.integers(0, 255, size=(5, 6, 7), dtype="u1"),
        "b1": rng.random(size=(9, 4)) > 0.5,
    }


def redis_parts(url: str) -> dict:
    """host, port, db and prefix of a ``redis://host:port/db?prefix=...`` URL."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 6379,
        "db": int(parts.path.strip("/") or 0),
        "prefix": query.get("prefix", ["zarr"])[0],
    }


def db_location(url: str) -> tuple[str, str]:
    """``(kind, where)`` for a zarr-2 store class: a path, or JSON of the Redis parameters."""
    kind = urlsplit(url).scheme
    if kind in ("lmdb", "sqlite"):
        return kind, urlsplit(url).path
    return "redis", json.dumps(redis_parts(url))


def ts_open(path: Path, driver: str, **spec):
    import tensorstore as ts

    return ts.open(
        {"driver": driver, "kvstore": {"driver": "file", "path": str(path) + "/"}, **spec}
    ).result()


# --- zarr-python 3, LocalStore ---------------------------------------------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr3_compressed_arrays_groups_attributes(mounted, zarr_format):
    path = mounted.path / "h"
    data = sample_data()
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format, attributes={"title": "zarrfs", "n": 1})
    sub = root.create_group("sub/deeper", attributes={"level": 2})
    comps = compressors_for(zarr_format)
    root.create_array("f8", data=data["f8"], chunks=(5, 4), compressors=comps[0], fill_value=np.nan)
    root.create_array("i4", data=data["i4"], chunks=(10,), compressors=comps[1], attributes={"units": "m"})
    sub.create_array("u1", data=data["u1"], chunks=(2, 3, 4), compressors=comps[2])
    root.create_array("b1", data=data["b1"], chunks=(4, 4), compressors=None)

    # the files a DirectoryStore user expects
    meta = ".zarray" if zarr_format == 2 else "zarr.json"
    group_meta = ".zgroup" if zarr_format == 2 else "zarr.json"
    assert (path / group_meta).is_file() and (path / "sub/deeper" / group_meta).is_file()
    assert (path / "f8" / meta).is_file() and (path / "sub/deeper/u1" / meta).is_file()
    assert chunk_file(path / "f8", zarr_format, 4, 4).is_file()  # the edge chunk
    doc = json.loads((path / "i4" / meta).read_text())
    if zarr_format == 2:
        assert doc["compressor"]["id"] == "zstd"
    else:
        assert [c["name"] for c in doc["codecs"]] == ["bytes", "zstd"]

    # attributes are updated in place
    root.attrs.update({"n": 2, "list": [1, 2, 3]})
    root["i4"].attrs["units"] = "km"

    again = zarr.open_group(path, mode="r")
    assert again.metadata.zarr_format == zarr_format
    assert dict(again.attrs) == {"title": "zarrfs", "n": 2, "list": [1, 2, 3]}
    assert dict(again["i4"].attrs) == {"units": "km"}
    assert dict(again["sub/deeper"].attrs) == {"level": 2}
    assert sorted(again.array_keys()) == ["b1", "f8", "i4"]
    assert sorted(again.group_keys()) == ["sub"]
    assert_array_equal(again["f8"][:], data["f8"])
    assert_array_equal(again["i4"][:], data["i4"])
    assert_array_equal(again["sub/deeper/u1"][:], data["u1"])
    assert_array_equal(again["b1"][:], data["b1"])
    assert_array_equal(again["f8"][2:19, 3:11], data["f8"][2:19, 3:11])
    assert_no_temp_files(path)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr3_overwrite_resize_and_deleted_chunks(mounted, zarr_format):
    path = mounted.path / "h"
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format)

    # overwrite an array with one of another shape and dtype: no old chunk survives
    old = root.create_array("a", shape=(100,), chunks=(10,), dtype="i4")
    old[:] = np.arange(100, dtype="i4")
    assert chunk_keys(path / "a") == {str(chunk_file(Path(), zarr_format, i)) for i in range(10)}
    new = root.create_array("a", shape=(7, 3), chunks=(2, 2), dtype="f4", overwrite=True)
    expected = np.arange(21, dtype="f4").reshape(7, 3) + 1
    new[:] = expected
    assert chunk_keys(path / "a") == {
        str(chunk_file(Path(), zarr_format, i, j)) for i in range(4) for j in range(2)
    }
    assert_array_equal(zarr.open_array(path / "a", mode="r")[:], expected)

    # resize: grow, write the new part, shrink (chunks beyond the new shape are deleted)
    r = root.create_array("r", shape=(20, 20), chunks=(10, 10), dtype="i8", fill_value=-1)
    model = np.arange(400, dtype="i8").reshape(20, 20)
    r[:] = model
    r.resize((30, 15))
    grown = np.full((30, 15), -1, dtype="i8")
    grown[:20, :15] = model[:, :15]
    assert_array_equal(zarr.open_array(path / "r", mode="r")[:], grown)
    grown[20:, :] = 7
    r[20:, :] = 7
    assert chunk_file(path / "r", zarr_format, 2, 1).is_file()
    assert_array_equal(zarr.open_array(path / "r", mode="r")[:], grown)
    r.resize((10, 15))
    assert not chunk_file(path / "r", zarr_format, 1, 0).exists()
    assert not chunk_file(path / "r", zarr_format, 2, 1).exists()
    reopened = zarr.open_array(path / "r", mode="r")
    assert reopened.shape == (10, 15)
    assert_array_equal(reopened[:], grown[:10])

    # write_empty_chunks=False (the default): an all-fill chunk is unlinked
    d = root.create_array("d", shape=(20, 20), chunks=(10, 10), dtype="f8", fill_value=0.0)
    d[:] = 1.5
    for i in range(2):
        for j in range(2):
            assert chunk_file(path / "d", zarr_format, i, j).is_file()
    d[:10, 10:] = 0.0
    assert not chunk_file(path / "d", zarr_format, 0, 1).exists()
    d[10:, :] = 0.0
    assert not chunk_file(path / "d", zarr_format, 1, 0).exists()
    assert not chunk_file(path / "d", zarr_format, 1, 1).exists()
    assert chunk_file(path / "d", zarr_format, 0, 0).is_file()
    if zarr_format == 3:  # the emptied chunk folder is not a problem for listings
        assert sorted(os.listdir(path / "d/c/0")) == ["0"]
    expect = np.zeros((20, 20))
    expect[:10, :10] = 1.5
    assert_array_equal(zarr.open_array(path / "d", mode="r")[:], expect)
    assert_no_temp_files(path)


def test_zarr3_sharded_array(mounted):
    path = mounted.path / "sharded"
    model = np.arange(40 * 30, dtype="i4").reshape(40, 30) * 3 - 100
    a = zarr.create_array(
        path,
        shape=model.shape,
        chunks=(5, 5),
        shards=(20, 10),
        dtype="i4",
        fill_value=0,
        compressors=zarr.codecs.ZstdCodec(level=1),
        zarr_format=3,
    )
    a[:] = model
    assert sorted(files_under(path)) == ["c/0/0", "c/0/1", "c/0/2", "c/1/0", "c/1/1", "c/1/2", "zarr.json"]
    b = zarr.open_array(path, mode="r")
    assert_array_equal(b[:], model)
    # partial reads decode single inner chunks from byte ranges of a shard
    assert_array_equal(b[7:9, 11:13], model[7:9, 11:13])
    assert_array_equal(b[19:21, 9:21], model[19:21, 9:21])
    assert b[39, 29] == model[39, 29]
    # rewrite part of a shard, and empty a whole shard
    a[2:4, 2:4] = 5
    model[2:4, 2:4] = 5
    a[20:, 20:] = 0
    model[20:, 20:] = 0
    assert not (path / "c/1/2").exists()
    assert_array_equal(zarr.open_array(path, mode="r")[:], model)
    assert_no_temp_files(path)


# --- zarr-python 2.18 DirectoryStore / NestedDirectoryStore --------------------------------

ZARR2_DIRECTORY_STORES = r"""
import json, sys
import numpy as np, numcodecs, zarr

base, npz = sys.argv[1], sys.argv[2]
data = np.load(npz)
for cls_name in ("DirectoryStore", "NestedDirectoryStore"):
    cls = getattr(zarr, cls_name)
    root = zarr.group(store=cls(f"{base}/{cls_name}"), overwrite=True)
    root.attrs.update({"store": cls_name, "n": 1})
    f8 = root.create_dataset("f8", data=data["f8"], chunks=(5, 4), fill_value=np.nan,
                             compressor=numcodecs.Blosc(cname="lz4", clevel=5))
    f8.attrs["units"] = "K"
    root.create_group("sub").create_dataset("u1", data=data["u1"], chunks=(2, 3, 4),
                                             compressor=numcodecs.Zstd(level=3))
    grow = root.create_dataset("i4", data=data["i4"][:50], chunks=(10,))
    grow.append(data["i4"][50:])
    f8[0, :] = -1.0
    root.attrs["n"] = 2
    # read back in zarr 2 through a fresh store object
    again = zarr.open_group(cls(f"{base}/{cls_name}"), mode="r")
    expect_f8 = data["f8"].copy()
    expect_f8[0, :] = -1.0
    assert np.array_equal(again["f8"][:], expect_f8, equal_nan=True)
    assert np.array_equal(again["sub/u1"][:], data["u1"])
    assert np.array_equal(again["i4"][:], data["i4"])
    assert again.attrs.asdict() == {"store": cls_name, "n": 2}, again.attrs.asdict()
    assert again["f8"].attrs["units"] == "K"
print(json.dumps({"ok": True, "zarr": zarr.__version__}))
"""


@pytest.mark.slow
def test_zarr2_directory_stores(mounted, zarr2_python, tmp_path):
    data, npz = saved_sample(tmp_path)
    base = mounted.path / "z2"
    out = json.loads(run_zarr2(zarr2_python, ZARR2_DIRECTORY_STORES, str(base), str(npz)))
    assert out["ok"] and out["zarr"].startswith("2.18")
    assert (base / "DirectoryStore/f8/4.4").is_file()
    assert (base / "NestedDirectoryStore/f8/4/4").is_file()
    assert (base / "NestedDirectoryStore/sub/u1/2/1/1").is_file()
    expect_f8 = data["f8"].copy()
    expect_f8[0, :] = -1.0
    for cls_name in ("DirectoryStore", "NestedDirectoryStore"):
        g = zarr.open_group(base / cls_name, mode="r", zarr_format=2)
        assert dict(g.attrs) == {"store": cls_name, "n": 2}
        assert_array_equal(g["f8"][:], expect_f8)
        assert_array_equal(g["sub/u1"][:], data["u1"])
        assert_array_equal(g["i4"][:], data["i4"])
        assert dict(g["f8"].attrs) == {"units": "K"}
    assert_no_temp_files(base)


# --- xarray ----------------------------------------------------------------------------------


def sample_dataset():
    import pandas as pd
    import xarray as xr

    temp = np.linspace(250.0, 300.0, 6 * 4).reshape(6, 4)
    temp[2, 1] = np.nan
    return xr.Dataset(
        {
            "temp": (("time", "x"), temp, {"units": "K", "long_name": "température de l'air"}),
            "count": (("time",), np.array([3, -1, 4, 1, -5, 9], dtype="i8"), {"comment": "ints"}),
        },
        coords={"time": pd.date_range("2024-01-01", periods=6, freq="D"), "x": [10, 20, 30, 40]},
        attrs={"title": "zarrfs test", "history": "made by test_clients.py ✓"},
    )


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_xarray_to_zarr_and_open_zarr(mounted, zarr_format):
    import xarray as xr

    ds = sample_dataset()
    path = mounted.path / "ds.zarr"
    with warnings.catch_warnings():
        # zarr 3 warns that consolidated metadata is not in the v3 spec yet
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        ds.to_zarr(path, consolidated=True, zarr_format=zarr_format, encoding={"temp": {"chunks": (4, 2)}})
        if zarr_format == 2:
            assert (path / ".zmetadata").is_file()
        else:
            assert "consolidated_metadata" in json.loads((path / "zarr.json").read_text())
        with xr.open_zarr(path, consolidated=True) as out:
            xr.testing.assert_identical(out.load(), ds)
            assert out["temp"].encoding["chunks"] == (4, 2)
        # append along time, then read everything again
        more = sample_dataset().assign_coords(time=ds.time + np.timedelta64(6, "D"))
        more.to_zarr(path, append_dim="time", consolidated=True, zarr_format=zarr_format)
        with xr.open_zarr(path, consolidated=True) as out:
            xr.testing.assert_identical(out.load(), xr.concat([ds, more], dim="time"))
    assert_no_temp_files(path)


# --- tensorstore: a reader and writer that is not zarr-python -------------------------------


@pytest.mark.slow
def test_tensorstore_reads_zarr_python_and_back(mounted):
    root = mounted.path
    model = np.arange(24 * 18, dtype="f8").reshape(24, 18) / 7
    model[5, 5] = np.nan
    ints = (np.arange(300, dtype="i2") - 150).reshape(20, 15)

    # zarr-python writes, tensorstore reads
    zarr.create_array(root / "zp/v2", data=model, chunks=(5, 5), zarr_format=2, compressors=numcodecs.Zstd(3))
    zarr.create_array(
        root / "zp/v2nested",
        data=ints,
        chunks=(6, 4),
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    zarr.create_array(root / "zp/v3", data=model, chunks=(5, 5), zarr_format=3)
    zarr.create_array(root / "zp/v3sharded", data=ints, chunks=(5, 5), shards=(10, 15), zarr_format=3)
    assert (root / "zp/v2nested/3/3").is_file()
    np.testing.assert_array_equal(ts_open(root / "zp/v2", "zarr").read().result(), model)
    np.testing.assert_array_equal(ts_open(root / "zp/v2nested", "zarr").read().result(), ints)
    np.testing.assert_array_equal(ts_open(root / "zp/v3", "zarr3").read().result(), model)
    t = ts_open(root / "zp/v3sharded", "zarr3")
    np.testing.assert_array_equal(t.read().result(), ints)
    np.testing.assert_array_equal(t[3:17, 4:9].read().result(), ints[3:17, 4:9])

    # tensorstore writes, zarr-python reads
    t2 = ts_open(
        root / "ts/v2",
        "zarr",
        create=True,
        metadata={
            "shape": [24, 18],
            "chunks": [5, 5],
            "dtype": "<f8",
            "compressor": {"id": "zstd", "level": 3},
        },
    )
    t2[...] = model
    t3 = ts_open(
        root / "ts/v3",
        "zarr3",
        create=True,
        metadata={
            "shape": [20, 15],
            "data_type": "int16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [10, 15]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [5, 5],
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "zstd"},
                        ],
                    },
                }
            ],
        },
    )
    t3[...] = ints
    t3[0:5, 0:5] = 1
    expect = ints.copy()
    expect[0:5, 0:5] = 1
    assert_array_equal(zarr.open_array(root / "ts/v2", mode="r", zarr_format=2)[:], model)
    assert_array_equal(zarr.open_array(root / "ts/v3", mode="r", zarr_format=3)[:], expect)
    assert (root / "ts/v2/.zarray").is_file() and (root / "ts/v3/c/1/0").is_file()


# --- the headline: databases of zarr 2's own store classes -----------------------------------

ZARR2_WRITE_DB = r"""
import json, sys
import numpy as np, numcodecs, zarr

kind, where, npz = sys.argv[1:4]
data = np.load(npz)
if kind == "lmdb":
    store = zarr.LMDBStore(where)
elif kind == "sqlite":
    store = zarr.SQLiteStore(where)
else:
    store = zarr.RedisStore(**json.loads(where))
root = zarr.group(store=store)
root.attrs["title"] = "written by zarr " + zarr.__version__
root.create_dataset("f8", data=data["f8"], chunks=(5, 4), fill_value=np.nan)  # Blosc, the default
# (numcodecs 0.15's Zstd config has a "checksum" member that tensorstore refuses)
root.create_dataset("i4", data=data["i4"], chunks=(10,),
                    compressor=numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE))
sub = root.create_group("sub")
sub.attrs["level"] = 1
sub.create_dataset("u1", data=data["u1"], chunks=(2, 3, 4), dimension_separator="/",
                   compressor=numcodecs.GZip(level=5))
sub.create_dataset("b1", data=data["b1"], chunks=(4, 4), compressor=None)
keys = sorted(store.keys())
store.close()
print(json.dumps(keys))
"""

ZARR2_READ_DB = r"""
import json, sys
import numpy as np, zarr

kind, where, npz = sys.argv[1:4]
data = np.load(npz)
if kind == "lmdb":
    store = zarr.LMDBStore(where, readonly=True)
elif kind == "sqlite":
    store = zarr.SQLiteStore(where)
else:
    store = zarr.RedisStore(**json.loads(where))
root = zarr.open_group(store=store, mode="r")
for name, key in {"f8": "f8", "i4": "i4", "u1": "sub/u1", "b1": "sub/b1"}.items():
    got = root[key][:]
    want = data[name]
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
    assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), name
out = {"keys": sorted(store.keys()), "attrs": root.attrs.asdict(), "sub": root["sub"].attrs.asdict()}
store.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_database_written_by_zarr2_store_classes_mounts(
    zarr2_db_url, mount_factory, zarr2_python, tmp_path
):
    data, npz = saved_sample(tmp_path)
    kind, where = db_location(zarr2_db_url)
    keys = json.loads(run_zarr2(zarr2_python, ZARR2_WRITE_DB, kind, where, str(npz)))
    assert "sub/u1/2/1/1" in keys and "f8/.zarray" in keys

    m = mount_factory(zarr2_db_url)  # the database exists: no -o create
    root = m.path
    assert files_under(root) == set(keys)  # one file per key, and nothing else
    g = zarr.open_group(root, mode="r")
    assert g.metadata.zarr_format == 2
    assert dict(g.attrs)["title"].startswith("written by zarr 2.18")
    assert dict(g["sub"].attrs) == {"level": 1}
    assert_array_equal(g["f8"][:], data["f8"])
    assert_array_equal(g["i4"][:], data["i4"])
    assert_array_equal(g["sub/u1"][:], data["u1"])
    assert_array_equal(g["sub/b1"][:], data["b1"])
    np.testing.assert_array_equal(ts_open(root / "f8", "zarr").read().result(), data["f8"])
    np.testing.assert_array_equal(ts_open(root / "i4", "zarr").read().result(), data["i4"])
    np.testing.assert_array_equal(ts_open(root / "sub/u1", "zarr").read().result(), data["u1"])
    np.testing.assert_array_equal(ts_open(root / "sub/b1", "zarr").read().result(), data["b1"])


@pytest.mark.slow
def test_hierarchy_written_through_mount_opens_with_zarr2_store_classes(
    zarr2_db_url, mount_factory, zarr2_python, tmp_path
):
    data, npz = saved_sample(tmp_path)
    m = mount_factory(zarr2_db_url, ["create"])
    g = zarr.open_group(m.path, mode="a", zarr_format=2, attributes={"title": "through the mount"})
    g.create_array("f8", data=data["f8"], chunks=(5, 4), fill_value=np.nan)
    g.create_array("i4", data=data["i4"], chunks=(10,), compressors=numcodecs.Blosc(cname="lz4"))
    sub = g.create_group("sub", attributes={"level": 1})
    sub.create_array(
        "u1", data=data["u1"], chunks=(2, 3, 4), chunk_key_encoding={"name": "v2", "separator": "/"}
    )
    sub.create_array("b1", data=data["b1"], chunks=(4, 4), compressors=None)
    # chunks that were written and then emptied again must be gone from the database too
    tmp = g.create_array("gone", shape=(4,), chunks=(2,), dtype="i2", fill_value=0)
    tmp[:] = 1
    tmp[:] = 0
    os.mkdir(m.path / "empty-folder")  # side data only: zarr 2 must not see it
    keys = files_under(m.path)
    m.stop()

    kind, where = db_location(zarr2_db_url)
    out = json.loads(run_zarr2(zarr2_python, ZARR2_READ_DB, kind, where, str(npz)))
    assert set(out["keys"]) == keys
    assert not any(k.startswith(("gone/0", "gone/1", "empty-folder")) for k in out["keys"])
    assert out["attrs"] == {"title": "through the mount"}
    assert out["sub"] == {"level": 1}

"""Everything real clients write must validate: we must never refuse a real client's data.

Each test writes a hierarchy with a real client into a temporary directory, then validates every
key of the result (check_items: names, metadata documents, chunk keys, consolidated copies).
zarr-python 3 and xarray also run through a store that validates every key at the moment it
is written, against the directory as it is then: what the filesystem sees at commit time,
writes racing each other included.
"""

from __future__ import annotations

import json
import os

import numcodecs
import numpy as np
import pandas as pd
import pytest
import tensorstore as ts
import xarray as xr
import zarr
from format_cases import dir_getter, dir_keys, errors, rules
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.storage import LocalStore

from zarrfs.format import (
    build_consolidated,
    check_items,
    dumps_consolidated,
    is_metadata_key,
    validate_data_key,
    validate_metadata,
    validate_name,
)

pytestmark = pytest.mark.filterwarnings("ignore")


def validate_tree(root: str):
    get = dir_getter(root)
    return list(check_items(((k, get(k)) for k in dir_keys(root)), get))


def assert_clean(
    root: str, allowed_warnings: set[str] = frozenset({"zattrs.nan-literal", "zarr.json.nan-literal"})
):
    problems = validate_tree(root)
    assert errors(problems) == [], "\n".join(map(str, errors(problems)))
    unexpected = rules(problems, "warning") - set(allowed_warnings) - {"zmetadata.nan-literal"}
    assert not unexpected, "\n".join(str(p) for p in problems if p.rule in unexpected)
    assert len(dir_keys(root)) > 3


class ValidatingStore(LocalStore):
    """A LocalStore that validates each key when it is written, as the filesystem will."""

    def __init__(self, root, **kwargs):
        super().__init__(root, **kwargs)
        self.problems = []
        self.writes = 0

    def _check(self, key: str, value) -> None:
        get = dir_getter(str(self.root))
        data = value.to_bytes()
        found = validate_name(key)
        found += validate_metadata(key, data, get) if is_metadata_key(key) else validate_data_key(key, get)
        self.problems.extend(errors(found))
        self.writes += 1

    async def _set(self, key, value, exclusive=False):
        self._check(key, value)
        return await super()._set(key, value, exclusive=exclusive)

    def set_sync(self, key, value):
        self._check(key, value)
        return super().set_sync(key, value)


# --- zarr-python 3 ---------------------------------------------------------------------------


def build_zarr3(store, fmt: int) -> None:
    """A hierarchy with every data type and codec layout zarr-python 3 offers for ``fmt``."""
    root = zarr.open_group(store, mode="w", zarr_format=fmt)
    root.attrs.update({"title": "t", "missing": float("nan")})
    g = root.create_group("grp/sub")

    def arr(name, data, **kw):
        a = g.create_array(name, shape=data.shape, dtype=kw.pop("dtype", data.dtype), **kw)
        a[...] = data
        return a

    r = np.arange(60, dtype="f4").reshape(6, 10)
    arr("f4", r, chunks=(4, 4), fill_value=np.nan)
    arr("i2", r.astype("i2"), chunks=(4, 4), fill_value=7)
    arr("u8", r.astype("u8"), chunks=(4, 4), fill_value=2**64 - 1)
    arr("b", r > 20, chunks=(4, 4))
    arr("c16", r.astype("c16") * 1j, chunks=(4, 4), fill_value=complex(np.nan, 1))
    arr("dt", np.array(["2000-01-01", "NaT", "2001-02-03"], dtype="M8[ns]"), chunks=(2,))
    arr("td", np.array([1, 2, 3], dtype="m8[s]"), chunks=(2,))
    arr("s5", np.array([b"ab", b"cdefg", b""], dtype="S5"), chunks=(2,), fill_value=b"xy")
    arr("u3", np.array(["ab", "cde", ""], dtype="U3"), chunks=(2,), fill_value="z")
    arr("v4", np.frombuffer(b"abcdefghijkl", dtype="V4"), chunks=(2,))
    st = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
    st["a"] = [1, 2, 3]
    arr("struct", st, chunks=(2,), fill_value=np.zeros((), st.dtype)[()])
    arr("str", np.array(["a", "bb", "ccc"], dtype=object), dtype=str, chunks=(2,))
    arr(
        "bytes",
        np.array([b"a", b"bb", b"ccc"], dtype=object),
        dtype=zarr.dtype.VariableLengthBytes(),
        chunks=(2,),
    )
    arr("scalar", np.array(3.5), chunks=())
    arr("empty", np.zeros((0, 5)), chunks=(2, 2))
    if fmt == 2:
        arr("be", r.astype(">i4"), chunks=(4, 4))
        arr("forder", r, chunks=(4, 4), order="F")
        arr("slash", r, chunks=(4, 4), chunk_key_encoding={"name": "v2", "separator": "/"})
        arr(
            "delta",
            r.astype("i2"),
            chunks=(4, 4),
            filters=[numcodecs.Delta(dtype="<i2")],
            compressors=numcodecs.Zlib(1),
        )
        arr("nocomp", r, chunks=(4, 4), compressors=None)
    else:
        arr("be", r.astype("i4"), chunks=(4, 4), serializer=BytesCodec(endian="big"))
        arr(
            "transpose",
            r,
            chunks=(4, 4),
            filters=[TransposeCodec(order=(1, 0))],
            compressors=[GzipCodec(level=3), Crc32cCodec()],
        )
        arr("blosc", r, chunks=(4, 4), compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")])
        arr("zstd", r, chunks=(4, 4), compressors=[ZstdCodec(level=5, checksum=True)])
        arr("dots", r, chunks=(4, 4), chunk_key_encoding={"name": "default", "separator": "."})
        arr("v2keys", r, chunks=(4, 4), chunk_key_encoding={"name": "v2", "separator": "."})
        arr("sharded", r, chunks=(2, 2), shards=(4, 4))
        arr("sharded_str", np.array(["x"] * 8, dtype=object), dtype=str, chunks=(2,), shards=(4,))
        arr("nczlib", r, chunks=(4, 4), compressors=[zarr.codecs.numcodecs.Zlib(level=2)])
        arr("named", r, chunks=(4, 4), dimension_names=["y", None])
        arr("nocomp", r, chunks=(4, 4), compressors=None)
    a = g["f4"]
    a.resize((3, 10))
    a.resize((8, 12))
    a[6:, :] = 1
    zarr.consolidate_metadata(store)


@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_python_3(tmp_path, fmt):
    store = ValidatingStore(tmp_path / "h.zarr")
    build_zarr3(store, fmt)
    assert store.writes > 50
    assert store.problems == [], "\n".join(map(str, store.problems))
    assert_clean(str(tmp_path / "h.zarr"))
    # and the consolidated metadata it wrote is not reported stale
    assert not {"zmetadata.stale", "zarr.json.consolidated-stale"} & rules(
        validate_tree(str(tmp_path / "h.zarr")), "warning"
    )


def test_zarr_python_3_overwrite_and_delete(tmp_path):
    """Overwriting an array with another of different rank, and replacing an array by a group."""
    store = ValidatingStore(tmp_path / "o.zarr")
    for fmt in (2, 3):
        root = zarr.open_group(store, mode="w", zarr_format=fmt)
        a = root.create_array("x", shape=(4, 4), chunks=(2, 2), dtype="i4")
        a[...] = 1
        b = root.create_array("x", shape=(4, 4, 4), chunks=(2, 2, 2), dtype="i4", overwrite=True)
        b[...] = 2
        root.create_group("x", overwrite=True).create_array("y", shape=(3,), dtype="u1")[...] = 3
    assert store.problems == [], "\n".join(map(str, store.problems))
    assert_clean(str(tmp_path / "o.zarr"))


# --- xarray ----------------------------------------------------------------------------------


def dataset(t0: str, n: int) -> xr.Dataset:
    times = pd.date_range(t0, periods=n, freq="D")
    temp = np.arange(n * 3, dtype="f8").reshape(n, 3)
    temp[::2, 1] = np.nan
    return xr.Dataset(
        {
            "temp": (("time", "x"), temp, {"units": "K"}),
            "name": (("x",), np.array(["a", "bb", "ccc"], dtype=object)),
            "fixed": (("x",), np.array(["a", "bb", "ccc"], dtype="U3")),
            "raw": (("x",), np.array([b"a", b"bb", b"c"])),
            "when": (("x",), pd.to_datetime(["2001-01-01", None, "2002-01-01"])),
            "dur": (("x",), pd.to_timedelta([1, 2, None], unit="h")),
            "flag": (("x",), np.array([True, False, True])),
            "count": (("time",), np.arange(n, dtype="i2")),
        },
        coords={"time": times, "x": [10, 20, 30]},
        attrs={"title": "test", "history": "made here"},
    )


@pytest.mark.parametrize("fmt", [2, 3])
def test_xarray(tmp_path, fmt):
    path = tmp_path / "x.zarr"
    store = ValidatingStore(path)
    dataset("2000-01-01", 4).to_zarr(store, mode="w", zarr_format=fmt, consolidated=True)
    # append along time: resizes existing arrays, then writes new chunks
    dataset("2000-01-05", 3)[["temp", "count"]].to_zarr(store, append_dim="time", consolidated=True)
    # a separate group with explicit encodings
    ds = dataset("2010-01-01", 5)
    enc = {"temp": {"chunks": (2, 2)}, "count": {"chunks": (2,)}}
    ds.to_zarr(store, group="sub/g", mode="w", zarr_format=fmt, consolidated=True, encoding=enc)
    assert store.writes > 40
    assert store.problems == [], "\n".join(map(str, store.problems))
    assert_clean(str(path))
    back = xr.open_zarr(path, consolidated=True)
    assert back.sizes["time"] == 7


# --- tensorstore -----------------------------------------------------------------------------


def ts_write(path: str, spec: dict, data) -> None:
    # Schema options (dtype, shape, chunk_layout) go as keyword arguments, the rest in the spec.
    schema = {k: spec.pop(k) for k in ("dtype", "shape", "chunk_layout") if k in spec}
    spec = {"kvstore": {"driver": "file", "path": path}, **spec}
    arr = ts.open(spec, create=True, delete_existing=True, **schema).result()
    arr[...] = np.asarray(data).astype(arr.dtype.numpy_dtype)


def assert_lock_files_pass(root: str) -> None:
    """tensorstore writes every key as ``<key>.__lock`` first, then renames it: those are
    committed in the array's folder too and must pass."""
    get = dir_getter(root)
    for key in dir_keys(root):
        lock = key + ".__lock"
        found = validate_data_key(lock, get) + validate_name(lock)
        assert found == [], found


def test_tensorstore_zarr(tmp_path):
    r = np.arange(30, dtype="f8").reshape(5, 6)
    root = str(tmp_path / "t.zarr")
    cases = {
        "default": (
            {"dtype": "float32", "shape": [5, 6], "chunk_layout": ts.ChunkLayout(read_chunk_shape=[2, 3])},
            r,
        ),
        "int16": ({"dtype": "int16", "shape": [5, 6]}, r.astype("i2")),
        "bool": ({"dtype": "bool", "shape": [5, 6]}, r > 3),
        "complex": ({"dtype": "complex64", "shape": [5, 6]}, r * 1j),
        "nested": (
            {
                "metadata": {
                    "shape": [5, 6],
                    "chunks": [2, 2],
                    "dtype": ">f8",
                    "order": "F",
                    "fill_value": "NaN",
                    "dimension_separator": "/",
                    "compressor": {"id": "zlib", "level": 1},
                }
            },
            r,
        ),
        "bz2": (
            {
                "metadata": {
                    "shape": [5, 6],
                    "chunks": [3, 3],
                    "dtype": "<u2",
                    "compressor": {"id": "bz2", "level": 3},
                }
            },
            1,
        ),
        "raw": (
            {
                "metadata": {
                    "shape": [5, 6],
                    "chunks": [3, 3],
                    "dtype": "|u1",
                    "compressor": None,
                    "fill_value": 9,
                }
            },
            1,
        ),
        "bytes": (
            {"metadata": {"shape": [3], "chunks": [2], "dtype": "|S4", "fill_value": "YWJjZA=="}},
            np.full((3, 4), b"x"),
        ),
        "struct": (
            {
                "metadata": {
                    "shape": [3],
                    "chunks": [2],
                    "dtype": [["a", "<i4"], ["b", "<f4", [2]]],
                    "fill_value": None,
                },
                "field": "a",
            },
            np.array([1, 2, 3]),
        ),
        "scalar": ({"metadata": {"shape": [], "chunks": [], "dtype": "<i8", "fill_value": 0}}, 5),
    }
    for name, (spec, data) in cases.items():
        ts_write(f"{root}/{name}", {"driver": "zarr", **spec}, data)
    assert_clean(root)
    assert_lock_files_pass(root)


def test_tensorstore_zarr3(tmp_path):
    r = np.arange(64, dtype="f8").reshape(8, 8)
    root = str(tmp_path / "t3.zarr")
    bytes_le = {"name": "bytes", "configuration": {"endian": "little"}}

    def meta(codecs, dtype="float64", **extra):
        return {
            "metadata": {
                "shape": [8, 8],
                "data_type": dtype,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
                "codecs": codecs,
                **extra,
            }
        }

    cases = {
        "layout": (
            {"dtype": "float32", "shape": [8, 8], "chunk_layout": ts.ChunkLayout(read_chunk_shape=[2, 4])},
            r,
        ),
        "plain": (meta([bytes_le]), r),
        "gzip": (meta([bytes_le, {"name": "gzip", "configuration": {"level": 1}}]), r),
        "zstd_crc": (
            meta([bytes_le, {"name": "zstd", "configuration": {"level": 1}}, {"name": "crc32c"}]),
            r,
        ),
        "blosc": (
            meta(
                [
                    {"name": "transpose", "configuration": {"order": [1, 0]}},
                    {"name": "bytes", "configuration": {"endian": "big"}},
                    {
                        "name": "blosc",
                        "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 8},
                    },
                ],
                chunk_key_encoding={"name": "v2", "configuration": {"separator": "."}},
                dimension_names=["y", "x"],
            ),
            r,
        ),
        "sharded": (
            meta(
                [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [2, 2],
                            "codecs": [bytes_le, {"name": "gzip", "configuration": {"level": 2}}],
                            "index_codecs": [bytes_le, {"name": "crc32c"}],
                            "index_location": "start",
                        },
                    }
                ]
            ),
            r,
        ),
        "bool": (meta([{"name": "bytes"}], dtype="bool", fill_value=True), r > 5),
        "int8": (meta([{"name": "bytes"}], dtype="int8", fill_value=-3), r.astype("i1")),
        "complex": (meta([bytes_le], dtype="complex128", fill_value=[0, "NaN"]), r * 1j),
        "dots": (
            meta([bytes_le], chunk_key_encoding={"name": "default", "configuration": {"separator": "."}}),
            r,
        ),
    }
    for name, (spec, data) in cases.items():
        ts_write(f"{root}/{name}", {"driver": "zarr3", **spec}, data)
    assert_clean(root)
    assert_lock_files_pass(root)


# --- zarr-python 2.18 (in its own venv) ------------------------------------------------------

ZARR2_SCRIPT = r"""
import sys, numpy as np, numcodecs, zarr
path = sys.argv[1]
store = zarr.DirectoryStore(path)
root = zarr.group(store, overwrite=True)
root.attrs["title"] = "made by zarr 2"
root.attrs["nan"] = float("nan")
g = root.create_group("a/b")
r = np.arange(20.0).reshape(4, 5)
g.create_dataset("f8", data=r, chunks=(2, 2), fill_value=np.nan)
g.create_dataset("i4", data=r.astype("i4"), chunks=(3, 3), fill_value=-1, compressor=numcodecs.Zlib(1))
strings = np.array(["a", "bb", None], dtype=object)
g.create_dataset("obj", data=strings, object_codec=numcodecs.VLenUTF8(), chunks=(2,))
g.create_dataset("json", data=strings, object_codec=numcodecs.JSON(), chunks=(2,))
g.create_dataset("s", data=np.array([b"a", b"bb"]), chunks=(1,), fill_value=b"z")
g.create_dataset("u", data=np.array(["a", "bb"]), chunks=(1,), fill_value="q")
g.create_dataset("dt", data=np.array(["2000-01-01", "NaT"], dtype="M8[ns]"), chunks=(1,))
g.create_dataset("struct", data=np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]), chunks=(2,))
g.create_dataset("scalar", data=np.array(4.5))
g.create_dataset("forder", data=r, chunks=(2, 2), order="F", filters=[numcodecs.Delta(dtype="<f8")])
g.create_dataset("be", data=r.astype(">f4"), chunks=(2, 2), compressor=None)
g.create_dataset("cat", data=np.array(["x", "y", "x"], dtype=object), chunks=(2,),
                 filters=[numcodecs.Categorize(["x", "y"], dtype=object)], object_codec=numcodecs.VLenUTF8())
nested = zarr.open_array(path + "/nested", mode="w", shape=(4, 5), chunks=(2, 2), dimension_separator="/")
nested[...] = r
g["f8"].resize(6, 5)
g["f8"][4:] = 7
zarr.consolidate_metadata(store)
"""


def test_zarr_python_2(tmp_path, zarr2_python):
    from zarr2env import run

    path = str(tmp_path / "z2.zarr")
    run(zarr2_python, ZARR2_SCRIPT, path)
    assert_clean(path)
    # our .zmetadata serialisation is byte-identical to zarr-python 2's
    get = dir_getter(path)
    items = [(k, get(k)) for k in dir_keys(path) if k != ".zmetadata"]
    with open(os.path.join(path, ".zmetadata"), "rb") as f:
        theirs = f.read()
    assert dumps_consolidated(build_consolidated(items)) == theirs
    assert json.loads(theirs)["zarr_consolidated_format"] == 1

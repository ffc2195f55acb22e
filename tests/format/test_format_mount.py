"""The format layer through real mounts of every driver: validation (``-o validate=``), the
decoded view (``-o view=decoded``), live consolidated metadata (``-o consolidate=``) and
``zarrfs check``.

Everything goes through the ``zarrfs`` command line and the kernel, as a user would: errors are
the errno a system call returns, stored values are read back both through the mount and with
``open_driver`` on the database URL, and the daemon's log file is read for the lines it wrote.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numcodecs
import numpy as np
import pandas as pd
import pytest
import tensorstore as ts
import xarray as xr
import zarr
import zarr.codecs
from format_cases import V1_META, V2_ARRAY, V3_ARRAY, with_
from mounting import needs_fuse, stored

from zarrfs.backends import open_driver

pytestmark = [
    *needs_fuse,
    # zarr 3 warns that consolidated metadata and some v2 dtypes are not in the spec (yet)
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


# --- helpers ---------------------------------------------------------------------------------


def j(doc) -> bytes:
    return json.dumps(doc).encode()


def put(root: Path, key: str, value: bytes) -> None:
    """Write ``value`` at ``key`` through the mount (folders made as needed)."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(value)


def mount_value(root: Path, key: str) -> bytes | None:
    """The value at ``key`` as the mount shows it (None when there is no such file)."""
    try:
        return (root / key).read_bytes()
    except FileNotFoundError:
        return None


def assert_einval(call, *args) -> None:
    with pytest.raises(OSError) as info:
        call(*args)
    assert info.value.errno == errno.EINVAL, info.value


def write_in_place(path: Path, data: bytes) -> None:
    """open/write/close; a refused commit must fail at close(), not before."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, data) == len(data)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)


class LogCursor:
    """The lines a daemon logged since the last call of :meth:`new` (the mounts log at debug
    level; debug lines, such as numcodecs registering codecs, are left out)."""

    def __init__(self, mount) -> None:
        self.mount = mount
        self.seen = len(mount.log_text())

    def new(self) -> list[str]:
        text = self.mount.log_text()
        lines = [ln for ln in text[self.seen :].splitlines() if ln.strip() and " DEBUG " not in ln]
        self.seen = len(text)
        return lines


def temp_names(key: str) -> tuple[str, str]:
    """A temporary file beside ``key`` that the daemon holds until its rename (zarr-python's
    ``*.partial``), and one it stores at close (rsync's ``.<name>.XXXXXX``)."""
    folder, _, name = key.rpartition("/")
    prefix = folder + "/" if folder else ""
    return (
        f"{prefix}{name.lstrip('.') or 'x'}.{uuid.uuid4().hex}.partial",
        f"{prefix}.{name}.{uuid.uuid4().hex[:6]}",
    )


# --- 1. validation through mounts --------------------------------------------------------------

V2_CHUNKS = {"v2/chunks/.zarray": j(V2_ARRAY)}  # shape (10, 20), chunks (4, 8): a 3 x 3 grid
V2_NESTED = {"v2/nested/.zarray": j(with_(V2_ARRAY, dimension_separator="/"))}
V3_CHUNKS = {"v3/chunks/zarr.json": j(V3_ARRAY)}  # keys c/i/j, a 3 x 3 grid
CHUNK = bytes(range(200))

# (rule, key refused, value refused, key accepted, value accepted, keys to write first)
REFUSED = [
    ("zarray.shape-chunks-length", "v2/a1/.zarray", j(with_(V2_ARRAY, chunks=[4])), None, j(V2_ARRAY), {}),
    ("zarray.chunks", "v2/a2/.zarray", j(with_(V2_ARRAY, chunks=[0, 8])), None,
     j(with_(V2_ARRAY, chunks=[1, 1])), {}),
    ("zarray.dtype", "v2/a3/.zarray", j(with_(V2_ARRAY, dtype="f8")), None, j(V2_ARRAY), {}),
    ("zarray.compressor", "v2/a4/.zarray", j(with_(V2_ARRAY, compressor={"id": "zlib", "level": 42})), None,
     j(with_(V2_ARRAY, compressor={"id": "zlib", "level": 9})), {}),
    ("zarray.compressor", "v2/a5/.zarray", j(with_(V2_ARRAY, compressor={"level": 1})), None,
     j(with_(V2_ARRAY, compressor=None)), {}),
    ("zarray.fill-value", "v2/a6/.zarray", j(with_(V2_ARRAY, fill_value="abc")), None,
     j(with_(V2_ARRAY, fill_value="-Infinity")), {}),
    ("zarray.fill-value", "v2/a7/.zarray", j(with_(V2_ARRAY, dtype="<i4", fill_value=1.5)), None,
     j(with_(V2_ARRAY, dtype="<i4", fill_value=-2)), {}),
    ("zgroup.keys", "g/.zgroup", j({"zarr_format": 2, "attributes": {}}), None, j({"zarr_format": 2}), {}),
    ("zgroup.zarr-format", "g2/.zgroup", j({"zarr_format": 3}), None, j({"zarr_format": 2}), {}),
    ("zattrs.not-object", "g/.zattrs", j([1, 2]), None, j({"list": [1, 2]}), {}),
    ("zattrs.array-dimensions-length", "v2/dims/.zattrs", j({"_ARRAY_DIMENSIONS": ["x"]}), None,
     j({"_ARRAY_DIMENSIONS": ["y", "x"]}), {"v2/dims/.zarray": j(V2_ARRAY)}),
    ("zmetadata.format", "g/.zmetadata", j({"metadata": {}, "zarr_consolidated_format": 2}), None,
     j({"metadata": {".zgroup": {"zarr_format": 2}}, "zarr_consolidated_format": 1}), {}),
    ("zmetadata.zarray.shape-chunks-length", "g3/.zmetadata",
     j({"metadata": {"a/.zarray": with_(V2_ARRAY, chunks=[4])}, "zarr_consolidated_format": 1}), None,
     j({"metadata": {"a/.zarray": V2_ARRAY}, "zarr_consolidated_format": 1}), {}),
    ("zarr.json.codecs-array-bytes", "v3/a/zarr.json",
     j(with_(V3_ARRAY, codecs=[{"name": "bytes", "configuration": {"endian": "little"}}] * 2)), None,
     j(V3_ARRAY), {}),
    ("zarr.json.node-type", "v3/b/zarr.json", j({"zarr_format": 3, "node_type": "folder"}), None,
     j({"zarr_format": 3, "node_type": "group"}), {}),
    ("zarr.json.unknown-key", "v3/c/zarr.json", j(with_(V3_ARRAY, foo={"bar": 1})), None,
     j(with_(V3_ARRAY, foo={"bar": 1, "must_understand": False})), {}),
    ("chunk-key.dimensions", "v2/chunks/0.0.0", CHUNK, "v2/chunks/0.0", CHUNK, V2_CHUNKS),
    ("chunk-key.out-of-grid", "v2/chunks/3.0", CHUNK, "v2/chunks/2.2", CHUNK, V2_CHUNKS),
    ("chunk-key.not-integer", "v2/chunks/x.1", CHUNK, "v2/chunks/1.1", CHUNK, V2_CHUNKS),
    ("chunk-key.not-integer", "v2/chunks/01.1", CHUNK, "v2/chunks/1.2", CHUNK, V2_CHUNKS),
    ("chunk-key.separator", "v2/nested/0.0", CHUNK, "v2/nested/0/0", CHUNK, V2_NESTED),
    ("chunk-key.dimensions", "v3/chunks/c/0/0/0", CHUNK, "v3/chunks/c/0/1", CHUNK, V3_CHUNKS),
    ("chunk-key.out-of-grid", "v3/chunks/c/0/3", CHUNK, "v3/chunks/c/2/2", CHUNK, V3_CHUNKS),
    # v1 last: a root "meta" makes the root a v1 array, and nothing else may live there then
    ("meta.compression", "meta", j(with_(V1_META, compression="nope")), None, j(V1_META), {}),
]  # fmt: skip


def refuse_everywhere(m, log: LogCursor, case: tuple) -> None:
    """One refused case and its passing neighbour through the strict mount ``m``: refused by
    link, by open/write/close and by rename, nothing stored, one log line per refusal."""
    root = m.path
    rule, bad_key, bad, good_key, good, context = case
    good_key = good_key or bad_key
    for key, value in context.items():
        if mount_value(root, key) is None:
            put(root, key, value)
    (root / bad_key).parent.mkdir(parents=True, exist_ok=True)
    (root / good_key).parent.mkdir(parents=True, exist_ok=True)
    log.new()
    refusals = 0

    def by_rename_or_link(how: str) -> None:
        nonlocal refusals
        held, rsync = temp_names(bad_key)
        for tmp in (held, rsync):
            write_in_place(root / tmp, bad)  # a temporary name is never refused
            if how == "link":
                assert_einval(os.link, root / tmp, root / bad_key)
            else:
                assert_einval(os.replace if tmp == held else os.rename, root / tmp, root / bad_key)
            assert (root / tmp).read_bytes() == bad  # the source is still there
            os.unlink(root / tmp)
            refusals += 1

    # link needs a new name: refused while the key is free
    by_rename_or_link("link")
    assert mount_value(root, bad_key) is None and stored(m.url, bad_key) is None, (rule, bad_key)
    lines = log.new()
    # the neighbouring case passes (and is the previous value below)
    write_in_place(root / good_key, good)
    assert mount_value(root, good_key) == good and stored(m.url, good_key) == good, (rule, good_key)
    assert log.new() == [], (rule, good_key)
    previous = good if good_key == bad_key else None
    # open/write/close: EINVAL at close, the previous value stays
    assert_einval(write_in_place, root / bad_key, bad)
    refusals += 1
    assert mount_value(root, bad_key) == previous, (rule, bad_key)
    assert stored(m.url, bad_key) == previous, (rule, bad_key)
    # a temporary file renamed onto the key: EINVAL at rename, the previous value stays
    by_rename_or_link("rename")
    assert mount_value(root, bad_key) == previous, (rule, bad_key)
    assert stored(m.url, bad_key) == previous, (rule, bad_key)
    # one log line per refusal, naming the key and the rule
    lines += log.new()
    assert len(lines) == refusals, (rule, lines)
    for line in lines:
        assert " ERROR " in line and "EINVAL" in line and f"({bad_key}: {rule}: " in line, line


def test_strict_refuses_at_close_rename_and_link(db_url, mount_factory):
    # validate=strict is the default; consolidate=off stores the documents as written (with
    # it on, a consolidated document is stored as the hierarchy holds it: tested apart)
    m = mount_factory(db_url, ["create", "consolidate=off"])
    root = m.path
    log = LogCursor(m)
    v1_case = REFUSED[-1]
    for case in REFUSED[:-1]:
        refuse_everywhere(m, log, case)

    # a codec that is not installed here is not the writer's fault: stored, with a warning
    unknown = j(with_(V2_ARRAY, compressor={"id": "no-such-codec", "level": 1}))
    write_in_place(root / "v2/a1/.zarray", unknown)
    assert stored(m.url, "v2/a1/.zarray") == unknown
    lines = log.new()
    assert len(lines) == 1 and " WARNING " in lines[0], lines
    assert "warning: v2/a1/.zarray: zarray.compressor: " in lines[0], lines

    # a folder or file name with a backslash inside a Zarr node can never be reached by a
    # client (zarr-python 2 reads it as '/'); outside one it is a name like any other
    os.mkdir(root / "v2/x\\y")
    assert stored(m.url, "v2/x\\y/.zgroup") is None and "x\\y" in os.listdir(root / "v2")
    os.rmdir(root / "v2/x\\y")
    for bad_name, good_name in (("v2/a1/x\\y", "v2/x_y"), ("v2/a1/0\\0", "v2/chunks_0.0")):
        assert_einval(os.mkdir, root / bad_name)
        assert_einval(open, root / bad_name, "wb")  # refused when created, before any write
        held, rsync = temp_names("v2/tmp")
        for tmp in (held, rsync):
            write_in_place(root / tmp, b"data")
            assert_einval(os.rename, root / tmp, root / bad_name)
            assert_einval(os.link, root / tmp, root / bad_name)
            os.unlink(root / tmp)
        assert bad_name.rpartition("/")[2] not in os.listdir(root / "v2/a1")
        assert stored(m.url, bad_name) is None
        lines = log.new()
        assert len(lines) == 6, lines
        assert all("name.backslash" in ln and "EINVAL" in ln for ln in lines), lines
        os.mkdir(root / good_name)
        write_in_place(root / good_name / "f", b"data")
        assert stored(m.url, f"{good_name}/f") == b"data"
        assert log.new() == []

    # temporary files in an array folder are not chunk keys and are never refused
    arr = root / "v2/chunks"
    temps = [
        f"0.0.{uuid.uuid4().hex}.partial",  # zarr-python
        "0.2.__lock",  # tensorstore
        ".0.0.Ab12Cd",  # rsync
        ".nfs0000000012345",
        "tmpab_12cde",  # tempfile.mkstemp
        "0.0~",
        "0.0.tmp",
    ]
    for name in temps:
        write_in_place(arr / name, CHUNK)
        assert (arr / name).read_bytes() == CHUNK
    assert set(temps) <= set(os.listdir(arr))
    assert stored(m.url, "v2/chunks/.0.0.Ab12Cd") == CHUNK  # stored at close, as any file
    os.replace(arr / temps[0], arr / "2.0")
    os.replace(arr / temps[1], arr / "0.2")
    assert stored(m.url, "v2/chunks/2.0") == CHUNK and stored(m.url, "v2/chunks/0.2") == CHUNK
    for name in temps[2:]:
        os.unlink(arr / name)
    assert log.new() == []

    # v1 last: a root "meta" makes the whole store one v1 array
    refuse_everywhere(m, log, v1_case)


def test_warn_stores_and_logs_off_stores_silently(db_url, mount_factory):
    warn = mount_factory(db_url, ["create", "validate=warn"], name="warn")
    put(warn.path, "a/.zarray", j(V2_ARRAY))
    log = LogCursor(warn)
    bad_meta = j(with_(V2_ARRAY, chunks=[4]))
    cases = [
        ("w/.zarray", bad_meta, "zarray.shape-chunks-length"),
        ("a/3.0", CHUNK, "chunk-key.out-of-grid"),
        ("a/.zattrs", j({"_ARRAY_DIMENSIONS": ["x"]}), "zattrs.array-dimensions-length"),
    ]
    for key, value, rule in cases:
        put(warn.path, key, value)
        assert stored(warn.url, key) == value
        assert (warn.path / key).read_bytes() == value
        lines = log.new()
        assert len(lines) == 1 and " WARNING " in lines[0], lines
        assert f"error: {key}: {rule}: " in lines[0], lines
    # a rename onto the key and a bad name are not refused either
    os.mkdir(warn.path / "w2")
    write_in_place(warn.path / "w2/x.partial", bad_meta)
    os.replace(warn.path / "w2/x.partial", warn.path / "w2/.zarray")
    os.mkdir(warn.path / "a/w\\b")  # inside a Zarr node: zarr-python 2 would read a/w/b
    assert stored(warn.url, "w2/.zarray") == bad_meta
    assert "w\\b" in os.listdir(warn.path / "a")
    lines = log.new()
    assert len(lines) == 2, lines
    assert "error: w2/.zarray: zarray.shape-chunks-length: " in lines[0], lines
    assert "name.backslash" in lines[1], lines

    off = mount_factory(db_url, ["validate=off"], name="off")
    log = LogCursor(off)
    for key, value in (("o/.zarray", bad_meta), ("a/9.9", CHUNK), ("o/.zgroup", b"[]")):
        put(off.path, key, value)
        assert stored(off.url, key) == value
        assert (off.path / key).read_bytes() == value
    os.mkdir(off.path / "o\\b")
    assert log.new() == []


# --- 2. real clients are never refused in strict mode -----------------------------------------


def sample_dataset() -> xr.Dataset:
    """Floats with NaN, datetimes, timedeltas, fixed and variable-length strings."""
    temp = np.linspace(250.0, 300.0, 6 * 4).reshape(6, 4)
    temp[2, 1] = np.nan
    return xr.Dataset(
        {
            "temp": (("time", "x"), temp, {"units": "K"}),
            "name": (("x",), np.array(["alpha", "béta", "", "delta-δ"], dtype=object)),
            "code": (("x",), np.array(["a", "bb", "ccc", "d"], dtype="<U3")),
            "lag": (("time",), pd.to_timedelta(np.arange(6), unit="h")),
        },
        coords={"time": pd.date_range("2024-01-01", periods=6, freq="D"), "x": [10, 20, 30, 40]},
        attrs={"title": "zarrfs ✓"},
    )


def test_real_clients_are_not_refused(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])  # strict by default
    root = m.path
    model = np.arange(23 * 17, dtype="f8").reshape(23, 17) / 3
    model[1, 2] = np.nan
    for fmt in (2, 3):
        g = zarr.open_group(root / f"zarr{fmt}", mode="w", zarr_format=fmt, attributes={"n": 1})
        comps = (
            [numcodecs.Blosc(cname="zstd", clevel=3), numcodecs.Zstd(level=1)]
            if fmt == 2
            else [zarr.codecs.BloscCodec(cname="lz4"), zarr.codecs.ZstdCodec(level=1)]
        )
        g.create_array("blosc", data=model, chunks=(5, 4), compressors=comps[0], fill_value=np.nan)
        g.create_group("sub").create_array(
            "zstd", data=model.astype("i4"), chunks=(6, 6), compressors=comps[1], fill_value=-1
        )
        g.create_array(
            "nested",
            data=model.astype("u2"),
            chunks=(10, 10),
            chunk_key_encoding={"name": "v2", "separator": "/"},
        )
        g.attrs["n"] = 2
        if fmt == 3:
            s = g.create_array("sharded", shape=model.shape, chunks=(5, 5), shards=(10, 10), dtype="f8")
            s[:] = model
        zarr.consolidate_metadata(root / f"zarr{fmt}")
        np.testing.assert_array_equal(zarr.open_group(root / f"zarr{fmt}", mode="r")["blosc"][:], model)
    ds = sample_dataset()
    for fmt in (2, 3):
        path = root / f"xr{fmt}"
        ds.to_zarr(path, consolidated=True, zarr_format=fmt, encoding={"temp": {"chunks": (4, 2)}})
        later = ds.assign_coords(time=ds.time + np.timedelta64(6, "D"))
        later.to_zarr(path, append_dim="time", consolidated=True)
        both = xr.concat([ds, later], dim="time", data_vars="minimal")
        with xr.open_zarr(path, consolidated=True) as out:
            for name in ("temp", "lag", "time", "x"):
                xr.testing.assert_identical(out[name].load(), both[name])
            assert [str(v) for v in out["name"].values] == ["alpha", "béta", "", "delta-δ"]
            assert out["code"].values.tolist() == ["a", "bb", "ccc", "d"]
    ts_zarr2 = {"shape": [23, 17], "chunks": [5, 5], "dtype": "<f8", "compressor": {"id": "zstd", "level": 1}}
    inner = {"chunk_shape": [5, 5], "codecs": [{"name": "bytes"}, {"name": "zstd"}]}
    ts_zarr3 = {
        "shape": [23, 17],
        "data_type": "float64",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [10, 10]}},
        "codecs": [{"name": "sharding_indexed", "configuration": inner}],
    }
    for driver, metadata in (("zarr", ts_zarr2), ("zarr3", ts_zarr3)):
        t = ts.open(
            {
                "driver": driver,
                "kvstore": {"driver": "file", "path": f"{root}/ts/{driver}/"},
                "metadata": metadata,
            },
            create=True,
        ).result()
        t[...] = model
        t[0:5, 0:5] = 1
    expect = model.copy()
    expect[0:5, 0:5] = 1
    np.testing.assert_array_equal(zarr.open_array(root / "ts/zarr", mode="r")[:], expect)
    np.testing.assert_array_equal(zarr.open_array(root / "ts/zarr3", mode="r")[:], expect)
    text = m.log_text()
    assert "mounting" in text  # the log is there
    assert "EINVAL" not in text, text[-3000:]
    assert " ERROR " not in text, text[-3000:]


# --- 3. the decoded view -------------------------------------------------------------------------

# name -> (create_array arguments, numpy order of the decoded bytes)
DECODED_ARRAYS = {
    "v2blosc": (
        dict(dtype="f8", fill_value=np.nan, zarr_format=2, compressors=numcodecs.Blosc(cname="zstd")),
        "C",
    ),
    "v2zstdF": (
        dict(dtype="i4", fill_value=-7, zarr_format=2, compressors=numcodecs.Zstd(level=2), order="F"),
        "F",
    ),
    "v2nested": (
        dict(
            dtype=">u2",
            fill_value=9,
            zarr_format=2,
            compressors=numcodecs.GZip(level=1),
            chunk_key_encoding={"name": "v2", "separator": "/"},
        ),
        "C",
    ),
    "v3zstd": (
        dict(dtype="f4", fill_value=-1.5, zarr_format=3, compressors=zarr.codecs.ZstdCodec(level=1)),
        "C",
    ),
    "v3blosc": (
        dict(
            dtype="i2",
            fill_value=3,
            zarr_format=3,
            compressors=zarr.codecs.BloscCodec(cname="lz4"),
            chunk_key_encoding={"name": "default", "separator": "."},
        ),
        "C",
    ),
    # a transpose codec: the decoded view shows the chunk in C order of the array's axes
    "v3transpose": (
        dict(
            dtype="u4",
            fill_value=0,
            zarr_format=3,
            filters=zarr.codecs.TransposeCodec(order=(1, 0)),
            compressors=zarr.codecs.GzipCodec(level=1),
        ),
        "C",
    ),
}
SHAPE, CHUNKS = (11, 10), (4, 3)  # a 3 x 4 grid with partial edge chunks


def decoded_model(name: str) -> np.ndarray:
    dtype = np.dtype(DECODED_ARRAYS[name][0]["dtype"])
    data = (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 97 + 11).astype(dtype)
    fill = DECODED_ARRAYS[name][0]["fill_value"]
    data[4:8, 3:6] = fill  # chunk (1, 1) is all fill: zarr does not write it
    return data


def expected_chunk(data: np.ndarray, fill, coords: tuple[int, int]) -> np.ndarray:
    """The full chunk at ``coords``: the array's values, fill beyond the array's edge."""
    out = np.full(CHUNKS, fill, dtype=data.dtype)
    sl = tuple(slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, CHUNKS, SHAPE, strict=True))
    part = data[sl]
    out[: part.shape[0], : part.shape[1]] = part
    return out


def chunk_rel(array, coords: tuple[int, ...]) -> str:
    """The chunk key of ``coords`` relative to the array's folder, as zarr spells it."""
    meta = array.metadata
    if meta.zarr_format == 2:
        return (meta.dimension_separator or ".").join(map(str, coords))
    return meta.chunk_key_encoding.encode_chunk_key(coords)


def test_decoded_view_reads_and_writes_raw_chunks(db_url, mount_factory, tmp_path):
    # both mounts live at once; cache_timeout=0 because each sees the other's writes as those
    # of another writer (which show within cache_timeout)
    raw = mount_factory(db_url, ["create", "cache_timeout=0"], name="raw")
    arrays = {}
    for name, (kwargs, _) in DECODED_ARRAYS.items():
        a = zarr.create_array(raw.path / "dv" / name, shape=SHAPE, chunks=CHUNKS, **kwargs)
        a[:] = decoded_model(name)
        a.attrs["name"] = name
        arrays[name] = a
    strings = zarr.create_array(raw.path / "dv/strings", shape=(12,), chunks=(5,), zarr_format=2, dtype=str)
    strings[:] = np.array(["a", "bcd", "", "é"] * 3, dtype=object)
    strings3 = zarr.create_array(raw.path / "dv/strings3", shape=(8,), chunks=(3,), zarr_format=3, dtype=str)
    strings3[:] = np.array(["x", "yz"] * 4, dtype=object)
    zarr.create_array(raw.path / "dv/sharded", data=decoded_model("v3zstd"), chunks=(2, 2), shards=(4, 4))
    dec = mount_factory(db_url, ["view=decoded", "cache_timeout=0"], name="decoded")
    log = LogCursor(dec)
    nbytes_of = {}

    # every chunk: full size, decoded content, fill beyond the edge; dd copies the same bytes
    for name, (kwargs, order) in DECODED_ARRAYS.items():
        a = arrays[name]
        dtype = np.dtype(kwargs["dtype"])
        if kwargs["zarr_format"] == 3:
            dtype = dtype.newbyteorder("<")  # the bytes codec's order (little-endian by default)
        nbytes = int(np.prod(CHUNKS)) * dtype.itemsize
        nbytes_of[name] = nbytes
        data = decoded_model(name)
        for i in range(3):
            for k in range(4):
                rel = chunk_rel(a, (i, k))
                path = dec.path / "dv" / name / rel
                if (i, k) == (1, 1):  # all fill: never written
                    assert not (raw.path / "dv" / name / rel).exists()
                    with pytest.raises(FileNotFoundError):
                        np.fromfile(path, dtype=dtype)
                    continue
                assert os.stat(path).st_size == nbytes, (name, rel)
                got = np.fromfile(path, dtype=dtype).reshape(CHUNKS, order=order)
                assert (raw.path / "dv" / name / rel).read_bytes() != got.tobytes(order=order)
                want = expected_chunk(data, kwargs["fill_value"], (i, k))
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {rel}")
        edge = dec.path / "dv" / name / chunk_rel(a, (2, 3))
        out = tmp_path / f"{name}.dd"
        subprocess.run(["dd", f"if={edge}", f"of={out}", "bs=7", "status=none"], check=True)
        assert out.read_bytes() == edge.read_bytes() and len(out.read_bytes()) == nbytes

    # metadata looks the same in both views
    for rel in ("dv/v2blosc/.zarray", "dv/v2blosc/.zattrs", "dv/v3zstd/zarr.json", "dv/strings/.zarray"):
        assert (dec.path / rel).read_bytes() == (raw.path / rel).read_bytes()
        assert os.stat(dec.path / rel).st_size == os.stat(raw.path / rel).st_size

    # arrays without a raw chunk layout (variable-length strings, sharding) are refused in the
    # decoded view, reading and writing alike, with the reason in the log; listings and sizes
    # still work (the stored size), and the raw view is untouched
    for rel in ("dv/strings/0", "dv/strings/2", "dv/strings3/c/0", "dv/sharded/c/0/0"):
        assert os.stat(dec.path / rel).st_size == len(stored(db_url, rel))
        with pytest.raises(OSError) as info:
            (dec.path / rel).read_bytes()
        assert info.value.errno == errno.EINVAL
        array = rel.rsplit("/c/", 1)[0] if "/c/" in rel else rel.rsplit("/", 1)[0]
        assert any(array in line and "EINVAL" in line for line in log.new()), rel
    before = stored(db_url, "dv/strings/1")
    with pytest.raises(OSError) as info:
        (dec.path / "dv/strings/1").write_bytes(stored(db_url, "dv/strings/0"))
    assert info.value.errno == errno.EINVAL
    assert any("dv/strings" in line for line in log.new())
    assert stored(db_url, "dv/strings/1") == before  # nothing stored

    # writing raw bytes: numpy tofile (whole chunk), dd conv=notrunc seek= (part of one)
    for name, (kwargs, order) in DECODED_ARRAYS.items():
        a = arrays[name]
        dtype = np.dtype(kwargs["dtype"])
        if kwargs["zarr_format"] == 3:
            dtype = dtype.newbyteorder("<")
        model = decoded_model(name)
        new = (np.arange(np.prod(CHUNKS)).reshape(CHUNKS) + 100).astype(dtype)
        new.ravel(order=order).tofile(dec.path / "dv" / name / chunk_rel(a, (0, 1)))
        model[0:4, 3:6] = new
        patch = np.array([5, 6], dtype=dtype)  # raw positions 1 and 2 of chunk (2, 3)
        src = tmp_path / f"{name}.patch"
        patch.tofile(src)
        target = dec.path / "dv" / name / chunk_rel(a, (2, 3))
        subprocess.run(
            [
                "dd",
                f"if={src}",
                f"of={target}",
                f"bs={dtype.itemsize}",
                "seek=1",
                "conv=notrunc",
                "status=none",
            ],
            check=True,
        )
        for value, pos in zip(patch, (1, 2), strict=True):
            r, c = np.unravel_index(pos, CHUNKS, order=order)
            if 8 + r < SHAPE[0] and 9 + c < SHAPE[1]:
                model[8 + r, 9 + c] = value
        assert os.stat(target).st_size == nbytes_of[name]

        # raw bytes written to a temporary file, then renamed onto a chunk, are encoded too
        # (zarr-python's held *.partial, and rsync's dot-file stored at close)
        folder = dec.path / "dv" / name
        for coords, tmp, value in (((1, 0), f"{uuid.uuid4().hex}.partial", 77), ((2, 0), ".c.Ab12Cd", 88)):
            chunk = folder / chunk_rel(a, coords)
            np.full(CHUNKS, value, dtype=dtype).tofile(folder / tmp)
            os.replace(folder / tmp, chunk)
            assert os.stat(chunk).st_size == nbytes_of[name]
            assert (chunk.read_bytes()) == np.full(CHUNKS, value, dtype=dtype).tobytes()
            rows, cols = (slice(c * n, (c + 1) * n) for c, n in zip(coords, CHUNKS, strict=True))
            model[rows, cols] = value
        (folder / ".c.Ab12Cd").write_bytes(b"\0" * 3)
        assert_einval(os.rename, folder / ".c.Ab12Cd", folder / chunk_rel(a, (2, 0)))
        os.unlink(folder / ".c.Ab12Cd")
        lines = log.new()
        assert len(lines) == 1 and "EINVAL" in lines[0] and ": chunk.raw-size: " in lines[0], lines

        # a write of the wrong size: EINVAL at close, nothing changes
        before = stored(db_url, f"dv/{name}/{chunk_rel(a, (0, 0))}")
        assert_einval(
            write_in_place, dec.path / "dv" / name / chunk_rel(a, (0, 0)), b"\0" * (nbytes_of[name] - 1)
        )
        assert stored(db_url, f"dv/{name}/{chunk_rel(a, (0, 0))}") == before
        lines = log.new()
        assert len(lines) == 1 and "EINVAL" in lines[0] and ": chunk.raw-size: " in lines[0], lines

        # a missing chunk: ENOENT, then created at full size it becomes an encoded chunk
        missing = dec.path / "dv" / name / chunk_rel(a, (1, 1))
        with pytest.raises(FileNotFoundError):
            missing.read_bytes()
        (missing.parent).mkdir(parents=True, exist_ok=True)
        fresh = np.full(CHUNKS, 42, dtype=dtype)
        fresh.ravel(order=order).tofile(missing)
        model[4:8, 3:6] = 42
        encoded = stored(db_url, f"dv/{name}/{chunk_rel(a, (1, 1))}")
        assert encoded is not None and encoded != fresh.tobytes(order=order)

        # the raw mount, zarr-python and tensorstore see the new values
        again = zarr.open_array(raw.path / "dv" / name, mode="r")
        np.testing.assert_array_equal(again[:], model, err_msg=name)
        driver = "zarr" if kwargs["zarr_format"] == 2 else "zarr3"
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": f"{raw.path}/dv/{name}/"}}
        np.testing.assert_array_equal(ts.open(spec).result().read().result(), model, err_msg=name)
    assert log.new() == []


# --- 4. live consolidated metadata -------------------------------------------------------------


def consolidated_entries(url: str, folder: str, fmt: int) -> dict:
    """The entries of the consolidated document of ``folder``, as the database holds it now."""
    if fmt == 2:
        return json.loads(stored(url, f"{folder}/.zmetadata"))["metadata"]
    return json.loads(stored(url, f"{folder}/zarr.json"))["consolidated_metadata"]["metadata"]


def consolidated_doc_key(folder: str, fmt: int) -> str:
    return f"{folder}/.zmetadata" if fmt == 2 else f"{folder}/zarr.json"


def attrs_entry(entries: dict, node: str, fmt: int) -> dict:
    return entries.get(f"{node}/.zattrs", {}) if fmt == 2 else entries[node]["attributes"]


def array_entry(node: str, fmt: int) -> str:
    return f"{node}/.zarray" if fmt == 2 else node


def assert_mount_shows(path: Path, want: bytes) -> None:
    """The mount shows ``want`` at ``path`` (size and bytes) at once, well before any cache
    timeout: the call that made the daemon rewrite the document returned only after the
    kernel's cached copy was dropped (zarrfs/invalidate.py)."""
    assert os.stat(path).st_size == len(want)
    assert path.read_bytes() == want


def sibling_url(url: str) -> str:
    """Another fresh database of the same kind as ``url``."""
    if url.startswith(("redis", "postgres")):
        return url + "x"  # the key prefix or table name is the last query parameter
    return url.replace("/db.", "/db2.")


def open_consolidated_xr(path: Path) -> xr.Dataset:
    with xr.open_zarr(path, consolidated=True) as ds:
        return ds.load()


def test_live_consolidated_metadata(db_url, mount_factory):
    # cache_timeout=30: the kernel would show the old .zmetadata for 30 s unless the daemon
    # dropped its cached attributes and pages after rewriting it on the side
    m = mount_factory(db_url, ["create", "cache_timeout=30"], name="auto")
    ds = sample_dataset()
    extra = xr.Dataset({"extra": (("x",), np.array([1.5, 2.5, 3.5, 4.5]))}, coords={"x": ds.x})
    for fmt in (2, 3):
        folder = f"ds{fmt}"
        path = m.path / folder
        ds.to_zarr(path, consolidated=True, zarr_format=fmt)
        doc = consolidated_doc_key(folder, fmt)
        assert (m.path / doc).read_bytes() == stored(db_url, doc)  # now in the kernel's caches

        def in_step(folder: str = folder, fmt: int = fmt) -> dict:
            """The document as the mount shows it equals the stored one; its entries."""
            key = consolidated_doc_key(folder, fmt)
            assert_mount_shows(m.path / key, stored(db_url, key))
            return consolidated_entries(db_url, folder, fmt)

        # add a variable without consolidating (xarray's consolidated=False on a v3 store
        # rewrites the group's zarr.json without its consolidated_metadata: use zarr there)
        if fmt == 2:
            extra.to_zarr(path, mode="a", consolidated=False)
        else:
            g = zarr.open_group(path, mode="r+", use_consolidated=False)
            g.create_array("extra", data=extra["extra"].values, dimension_names=["x"])
        assert array_entry("extra", fmt) in in_step()
        out = open_consolidated_xr(path)
        np.testing.assert_array_equal(out["extra"].values, extra["extra"].values)
        assert "extra" in zarr.open_consolidated(path, zarr_format=fmt)

        # change attributes of the group and of an array, without consolidating
        g = zarr.open_group(path, mode="r+", use_consolidated=False)
        g["temp"].attrs["units"] = "degC"
        # (in_step waits for the mount to show the rewritten document: the v3 group is then
        # read and written back whole, and a stale read would undo the mount's update)
        assert attrs_entry(in_step(), "temp", fmt)["units"] == "degC"
        if fmt == 2:
            g.attrs["title"] = "changed"
        else:  # zarr drops a v3 group's consolidated_metadata when told to ignore it
            zarr.open_group(path, mode="r+").attrs["title"] = "changed"
        entries = in_step()
        assert attrs_entry(entries, "temp", fmt)["units"] == "degC"
        if fmt == 2:
            assert entries[".zattrs"]["title"] == "changed"
        else:  # the group's own document holds its attributes, and still its consolidated map
            assert json.loads(stored(db_url, f"{folder}/zarr.json"))["attributes"]["title"] == "changed"
            assert array_entry("extra", fmt) in entries
        out = open_consolidated_xr(path)
        assert out["temp"].attrs["units"] == "degC" and out.attrs["title"] == "changed"
        assert zarr.open_consolidated(path, zarr_format=fmt)["temp"].attrs["units"] == "degC"

        # delete an array (rm -rf of its folder)
        subprocess.run(["rm", "-rf", str(path / "extra")], check=True)
        assert array_entry("extra", fmt) not in in_step()
        assert not any(k.startswith("extra") for k in in_step())
        assert "extra" not in open_consolidated_xr(path)
        assert "extra" not in zarr.open_consolidated(path, zarr_format=fmt)
        # and with the zarr API
        zarr.open_group(path, mode="r+", use_consolidated=False).create_array("gone", shape=(3,), dtype="i1")
        assert array_entry("gone", fmt) in in_step()
        del zarr.open_group(path, mode="r+", use_consolidated=False)["gone"]
        assert array_entry("gone", fmt) not in in_step()
        assert "gone" not in zarr.open_consolidated(path, zarr_format=fmt)
    m.stop()

    # consolidate=off: the document is left stale
    off = mount_factory(db_url, ["consolidate=off"], name="off")
    before = stored(db_url, "ds2/.zmetadata")
    zarr.open_group(off.path / "ds2", mode="r+", use_consolidated=False)["temp"].attrs["units"] = "K"
    assert stored(db_url, "ds2/.zmetadata") == before
    assert open_consolidated_xr(off.path / "ds2")["temp"].attrs["units"] == "degC"  # stale
    with xr.open_zarr(off.path / "ds2", consolidated=False) as fresh:
        assert fresh["temp"].attrs["units"] == "K"
    off.stop()

    # consolidate=live: a root group gets a .zmetadata built from every document in the store
    assert stored(db_url, ".zmetadata") is None
    live = mount_factory(db_url, ["consolidate=live", "cache_timeout=30"], name="live")
    zarr.open_group(live.path, mode="a", zarr_format=2, use_consolidated=False)  # writes the root .zgroup
    entries = json.loads(stored(db_url, ".zmetadata"))["metadata"]
    assert entries[".zgroup"] == {"zarr_format": 2}
    assert "ds2/temp/.zarray" in entries and "ds2/.zattrs" in entries
    assert "ds2/extra/.zarray" not in entries
    assert entries["ds2/temp/.zattrs"]["units"] == "K"  # the live document, not the stale copy
    zarr.open_group(live.path / "ds2", mode="r+", use_consolidated=False)["temp"].attrs["units"] = "F"
    assert json.loads(stored(db_url, ".zmetadata"))["metadata"]["ds2/temp/.zattrs"]["units"] == "F"
    assert json.loads(stored(db_url, "ds2/.zmetadata"))["metadata"]["temp/.zattrs"]["units"] == "F"
    root = zarr.open_consolidated(live.path, zarr_format=2)
    assert root["ds2/temp"].attrs["units"] == "F"
    assert_mount_shows(live.path / ".zmetadata", stored(db_url, ".zmetadata"))

    # and a v3 root group gets consolidated_metadata in its zarr.json (in a second database)
    url3 = sibling_url(db_url)
    live3 = mount_factory(url3, ["create", "consolidate=live"], name="live3")
    g = zarr.open_group(live3.path, mode="a", zarr_format=3, attributes={"v": 3})
    assert "consolidated_metadata" not in json.loads(stored(url3, "zarr.json"))  # nothing to hold yet
    g.create_group("sub").create_array("b", shape=(4,), dtype="i2")
    g.create_array("a", shape=(5,), dtype="f4")
    root = json.loads(stored(url3, "zarr.json"))
    assert root["attributes"] == {"v": 3}
    assert list(root["consolidated_metadata"]["metadata"]) == ["a", "sub", "sub/b"]
    assert sorted(zarr.open_consolidated(live3.path, zarr_format=3).array_keys()) == ["a"]
    assert zarr.open_consolidated(live3.path, zarr_format=3)["sub/b"].shape == (4,)


def test_live_created_zmetadata_is_visible_after_a_failed_lookup(db_url, mount_factory):
    m = mount_factory(db_url, ["create", "consolidate=live", "cache_timeout=30"])
    assert not (m.path / ".zmetadata").exists()  # what zarr and xarray probe before writing
    (m.path / ".zgroup").write_bytes(j({"zarr_format": 2}))
    assert stored(db_url, ".zmetadata") is not None
    assert ".zmetadata" in os.listdir(m.path)
    assert (m.path / ".zmetadata").read_bytes() == stored(db_url, ".zmetadata")


# --- 5. zarrfs check -------------------------------------------------------------------------


def zarrfs_check(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", "check", url], capture_output=True, text=True, timeout=120
    )


def test_check_command(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    model = np.arange(60, dtype="i4").reshape(6, 10)
    for fmt in (2, 3):
        g = zarr.open_group(m.path / f"z{fmt}", mode="w", zarr_format=fmt, attributes={"n": fmt})
        g.create_array("arr", data=model, chunks=(4, 4))
        g.create_group("sub").create_array("nested", data=model, chunks=(3, 5),
                                           chunk_key_encoding={"name": "v2", "separator": "/"})  # fmt: skip
        sample_dataset().to_zarr(m.path / f"xr{fmt}", consolidated=True, zarr_format=fmt)
    m.stop()

    clean = zarrfs_check(db_url)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout == "" and "no problems" in clean.stderr

    seeded = {
        "z2/arr/.zarray": (j(with_(V2_ARRAY, chunks=[4])), "zarray.shape-chunks-length"),
        "z2/sub/nested/2/0": (b"chunk", "chunk-key.out-of-grid"),
        "z2/sub/nested/0.0": (b"chunk", "chunk-key.separator"),
        "z3/arr/c/0/0/0": (b"chunk", "chunk-key.dimensions"),
        "z3/bad/zarr.json": (j({"zarr_format": 3, "node_type": "folder"}), "zarr.json.node-type"),
        "xr2/.zattrs": (j(["not", "an", "object"]), "zattrs.not-object"),
    }
    with open_driver(db_url) as driver:
        for key, (value, _) in seeded.items():
            driver.put(key, value)
    found = zarrfs_check(db_url)
    assert found.returncode != 0
    lines = found.stdout.splitlines()
    # xr2's .zattrs changed behind the consolidated document: that is stale now, an error too
    stale = "error: xr2/.zmetadata: zmetadata.stale: consolidated metadata is stale: entry '.zattrs' differs"
    assert sum(line.startswith(stale) for line in lines) == 1, found.stdout
    assert len(lines) == len(seeded) + 1, found.stdout
    for key, (_, rule) in seeded.items():
        assert sum(line.startswith(f"error: {key}: {rule}: ") for line in lines) == 1, (key, found.stdout)
    assert f"{len(seeded) + 1} problem(s) found" in found.stderr


def test_rewritten_document_is_current_as_soon_as_the_call_returns(db_url, mount_factory):
    """No window after a metadata write in which the kernel still serves the old consolidated
    document (a client reading it back whole would otherwise undo the update)."""
    m = mount_factory(db_url, ["create", "cache_timeout=30"])
    group = zarr.open_group(m.path / "h", mode="w", zarr_format=3)
    zarr.consolidate_metadata(m.path / "h")
    for i in range(25):
        (m.path / "h/zarr.json").read_bytes()  # the kernel now holds this version
        zarr.open_group(m.path / "h", mode="r+", use_consolidated=False).create_array(
            f"a{i}", shape=(2,), dtype="i1"
        )
        assert (m.path / "h/zarr.json").read_bytes() == stored(db_url, "h/zarr.json")
    assert len(json.loads(stored(db_url, "h/zarr.json"))["consolidated_metadata"]["metadata"]) == 25
    del group


def test_the_zarr_checks_start_no_blas_threads(tmp_path, mount_factory):
    """A v2 array of a structured type imports numpy to check it, whose OpenBLAS started a thread
    per CPU that spun waiting for work the daemon never gives it (15% of the daemon's CPU
    samples over a fresh mount's first Zarr write, on the cores the writer uses). The daemon
    asks numpy's BLAS for one thread: the checks start no thread of their own."""
    m = mount_factory(f"lmdb://{tmp_path}/t.lmdb", ["create"])
    from zarrfs.daemon.control import query

    pid = query(str(m.path))["pid"]
    put(m.path, "a/plain", b"x")  # the daemon's own threads are all up after a first commit

    def threads() -> int:
        return len(os.listdir(f"/proc/{pid}/task"))

    before = threads()
    zarray = {
        "zarr_format": 2,
        "shape": [4],
        "chunks": [2],
        "dtype": [["x", "<f8"], ["y", "<i4"]],
        "compressor": None,
        "fill_value": None,
        "filters": None,
        "order": "C",
    }
    put(m.path, "a/.zarray", j(zarray))
    with open(f"/proc/{pid}/maps") as fh:
        assert "numpy" in fh.read()  # the check ran, numpy with it
    assert threads() == before

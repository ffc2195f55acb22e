"""Array info and chunk codecs: decode what zarr wrote, and zarr reads what we encode."""

from __future__ import annotations

import itertools
import json
import math
import os
import warnings
import zlib

import numcodecs
import numpy as np
import pytest
import zarr
from format_cases import V1_META, V2_ARRAY, V3_ARRAY, Store, dir_getter, dir_keys, with_
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

from zarrfs.format import ChunkSizeError, FormatError, UnsupportedArray, array_info, find_array

pytestmark = pytest.mark.filterwarnings("ignore")

with warnings.catch_warnings():
    # zarr warns that numcodecs.* codecs are outside the v3 core spec: that is the point here.
    warnings.simplefilter("ignore")
    NUMCODECS_ZLIB = zarr.codecs.numcodecs.Zlib(level=1)

R = np.arange(7 * 9, dtype="f8").reshape(7, 9) - 20  # 7x9 with chunks 3x4: ragged edges

# name -> (zarr_format, data, create_array kwargs)
ARRAYS = {
    "v2_blosc": (2, R.astype("f4"), {"chunks": (3, 4), "fill_value": np.nan}),
    "v2_zlib_delta": (
        2,
        R.astype("i2"),
        {"chunks": (3, 4), "filters": [numcodecs.Delta(dtype="<i2")], "compressors": numcodecs.Zlib(1)},
    ),
    "v2_forder": (2, R, {"chunks": (3, 4), "order": "F", "compressors": numcodecs.GZip(1)}),
    "v2_bigendian": (2, R.astype(">i4"), {"chunks": (3, 4), "fill_value": -1}),
    "v2_nested": (
        2,
        R.astype("u2"),
        {"chunks": (3, 4), "chunk_key_encoding": {"name": "v2", "separator": "/"}},
    ),
    "v2_raw": (2, R > 0, {"chunks": (3, 4), "compressors": None}),
    "v2_complex": (2, R * 1j, {"chunks": (3, 4)}),
    "v2_datetime": (2, np.arange(5).astype("M8[D]"), {"chunks": (2,)}),
    "v2_bytes": (2, np.array([b"ab", b"cde", b"", b"x"], dtype="S3"), {"chunks": (3,), "fill_value": b"zz"}),
    "v2_struct": (
        2,
        np.array([(1, 2.0), (3, 4.0), (5, 6.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        {"chunks": (2,), "fill_value": np.zeros((), [("a", "<i4"), ("b", "<f8")])[()]},
    ),
    "v2_scalar": (2, np.array(2.5), {"chunks": ()}),
    "v3_default": (3, R.astype("f4"), {"chunks": (3, 4), "fill_value": np.nan}),
    "v3_gzip_crc": (3, R, {"chunks": (3, 4), "compressors": [GzipCodec(level=2), Crc32cCodec()]}),
    "v3_transpose": (3, R.astype("i4"), {"chunks": (3, 4), "filters": [TransposeCodec(order=(1, 0))]}),
    "v3_blosc_be": (
        3,
        R.astype("i8"),
        {
            "chunks": (3, 4),
            "serializer": BytesCodec(endian="big"),
            "compressors": [BloscCodec(cname="lz4", shuffle="shuffle")],
        },
    ),
    "v3_bitshuffle": (
        3,
        R.astype("u1"),
        {"chunks": (3, 4), "compressors": [BloscCodec(cname="zstd", shuffle="bitshuffle")]},
    ),
    "v3_zstd_checksum": (3, R, {"chunks": (3, 4), "compressors": [ZstdCodec(level=3, checksum=True)]}),
    "v3_v2keys": (3, R, {"chunks": (3, 4), "chunk_key_encoding": {"name": "v2", "separator": "."}}),
    "v3_dots": (3, R, {"chunks": (3, 4), "chunk_key_encoding": {"name": "default", "separator": "."}}),
    "v3_numcodecs": (3, R, {"chunks": (3, 4), "compressors": [NUMCODECS_ZLIB]}),
    "v3_datetime": (3, np.arange(5).astype("M8[s]"), {"chunks": (2,)}),
    "v3_fixed_str": (3, np.array(["ab", "c", "def"], dtype="U3"), {"chunks": (2,), "fill_value": "q"}),
    "v3_scalar": (3, np.array(7, dtype="i2"), {"chunks": ()}),
    "v3_bool": (3, R > 0, {"chunks": (3, 4), "fill_value": True}),
}


def chunk_region(info, coords):
    return tuple(
        slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, info.chunks, info.shape, strict=True)
    )


def create(root, name, data=None):
    fmt, values, kw = ARRAYS[name]
    kw = dict(kw)
    a = zarr.create_array(
        os.path.join(root, name), shape=values.shape, dtype=values.dtype, zarr_format=fmt, **kw
    )
    if data is not None:
        a[...] = data
    return a, values


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_decode_what_zarr_wrote(tmp_path, name):
    root = str(tmp_path)
    _, values = create(root, name)
    zarr.open_array(os.path.join(root, name), mode="r+")[...] = values
    get = dir_getter(root)
    info = array_info(name, get)
    assert info is not None and info.unsupported is None
    assert info.shape == values.shape
    assert info.prefix == name
    seen = 0
    for key in dir_keys(root):
        coords = info.chunk_coords(key)
        if coords is None:
            continue
        raw = info.decode_chunk(get(key))
        assert len(raw) == info.chunk_nbytes() == math.prod(info.chunks) * info.dtype.itemsize
        chunk = np.frombuffer(raw, dtype=info.dtype).reshape(info.chunks, order=info.order)
        region = chunk_region(info, coords)
        want = values[region]
        got = chunk[tuple(slice(0, s.stop - s.start) for s in region)]
        assert got.dtype == want.dtype or got.dtype.newbyteorder("=") == want.dtype.newbyteorder("=")
        if want.dtype.kind in "fc":
            np.testing.assert_array_equal(got, want)
        else:
            assert (got == want).all(), (key, got, want)
        assert info.chunk_key(coords) == key
        assert find_array(key, get)[0] == name
        seen += 1
    # every stored non-metadata key is a chunk (all-fill chunks are not stored)
    assert seen == sum(1 for k in dir_keys(root) if not k.endswith(("zarr.json", ".zarray", ".zattrs")))
    assert 0 < seen <= math.prod(info.grid_shape)


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_zarr_reads_what_we_encode(tmp_path, name):
    root = str(tmp_path)
    a, values = create(root, name)  # metadata only
    info = array_info(name, dir_getter(root))
    fill = info.fill_chunk()
    for coords in itertools.product(*(range(g) for g in info.grid_shape)):
        chunk = np.frombuffer(fill, dtype=info.dtype).reshape(info.chunks, order=info.order).copy(order="A")
        region = chunk_region(info, coords)
        chunk[tuple(slice(0, s.stop - s.start) for s in region)] = values[region]
        raw = chunk.tobytes(order=info.order)
        encoded = info.encode_chunk(raw)
        assert info.decode_chunk(encoded) == raw
        path = os.path.join(root, name, *info.chunk_key(coords)[len(name) + 1 :].split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(encoded)
    back = zarr.open_array(os.path.join(root, name), mode="r")[...]
    if values.dtype.kind in "fc":
        np.testing.assert_array_equal(back, values)
    else:
        assert (back == values).all()


def test_fill_chunk_and_info_fields(tmp_path):
    root = str(tmp_path)
    for name in ("v2_blosc", "v3_default", "v2_bigendian", "v3_fixed_str", "v2_bytes", "v3_bool"):
        create(root, name)
    get = dir_getter(root)
    nan = np.frombuffer(array_info("v2_blosc", get).fill_chunk(), dtype="<f4")
    assert nan.size == 12 and np.isnan(nan).all()
    v3 = array_info("v3_default", get)
    assert (v3.zarr_format, v3.separator, v3.key_encoding, v3.order) == (3, "/", "default", "C")
    assert np.isnan(np.frombuffer(v3.fill_chunk(), dtype=v3.dtype)).all()
    be = array_info("v2_bigendian", get)
    assert be.dtype == np.dtype(">i4") and (np.frombuffer(be.fill_chunk(), ">i4") == -1).all()
    assert (np.frombuffer(array_info("v3_fixed_str", get).fill_chunk(), "<U3") == "q").all()
    assert (np.frombuffer(array_info("v2_bytes", get).fill_chunk(), "S3") == b"zz").all()
    assert np.frombuffer(array_info("v3_bool", get).fill_chunk(), "?").all()


def test_wrong_sizes_and_corrupt_chunks(tmp_path):
    root = str(tmp_path)
    create(root, "v2_blosc")
    info = array_info("v2_blosc", dir_getter(root))
    with pytest.raises(ChunkSizeError) as exc:
        info.encode_chunk(b"\0" * (info.chunk_nbytes() - 1))
    assert exc.value.problem.rule == "chunk.raw-size"
    assert isinstance(exc.value, FormatError)
    with pytest.raises(FormatError, match="chunk.decode"):
        info.decode_chunk(b"not blosc at all")
    raw_info = array_info("v2_raw", dir_getter(create(root, "v2_raw") and root))
    with pytest.raises(FormatError, match="chunk.decoded-size"):
        raw_info.decode_chunk(b"\1" * 5)


def test_unsupported_arrays(tmp_path):
    root = str(tmp_path)
    zarr.create_array(f"{root}/obj", shape=(4,), chunks=(2,), dtype=str, zarr_format=2)[...] = np.array(
        list("abcd")
    )
    zarr.create_array(f"{root}/vlen", shape=(4,), chunks=(2,), dtype=str, zarr_format=3)
    sharded = zarr.create_array(f"{root}/shard", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="i4")
    sharded[...] = 1
    get = dir_getter(root)
    for name, words in [("obj", "object"), ("vlen", "variable-length"), ("shard", "shard")]:
        info = array_info(name, get)
        assert words in info.unsupported
        for call in (
            info.chunk_nbytes,
            info.fill_chunk,
            lambda i=info: i.decode_chunk(b""),
            lambda i=info: i.encode_chunk(b""),
        ):
            with pytest.raises(UnsupportedArray) as exc:
                call()
            assert exc.value.problem.rule == "array.unsupported"
    # the grid still works for an unsupported array: chunk keys are known
    info = array_info("shard", get)
    assert info.chunk_coords("shard/c/1/1") == (1, 1) and info.chunk_coords("shard/c/2/0") is None
    assert info.grid_shape == (2, 2)


def test_unsupported_codecs_from_metadata():
    unknown = with_(
        V3_ARRAY, codecs=[{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "x.new"}]
    )
    aa = with_(
        V3_ARRAY,
        codecs=[
            {"name": "numcodecs.delta", "configuration": {"dtype": "<f8"}},
            {"name": "bytes", "configuration": {"endian": "little"}},
        ],
    )
    ab = with_(V3_ARRAY, codecs=[{"name": "numcodecs.zfpy", "configuration": {"mode": 4, "tolerance": 0.1}}])
    store = Store().put_json("u/zarr.json", unknown).put_json("aa/zarr.json", aa).put_json("ab/zarr.json", ab)
    assert "x.new" in array_info("u", store.get).unsupported
    assert "numcodecs.delta" in array_info("aa", store.get).unsupported
    info = array_info("ab", store.get)
    assert info.unsupported is not None
    # without a known grid there is no ArrayInfo at all
    store.put_json("r/zarr.json", with_(V3_ARRAY, chunk_grid={"name": "rectilinear", "configuration": {}}))
    with pytest.raises(UnsupportedArray, match="chunk grid"):
        array_info("r", store.get)


def test_array_info_lookups():
    store = (
        Store()
        .put_json(".zgroup", {"zarr_format": 2})
        .put_json("g/.zgroup", {"zarr_format": 2})
        .put_json("g/a/.zarray", with_(V2_ARRAY, dimension_separator="/"))
        .put_json("v3/zarr.json", {"zarr_format": 3, "node_type": "group"})
        .put_json("v3/b/zarr.json", V3_ARRAY)
    )
    store["bad/.zarray"] = b"{oops"
    store.put_json("invalid/.zarray", with_(V2_ARRAY, chunks=[1]))
    assert array_info("g", store.get) is None
    assert array_info("nothing", store.get) is None
    assert array_info("v3", store.get) is None
    assert array_info("g/a", store.get).separator == "/"
    for name, rule in [("bad", "array.metadata-invalid"), ("invalid", "zarray.shape-chunks-length")]:
        with pytest.raises(FormatError) as exc:
            array_info(name, store.get)
        assert exc.value.problem.rule == rule
    prefix, info = find_array("g/a/2/1", store.get)
    assert prefix == "g/a" and info.chunk_coords("g/a/2/1") == (2, 1)
    assert info.chunk_coords("g/a/.zattrs") is None and info.chunk_coords("g/a/2/1.abc.partial") is None
    assert info.chunk_coords("other/2/1") is None
    assert find_array("v3/b/c/0/0", store.get)[1].zarr_format == 3
    assert find_array("g/x/0.0", store.get) is None
    assert find_array("loose.txt", store.get) is None
    with pytest.raises(FormatError):
        find_array("bad/0.0", store.get)


def test_v1_array():
    data = (np.arange(200, dtype="<i4") * 3).reshape(10, 20)
    store = Store().put_json("meta", V1_META).put_json("attrs", {})
    info = array_info("", store.get)
    assert (info.zarr_format, info.prefix, info.fill_value, info.chunks) == (1, "", 42, (4, 8))
    chunk = np.full((4, 8), 42, dtype="<i4")
    chunk[:, :] = data[:4, :8]
    store["0.0"] = zlib.compress(chunk.tobytes(), 1)
    assert info.decode_chunk(store["0.0"]) == chunk.tobytes()
    assert zlib.decompress(info.encode_chunk(chunk.tobytes())) == chunk.tobytes()
    assert find_array("1.2", store.get)[1].chunk_coords("1.2") == (1, 2)
    raw = Store().put_json("meta", with_(V1_META, compression="none", compression_opts=None))
    assert array_info("", raw.get).encode_chunk(chunk.tobytes()) == chunk.tobytes()
    blosc = Store().put_json(
        "meta",
        with_(V1_META, compression="blosc", compression_opts={"cname": "lz4", "clevel": 1, "shuffle": 1}),
    )
    info = array_info("", blosc.get)
    assert info.decode_chunk(info.encode_chunk(chunk.tobytes())) == chunk.tobytes()


ZARR2_READ = r"""
import sys, json, numpy as np, zarr
root = sys.argv[1]
out = {}
for name in ("f8", "forder", "be", "nested"):
    a = zarr.open_array(root + "/" + name, mode="r")
    out[name] = np.asarray(a[...], dtype="f8").tolist()
print(json.dumps(out))
"""

ZARR2_WRITE = r"""
import sys, numpy as np, numcodecs, zarr
root = sys.argv[1]
r = np.arange(63, dtype="f8").reshape(7, 9) - 20
zarr.open_array(root + "/f8", mode="w", shape=r.shape, chunks=(3, 4), dtype="<f8", fill_value=np.nan)[...] = r
zarr.open_array(root + "/forder", mode="w", shape=r.shape, chunks=(3, 4), dtype="<f8", order="F",
                filters=[numcodecs.Delta(dtype="<f8")], compressor=numcodecs.Zlib(1))[...] = r
zarr.open_array(root + "/be", mode="w", shape=r.shape, chunks=(3, 4), dtype=">i4", compressor=None)[...] = r
nested = zarr.open_array(root + "/nested", mode="w", shape=r.shape, chunks=(3, 4), dtype="<u2",
                         dimension_separator="/")
nested[...] = r + 20
"""


def test_zarr_python_2_round_trip(tmp_path, zarr2_python):
    """zarr-python 2.18 writes, we decode; we re-encode everything, zarr-python 2 reads it."""
    from zarr2env import run

    root = str(tmp_path)
    run(zarr2_python, ZARR2_WRITE, root)
    get = dir_getter(root)
    expected = {"f8": R, "forder": R, "be": R.astype(">i4"), "nested": (R + 20).astype("<u2")}
    for name, values in expected.items():
        info = array_info(name, get)
        for key in dir_keys(root):
            coords = info.chunk_coords(key)
            if coords is None:
                continue
            chunk = np.frombuffer(info.decode_chunk(get(key)), dtype=info.dtype).reshape(
                info.chunks, order=info.order
            )
            region = chunk_region(info, coords)
            assert (chunk[tuple(slice(0, s.stop - s.start) for s in region)] == values[region]).all()
            # write back our own encoding of the same chunk, with 1 added to every element
            bumped = (chunk + 1).astype(info.dtype)
            with open(os.path.join(root, *key.split("/")), "wb") as f:
                f.write(info.encode_chunk(bumped.tobytes(order=info.order)))
    back = json.loads(run(zarr2_python, ZARR2_READ, root))
    for name, values in expected.items():
        assert np.array_equal(np.array(back[name]), values.astype("f8") + 1), name


def test_a_data_type_numpy_cannot_hold_is_checked_and_its_view_is_unsupported():
    """The spec bounds no fixed-length type's size; NumPy refuses items past 2**31 bytes. Such an
    array's metadata is checked without error (NumPy's refusal escaped the checks as a
    TypeError when each type's dtype was made as it was parsed), and its decoded view is
    unsupported, not an error."""
    from zarrfs.format import validate_metadata

    huge = with_(
        V3_ARRAY,
        data_type={"name": "null_terminated_bytes", "configuration": {"length_bytes": 2**40}},
        fill_value="",
    )
    assert validate_metadata("h/zarr.json", json.dumps(huge).encode(), lambda k: None) == []
    info = array_info("h", Store().put_json("h/zarr.json", huge).get)
    assert "no NumPy equivalent" in info.unsupported

"""Zarr v2 (and v1) metadata rules: each refused case next to a passing neighbour."""

from __future__ import annotations

import json

import pytest
from format_cases import DROP, V1_META, V2_ARRAY, Store, errors, rules, with_
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfs.format import validate_metadata


def check(key: str, doc, store: Store | None = None):
    value = doc if isinstance(doc, bytes) else json.dumps(doc, allow_nan=True).encode()
    return validate_metadata(key, value, (store or Store()).get)


# (bad changes, rule, good changes) applied to V2_ARRAY
ZARRAY_CASES = [
    ({"filters": DROP}, "zarray.missing-key", {}),
    ({"zarr_format": 3}, "zarray.zarr-format", {"zarr_format": 2}),
    ({"zarr_format": True}, "zarray.zarr-format", {"zarr_format": 2}),
    ({"shape": [10, "a"]}, "zarray.shape", {"shape": [10, 0]}),
    ({"shape": [True, 20]}, "zarray.shape", {"shape": [1, 20]}),
    ({"shape": [-1, 20]}, "zarray.shape", {"shape": [0, 20]}),
    ({"chunks": [0, 8]}, "zarray.chunks", {"chunks": [1, 8]}),
    ({"chunks": [4.0, 8]}, "zarray.chunks", {"chunks": [4, 8]}),
    ({"chunks": [4]}, "zarray.shape-chunks-length", {"chunks": [4, 9]}),
    ({"shape": [], "chunks": [1]}, "zarray.shape-chunks-length", {"shape": [], "chunks": []}),
    ({"dtype": "f8"}, "zarray.dtype", {"dtype": ">f8"}),
    ({"dtype": "<x8"}, "zarray.dtype", {"dtype": "<f4"}),
    ({"dtype": "<f8\n"}, "zarray.dtype", {"dtype": "<f8"}),  # "$" before a last newline
    ({"dtype": "<i3", "fill_value": 0}, "zarray.dtype", {"dtype": "<i2", "fill_value": 0}),
    ({"dtype": "|S0", "fill_value": None}, "zarray.dtype", {"dtype": "|S1", "fill_value": None}),
    ({"dtype": "|i4", "fill_value": 0}, "zarray.dtype-byteorder", {"dtype": "|i1", "fill_value": 0}),
    ({"dtype": "|U2", "fill_value": None}, "zarray.dtype-byteorder", {"dtype": "<U2", "fill_value": None}),
    ({"dtype": "<M8", "fill_value": 0}, "zarray.dtype-datetime-unit", {"dtype": "<M8[ns]", "fill_value": 0}),
    (
        {"dtype": "<m8[xs]", "fill_value": 0},
        "zarray.dtype-datetime-unit",
        {"dtype": "<m8[10s]", "fill_value": 0},
    ),
    ({"dtype": "<i4[ns]", "fill_value": 0}, "zarray.dtype", {"dtype": "<M8[D]", "fill_value": 0}),
    (
        {"dtype": [["a", "<i4"], ["a", "<f8"]], "fill_value": None},
        "zarray.dtype",
        {"dtype": [["a", "<i4"], ["b", "<f8", [2]]], "fill_value": None},
    ),
    (
        {"dtype": [["a"]], "fill_value": None},
        "zarray.dtype",
        {"dtype": [["a", "|u1"], ["n", [["x", "<f4"], ["y", ">i2"]]]], "fill_value": None},
    ),
    (
        {"dtype": [["a", "<i4", [-1]]], "fill_value": None},
        "zarray.dtype",
        {"dtype": [["a", "<i4", [3]]], "fill_value": None},
    ),
    ({"dtype": [], "fill_value": None}, "zarray.dtype", {"dtype": [["", "|V3"]], "fill_value": None}),
    ({"compressor": {"id": "zlib", "level": "x"}}, "zarray.compressor", {"compressor": None}),
    ({"compressor": {"level": 1}}, "zarray.compressor", {"compressor": {"id": "zlib", "level": 9}}),
    ({"compressor": {"id": "zlib", "level": 42}}, "zarray.compressor", {"compressor": {"id": "zlib"}}),
    (
        {"compressor": {"id": "gzip", "levell": 1}},
        "zarray.compressor",
        {"compressor": {"id": "gzip", "level": 1}},
    ),
    (
        {"compressor": {"id": "blosc", "cname": "nope", "clevel": 5, "shuffle": 1}},
        "zarray.compressor",
        {"compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": -1, "blocksize": 0}},
    ),
    ({"filters": []}, "zarray.filters", {"filters": None}),
    ({"filters": {"id": "delta"}}, "zarray.filters", {"filters": [{"id": "delta", "dtype": "<f8"}]}),
    (
        {"filters": [{"id": "delta"}]},
        "zarray.filters",
        {"filters": [{"id": "delta", "dtype": "<f8", "astype": "<f4"}]},
    ),
    (
        {"dtype": "|O", "filters": None, "fill_value": None},
        "zarray.object-codec",
        {"dtype": "|O", "filters": [{"id": "vlen-utf8"}], "fill_value": ""},
    ),
    ({"order": "X"}, "zarray.order", {"order": "F"}),
    ({"dimension_separator": "-"}, "zarray.dimension-separator", {"dimension_separator": "/"}),
    ({"dimension_separator": 1}, "zarray.dimension-separator", {"dimension_separator": None}),
    # fill values, per dtype
    ({"fill_value": "nope"}, "zarray.fill-value", {"fill_value": "-Infinity"}),
    ({"fill_value": [1.0]}, "zarray.fill-value", {"fill_value": 1e300}),
    ({"fill_value": True}, "zarray.fill-value", {"fill_value": 0}),
    ({"dtype": "<i4", "fill_value": 2**31}, "zarray.fill-value", {"dtype": "<i4", "fill_value": 2**31 - 1}),
    ({"dtype": "|u1", "fill_value": -1}, "zarray.fill-value", {"dtype": "|u1", "fill_value": 255}),
    ({"dtype": "<i8", "fill_value": 1.5}, "zarray.fill-value", {"dtype": "<i8", "fill_value": -(2**63)}),
    ({"dtype": "<u8", "fill_value": True}, "zarray.fill-value", {"dtype": "<u8", "fill_value": 2**64 - 1}),
    ({"dtype": "|b1", "fill_value": "yes"}, "zarray.fill-value", {"dtype": "|b1", "fill_value": False}),
    ({"dtype": "|b1", "fill_value": 2}, "zarray.fill-value", {"dtype": "|b1", "fill_value": True}),
    ({"dtype": "<c8", "fill_value": [1]}, "zarray.fill-value", {"dtype": "<c8", "fill_value": [1, "NaN"]}),
    ({"dtype": "<c16", "fill_value": 0}, "zarray.fill-value", {"dtype": ">c16", "fill_value": [0.0, -1e3]}),
    (
        {"dtype": "<M8[ns]", "fill_value": 1.5},
        "zarray.fill-value",
        {"dtype": "<M8[ns]", "fill_value": -(2**63)},
    ),
    ({"dtype": "<m8[s]", "fill_value": "x"}, "zarray.fill-value", {"dtype": "<m8[s]", "fill_value": "NaT"}),
    ({"dtype": "|S3", "fill_value": 5}, "zarray.fill-value", {"dtype": "|S3", "fill_value": "YWI="}),
    ({"dtype": "|S3", "fill_value": "YWJjZA=="}, "zarray.fill-value", {"dtype": "|S3", "fill_value": ""}),
    ({"dtype": "|V2", "fill_value": "AAAAAA=="}, "zarray.fill-value", {"dtype": "|V2", "fill_value": "AAA="}),
    ({"dtype": "|V2", "fill_value": "!!"}, "zarray.fill-value", {"dtype": "|V2", "fill_value": None}),
    (
        {"dtype": [["a", "<i2"]], "fill_value": 0},
        "zarray.fill-value",
        {"dtype": [["a", "<i2"]], "fill_value": "AAA="},
    ),
    ({"dtype": "<U2", "fill_value": 5}, "zarray.fill-value", {"dtype": "<U2", "fill_value": "ab"}),
]


@pytest.mark.parametrize("bad,rule,good", ZARRAY_CASES, ids=[c[1] for c in ZARRAY_CASES])
def test_zarray_rule(bad, rule, good):
    assert rule in rules(check("a/.zarray", with_(V2_ARRAY, **bad)))
    assert errors(check("a/.zarray", with_(V2_ARRAY, **good))) == []


@pytest.mark.parametrize(
    "changes,rule",
    [
        ({"foo": 1}, "zarray.unknown-key"),
        # a codec not installed here may well be installed where the data is read
        ({"compressor": {"id": "no-such-codec"}}, "zarray.compressor"),
        ({"compressor": {"id": "imagecodecs_jpegxl", "level": 1}}, "zarray.compressor"),
        ({"filters": [{"id": "zfpy-not-here", "mode": 4}]}, "zarray.filters"),
        ({"dtype": "|b1", "fill_value": 1}, "zarray.fill-value"),
        ({"dtype": "<i4", "fill_value": 3.0}, "zarray.fill-value"),
        ({"dtype": "<i4", "fill_value": "3"}, "zarray.fill-value"),
        ({"fill_value": "1.5"}, "zarray.fill-value"),
        ({"dtype": "|S3", "fill_value": "!!"}, "zarray.fill-value"),
        ({"dtype": "|S3", "fill_value": 0}, "zarray.fill-value"),
        ({"dtype": "<U2", "fill_value": "abc"}, "zarray.fill-value"),
        ({"dtype": "|V4", "fill_value": "AAA="}, "zarray.fill-value"),
    ],
)
def test_zarray_warnings_are_not_errors(changes, rule):
    # Forms zarr-python still reads: flagged, never refused.
    problems = check("a/.zarray", with_(V2_ARRAY, **changes))
    assert errors(problems) == []
    assert rule in rules(problems, "warning")


def test_zarray_object_dtype_accepts_any_fill_value():
    doc = with_(V2_ARRAY, dtype="|O", filters=[{"id": "json2"}], fill_value={"any": ["thing"]})
    assert errors(check(".zarray", doc)) == []


def test_not_json_and_not_object():
    assert "zarray.invalid" in rules(check(".zarray", b"{nope"))
    assert "zarray.not-utf8" in rules(check(".zarray", b"\xff\xfe"))
    assert "zarray.not-object" in rules(check(".zarray", [1, 2]))
    assert "zgroup.not-object" in rules(check(".zgroup", "x"))
    assert "zattrs.not-object" in rules(check(".zattrs", [1]))
    assert errors(check(".zattrs", {})) == []


def test_nan_literal_is_a_warning():
    problems = check(".zattrs", b'{"x": NaN, "y": [Infinity]}')
    assert errors(problems) == []
    assert "zattrs.nan-literal" in rules(problems, "warning")


def test_zgroup():
    assert errors(check("g/.zgroup", {"zarr_format": 2})) == []
    assert "zgroup.zarr-format" in rules(check("g/.zgroup", {"zarr_format": 3}))
    assert "zgroup.zarr-format" in rules(check("g/.zgroup", {}))
    assert "zgroup.keys" in rules(check("g/.zgroup", {"zarr_format": 2, "extra": 1}))
    # netCDF-C's NCZarr 2.0 writes its own members into .zgroup: flagged, not refused
    nczarr = {"zarr_format": 2, "_nczarr_superblock": {"version": "2.0.0"}, "_nczarr_group": {"dims": {}}}
    found = check(".zgroup", nczarr)
    assert errors(found) == [] and "zgroup.keys" in rules(found, "warning")


def test_zattrs_array_dimensions():
    store = Store().put_json("a/.zarray", V2_ARRAY)
    assert errors(check("a/.zattrs", {"_ARRAY_DIMENSIONS": ["y", "x"]}, store)) == []
    assert "zattrs.array-dimensions-length" in rules(check("a/.zattrs", {"_ARRAY_DIMENSIONS": ["x"]}, store))
    assert "zattrs.array-dimensions" in rules(check("a/.zattrs", {"_ARRAY_DIMENSIONS": "x"}, store))
    assert "zattrs.array-dimensions" in rules(check("a/.zattrs", {"_ARRAY_DIMENSIONS": ["x", 1]}, store))
    # no array beside it (a group, or the .zarray not written yet): the length cannot be checked
    assert errors(check("b/.zattrs", {"_ARRAY_DIMENSIONS": ["x"]}, store)) == []
    # a broken .zarray beside it disables the length check rather than failing it
    store["c/.zarray"] = b"{broken"
    assert errors(check("c/.zattrs", {"_ARRAY_DIMENSIONS": ["x"]}, store)) == []


def zmeta(entries: dict) -> dict:
    return {"zarr_consolidated_format": 1, "metadata": entries}


def test_zmetadata():
    good = zmeta(
        {".zgroup": {"zarr_format": 2}, "a/.zarray": V2_ARRAY, "a/.zattrs": {"_ARRAY_DIMENSIONS": ["y", "x"]}}
    )
    assert check(".zmetadata", good) == []
    assert "zmetadata.not-object" in rules(check(".zmetadata", []))
    assert "zmetadata.format" in rules(check(".zmetadata", with_(good, zarr_consolidated_format=2)))
    assert "zmetadata.metadata" in rules(check(".zmetadata", with_(good, metadata=[])))
    bad_entry = zmeta({"a/.zarray": with_(V2_ARRAY, chunks=[4])})
    assert "zmetadata.zarray.shape-chunks-length" in rules(check(".zmetadata", bad_entry))
    dims = zmeta({"a/.zarray": V2_ARRAY, "a/.zattrs": {"_ARRAY_DIMENSIONS": ["x"]}})
    assert "zmetadata.zattrs.array-dimensions-length" in rules(check(".zmetadata", dims))
    assert "zmetadata.entry-name" in rules(check(".zmetadata", zmeta({"a//.zgroup": {"zarr_format": 2}})))
    assert "zmetadata.zgroup.zarr-format" in rules(check(".zmetadata", zmeta({".zgroup": {}})))
    # extra keys in a .zgroup entry only warn; zarr-python 3's consolidated_metadata passes silently
    extra = check(".zmetadata", zmeta({"a/.zgroup": {"zarr_format": 2, "x": 1}}))
    assert errors(extra) == [] and "zmetadata.zgroup.keys" in rules(extra, "warning")
    zp3 = {
        "zarr_format": 2,
        "consolidated_metadata": {"metadata": {}, "must_understand": False, "kind": "inline"},
    }
    assert check(".zmetadata", zmeta({"a/.zgroup": zp3})) == []
    unknown = check(".zmetadata", with_(zmeta({"a/zarr.json": {}}), other=1))
    assert errors(unknown) == []
    assert {"zmetadata.unknown-entry", "zmetadata.unknown-key"} <= rules(unknown, "warning")


def test_hierarchy_warnings():
    store = Store().put_json("a/.zgroup", {"zarr_format": 2}).put_json("b/.zarray", V2_ARRAY)
    both = check("a/.zarray", V2_ARRAY, store)
    assert errors(both) == [] and "hierarchy.array-and-group" in rules(both, "warning")
    inside = check("b/c/.zgroup", {"zarr_format": 2}, store)
    assert errors(inside) == [] and "hierarchy.node-inside-array" in rules(inside, "warning")
    assert check("a/c/.zarray", V2_ARRAY, store) == []


# --- v1 -------------------------------------------------------------------------------------

V1_CASES = [
    ({"compression_opts": DROP}, "meta.missing-key", {}),
    ({"zarr_format": 2}, "meta.zarr-format", {"zarr_format": 1}),
    ({"shape": [10]}, "meta.shape-chunks-length", {"shape": [10, 1]}),
    ({"dtype": "i4"}, "meta.dtype", {"dtype": ">i4"}),
    ({"compression": "snappy"}, "meta.compression", {"compression": "none"}),
    ({"compression": "zlib", "compression_opts": "x"}, "meta.compression", {"compression_opts": None}),
    (
        {"compression": "blosc", "compression_opts": {"cname": "nope", "clevel": 1, "shuffle": 1}},
        "meta.compression-opts",
        {"compression": "blosc", "compression_opts": {"cname": "lz4", "clevel": 3, "shuffle": 1}},
    ),
    (
        {"compression": "lzma", "compression_opts": 3},
        "meta.compression",
        {"compression": "lzma", "compression_opts": None},
    ),
    ({"fill_value": "x"}, "meta.fill-value", {"fill_value": None}),
    ({"order": "c"}, "meta.order", {"order": "F"}),
]


@pytest.mark.parametrize("bad,rule,good", V1_CASES, ids=[c[1] for c in V1_CASES])
def test_v1_meta_rule(bad, rule, good):
    assert rule in rules(check("meta", with_(V1_META, **bad)))
    assert errors(check("meta", with_(V1_META, **good))) == []


def test_v1_only_at_a_root_that_is_not_v2_or_v3():
    assert check("meta", V1_META) == []
    assert "attrs.not-object" in rules(check("attrs", [1]))
    assert check("attrs", {"foo": 42}) == []
    # in a v2 hierarchy a root file called "meta" is just a file
    v2root = Store().put_json(".zgroup", {"zarr_format": 2})
    assert check("meta", b"anything at all", v2root) == []
    assert (
        check("attrs", b"anything", Store().put_json("zarr.json", {"zarr_format": 3, "node_type": "group"}))
        == []
    )


# --- checked without NumPy and numcodecs: what they would say ---------------------------------

_KINDS = (("b", [1]), ("i", [1, 2, 4, 8]), ("u", [1, 2, 4, 8]), ("f", [2, 4, 8]), ("c", [8, 16]))
_TYPESTRS = [
    f"{order}{kind}{size}"
    for order in "<>|"
    for kind, sizes in _KINDS
    for size in sizes
    if not (order == "|" and size > 1)
] + ["<M8[ns]", ">M8[s]", "<m8[D]", ">m8[ms]", "|S12", "<S3", "|V8", "<U5", ">U1", "|O", "|O8"]


@pytest.mark.parametrize("typestr", _TYPESTRS)
def test_a_simple_type_is_checked_as_numpy_sees_it(typestr):
    """A simple type of a size every platform has is held without NumPy (``SimpleType``): its
    kind, item size, objects and printed name are NumPy's, and so is every fill value's verdict."""
    import numpy as np

    from zarrfs.format.v2_dtypes import SimpleType, check_dtype, check_fill_value, parse_dtype

    simple, made = check_dtype(typestr), parse_dtype(typestr)
    assert isinstance(simple, SimpleType)
    assert (simple.kind, simple.itemsize, simple.hasobject, str(simple)) == (
        made.kind,
        made.itemsize,
        made.hasobject,
        str(made),
    )
    assert made == np.dtype(object if typestr[1] == "O" else typestr)
    fills = [None, 0, 1, -1, 2, 255, 256, -129, 2**31, 2**63, -(2**63) - 1, 2**64, 1.5, 3.0, "7", "x", True,
             "NaN", [1, 2], "AAAA", "AAAAAAAAAAAAAAAA", "NaT", "abcdef"]  # fmt: skip
    assert [check_fill_value(f, simple) for f in fills] == [check_fill_value(f, made) for f in fills]


def test_a_long_double_is_left_to_numpy():
    from zarrfs.format.v2_dtypes import SimpleType, check_dtype

    assert not isinstance(check_dtype("<f16"), SimpleType)
    assert not isinstance(check_dtype([["a", "<f8"]]), SimpleType)


_CONFIGS = st.one_of(
    st.fixed_dictionaries(
        {"id": st.just("blosc")},
        optional={
            "cname": st.sampled_from(["blosclz", "lz4", "lz4hc", "zlib", "zstd", "snappy", "LZ4", 1]),
            "clevel": st.integers(-2, 11) | st.sampled_from([True, 5.0]),
            "shuffle": st.integers(-3, 4),
            "blocksize": st.sampled_from([0, 1, 3, 4096, 2**20, 2**31 - 1, 2**31, -1]),
            "typesize": st.integers(1, 8),
        },
    ),
    st.fixed_dictionaries(
        {"id": st.just("zstd")},
        optional={"level": st.integers(-3, 24), "checksum": st.sampled_from([True, False, 1])},
    ),
    st.fixed_dictionaries({"id": st.sampled_from(["zlib", "gzip"])}, optional={"level": st.integers(-3, 11)}),
    st.fixed_dictionaries({"id": st.just("lz4")}, optional={"acceleration": st.integers(-1, 70000)}),
)


@settings(max_examples=400, deadline=None)
@given(config=_CONFIGS)
def test_a_compressor_passed_without_numcodecs_is_one_numcodecs_builds_and_round_trips(config):
    """The common compressors' usual settings are passed without building them
    (``known_good``): each such configuration is one numcodecs builds and round-trips here."""
    from zarrfs.format.numcodecs_configs import _check_cached, known_good

    if known_good(config):
        assert _check_cached(json.dumps(config, sort_keys=True)) is None, config


def test_a_v2_array_of_a_simple_type_and_a_common_compressor_is_checked_without_numpy():
    """A mount's first ``.zarray`` (zarr-python 2's: ``<f8``, Blosc lz4) is checked without
    importing numcodecs or NumPy (docs/performance.md, "A fresh mount's first Zarr metadata");
    a structure still imports NumPy."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import json, sys
        from zarrfs.format.validate import validate_metadata
        doc = {"zarr_format": 2, "shape": [8, 8], "chunks": [4, 4], "dtype": "<f8", "order": "C",
               "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1,
                              "blocksize": 0}, "fill_value": 0.0, "filters": None}
        assert validate_metadata("a/.zarray", json.dumps(doc).encode(), lambda k: None) == []
        for dtype, fill, compressor in [("<i2", -3, {"id": "zstd", "level": 3}), ("|b1", True, None),
                                        ("<U4", "ab", {"id": "zlib", "level": 1}),
                                        ("<M8[ns]", "NaT", {"id": "lz4", "acceleration": 1})]:
            doc.update(dtype=dtype, fill_value=fill, compressor=compressor)
            assert validate_metadata("a/.zarray", json.dumps(doc).encode(), lambda k: None) == []
        print("numcodecs" in sys.modules, "numpy" in sys.modules)
        doc.update(dtype=[["x", "<f4"], ["y", "<i8"]], fill_value=None)
        assert validate_metadata("a/.zarray", json.dumps(doc).encode(), lambda k: None) == []
        print("numpy" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]

"""Zarr v3 zarr.json rules: each refused case next to a passing neighbour."""

from __future__ import annotations

import json

import pytest
from format_cases import DROP, V3_ARRAY, Store, errors, rules, with_

from zarrfs.format import validate_metadata


def check(doc, key: str = "a/zarr.json", store: Store | None = None):
    value = doc if isinstance(doc, bytes) else json.dumps(doc, allow_nan=True).encode()
    return validate_metadata(key, value, (store or Store()).get)


BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}
SHARD = {
    "name": "sharding_indexed",
    "configuration": {
        "chunk_shape": [2, 4],
        "codecs": [BYTES_LE, {"name": "zstd", "configuration": {"level": 3, "checksum": True}}],
        "index_codecs": [BYTES_LE, {"name": "crc32c"}],
        "index_location": "end",
    },
}


def shard(**config):
    out = json.loads(json.dumps(SHARD))
    out["configuration"].update(config)
    return out


def grid(*shape):
    return {"name": "regular", "configuration": {"chunk_shape": list(shape)}}


def dtype_case(data_type, fill, codecs=(BYTES_LE,)):
    return {"data_type": data_type, "fill_value": fill, "codecs": list(codecs)}


# (bad changes, rule, good changes) applied to V3_ARRAY
ARRAY_CASES = [
    ({"zarr_format": 2}, "zarr.json.zarr-format", {"zarr_format": 3}),
    ({"node_type": "other"}, "zarr.json.node-type", {"node_type": "array"}),
    ({"codecs": DROP}, "zarr.json.missing-key", {}),
    ({"extra": 1}, "zarr.json.unknown-key", {"extra": {"must_understand": False, "x": 1}}),
    ({"extra": {"must_understand": True}}, "zarr.json.unknown-key", {}),
    ({"attributes": []}, "zarr.json.attributes", {"attributes": {"a": [1, None]}}),
    ({"shape": [10, -1]}, "zarr.json.shape", {"shape": [10, 0]}),
    ({"shape": [10, False]}, "zarr.json.shape", {"shape": [0, 0]}),
    # data types
    ({"data_type": 5}, "zarr.json.data-type", {"data_type": "float64"}),
    ({"data_type": {"configuration": {}}}, "zarr.json.data-type", {"data_type": {"name": "float64"}}),
    ({"data_type": "r7", **dtype_case("r7", [0])}, "zarr.json.data-type", dtype_case("r8", [255])),
    (
        {"data_type": {"name": "float64", "must_understand": False}},
        "zarr.json.must-understand",
        {"data_type": {"name": "float64", "must_understand": True}},
    ),
    (
        dtype_case({"name": "numpy.datetime64", "configuration": {"unit": "xs"}}, 0),
        "zarr.json.data-type-configuration",
        dtype_case({"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}}, "NaT"),
    ),
    (
        dtype_case({"name": "null_terminated_bytes", "configuration": {"length_bytes": 0}}, ""),
        "zarr.json.data-type-configuration",
        dtype_case({"name": "null_terminated_bytes", "configuration": {"length_bytes": 2}}, "YWI="),
    ),
    (
        dtype_case({"name": "fixed_length_utf32", "configuration": {"length_bytes": 6}}, ""),
        "zarr.json.data-type-configuration",
        dtype_case({"name": "fixed_length_utf32", "configuration": {"length_bytes": 8}}, "ab"),
    ),
    (
        dtype_case({"name": "structured", "configuration": {"fields": [["a"]]}}, ""),
        "zarr.json.data-type-configuration",
        dtype_case(
            {"name": "structured", "configuration": {"fields": [["a", "uint8"], ["b", "uint8"]]}}, "AAA="
        ),
    ),
    (
        dtype_case({"name": "structured", "configuration": {"fields": [["a", "string"]]}}, ""),
        "zarr.json.data-type-configuration",
        dtype_case({"name": "structured", "configuration": {"fields": [["a", "int8"]]}}, "AA=="),
    ),
    # chunk grid and key encoding
    ({"chunk_grid": {"configuration": {}}}, "zarr.json.chunk-grid", {}),
    ({"chunk_grid": grid(4, "8")}, "zarr.json.chunk-grid", {"chunk_grid": grid(4, 80)}),
    ({"chunk_grid": grid(0, 8)}, "zarr.json.chunk-grid", {"shape": [0, 20], "chunk_grid": grid(0, 8)}),
    ({"chunk_grid": grid(4)}, "zarr.json.chunk-shape-length", {"chunk_grid": grid(4, 1)}),
    (
        {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 8], "x": 1}}},
        "zarr.json.chunk-grid",
        {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 8]}}},
    ),
    (
        {"chunk_grid": dict(grid(4, 8), must_understand=False)},
        "zarr.json.chunk-grid",
        {"chunk_grid": grid(4, 8)},
    ),
    (
        {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "-"}}},
        "zarr.json.chunk-key-encoding",
        {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}},
    ),
    (
        {"chunk_key_encoding": {"name": "v2", "configuration": {"sep": "."}}},
        "zarr.json.chunk-key-encoding",
        {"chunk_key_encoding": {"name": "v2"}},
    ),
    (
        {"chunk_key_encoding": {"name": "default", "must_understand": False}},
        "zarr.json.chunk-key-encoding",
        {"chunk_key_encoding": "default"},
    ),
    # fill values
    ({"fill_value": None}, "zarr.json.fill-value", {"fill_value": 0}),
    ({"fill_value": "nope"}, "zarr.json.fill-value", {"fill_value": "-Infinity"}),
    ({"fill_value": "0x7ff8"}, "zarr.json.fill-value", {"fill_value": "0x7ff8000000000000"}),
    ({"fill_value": "0xzzzzzzzzzzzzzzzz"}, "zarr.json.fill-value", {"fill_value": 1.5}),
    ({**dtype_case("bool", 0)}, "zarr.json.fill-value", dtype_case("bool", True)),
    ({**dtype_case("int8", 200)}, "zarr.json.fill-value", dtype_case("int8", -128)),
    ({**dtype_case("uint64", -1)}, "zarr.json.fill-value", dtype_case("uint64", 2**64 - 1)),
    ({**dtype_case("int16", 1.5)}, "zarr.json.fill-value", dtype_case("int16", 7)),
    ({**dtype_case("float32", "0x7fc0")}, "zarr.json.fill-value", dtype_case("float32", "0x7fc00000")),
    ({**dtype_case("complex64", [1])}, "zarr.json.fill-value", dtype_case("complex64", [1, "NaN"])),
    (
        {**dtype_case("complex128", [0, "x"])},
        "zarr.json.fill-value",
        dtype_case("complex128", [0, "0x0000000000000000"]),
    ),
    ({**dtype_case("r16", [1, 2, 3])}, "zarr.json.fill-value", dtype_case("r16", [1, 2])),
    ({**dtype_case("r16", [1, 256])}, "zarr.json.fill-value", dtype_case("r16", [0, 255])),
    (
        dtype_case({"name": "numpy.timedelta64", "configuration": {"unit": "s", "scale_factor": 1}}, "x"),
        "zarr.json.fill-value",
        dtype_case({"name": "numpy.timedelta64", "configuration": {"unit": "s", "scale_factor": 10}}, -5),
    ),
    (
        dtype_case({"name": "raw_bytes", "configuration": {"length_bytes": 2}}, "AAAAAA=="),
        "zarr.json.fill-value",
        dtype_case({"name": "raw_bytes", "configuration": {"length_bytes": 2}}, [1, 2]),
    ),
    (
        dtype_case({"name": "fixed_length_utf32", "configuration": {"length_bytes": 4}}, 1),
        "zarr.json.fill-value",
        dtype_case({"name": "fixed_length_utf32", "configuration": {"length_bytes": 4}}, "x"),
    ),
    (
        {"data_type": "string", "fill_value": 0, "codecs": [{"name": "vlen-utf8"}]},
        "zarr.json.fill-value",
        {"data_type": "string", "fill_value": "", "codecs": [{"name": "vlen-utf8", "configuration": {}}]},
    ),
    (
        dtype_case({"name": "structured", "configuration": {"fields": [["a", "int16"]]}}, "AA=="),
        "zarr.json.fill-value",
        dtype_case({"name": "structured", "configuration": {"fields": [["a", "int16"]]}}, "AAA="),
    ),
    # codecs
    ({"codecs": []}, "zarr.json.codecs", {"codecs": [BYTES_LE]}),
    ({"codecs": {"name": "bytes"}}, "zarr.json.codecs", {"codecs": [BYTES_LE]}),
    ({"codecs": [5]}, "zarr.json.codecs", {"codecs": [BYTES_LE]}),
    (
        {"codecs": [{"name": "gzip", "configuration": {"level": 1}}, BYTES_LE]},
        "zarr.json.codecs-order",
        {"codecs": [BYTES_LE, {"name": "gzip", "configuration": {"level": 1}}]},
    ),
    (
        {"codecs": [BYTES_LE, {"name": "transpose", "configuration": {"order": [1, 0]}}]},
        "zarr.json.codecs-order",
        {"codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}}, BYTES_LE]},
    ),
    (
        {"codecs": [{"name": "crc32c"}]},
        "zarr.json.codecs-array-bytes",
        {"codecs": [BYTES_LE, {"name": "crc32c"}]},
    ),
    ({"codecs": [BYTES_LE, BYTES_LE]}, "zarr.json.codecs-array-bytes", {"codecs": [BYTES_LE]}),
    (
        {"codecs": [{"name": "bytes", "configuration": {"endian": "middle"}}]},
        "zarr.json.codec-bytes",
        {"codecs": [{"name": "bytes", "configuration": {"endian": "big"}}]},
    ),
    (
        {"codecs": [{"name": "bytes"}]},
        "zarr.json.codec-bytes-endian",
        dtype_case("uint8", 0, codecs=[{"name": "bytes"}]),
    ),
    (
        {"data_type": "string", "fill_value": "", "codecs": [BYTES_LE]},
        "zarr.json.codec-bytes",
        {"data_type": "string", "fill_value": "", "codecs": [{"name": "vlen-utf8"}]},
    ),
    (
        {"codecs": [{"name": "vlen-utf8"}]},
        "zarr.json.codec-vlen",
        {"codecs": [{"name": "endian"}], **dtype_case("int8", 0)},
    ),
    (
        {"codecs": [{"name": "transpose", "configuration": {"order": [0, 0]}}, BYTES_LE]},
        "zarr.json.codec-transpose",
        {"codecs": [{"name": "transpose", "configuration": {"order": [0, 1]}}, BYTES_LE]},
    ),
    (
        {"codecs": [{"name": "transpose", "configuration": {"order": [0, 1, 2]}}, BYTES_LE]},
        "zarr.json.codec-transpose",
        {"codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}}, BYTES_LE]},
    ),
    (
        {"codecs": [BYTES_LE, {"name": "gzip", "configuration": {"level": 10}}]},
        "zarr.json.codec-gzip",
        {"codecs": [BYTES_LE, {"name": "gzip", "configuration": {"level": 9}}]},
    ),
    (
        {"codecs": [BYTES_LE, {"name": "zstd", "configuration": {"level": "x"}}]},
        "zarr.json.codec-zstd",
        {"codecs": [BYTES_LE, {"name": "zstd", "configuration": {"level": -5, "checksum": False}}]},
    ),
    (
        {"codecs": [BYTES_LE, {"name": "zstd", "configuration": {"level": 1, "checksum": 1}}]},
        "zarr.json.codec-zstd",
        {"codecs": [BYTES_LE, {"name": "zstd", "configuration": {"level": 1}}]},
    ),
    (
        {
            "codecs": [
                BYTES_LE,
                {"name": "blosc", "configuration": {"cname": "x", "clevel": 5, "shuffle": "noshuffle"}},
            ]
        },
        "zarr.json.codec-blosc",
        {
            "codecs": [
                BYTES_LE,
                {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "noshuffle"}},
            ]
        },
    ),
    (
        {
            "codecs": [
                BYTES_LE,
                {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 5, "shuffle": "shuffle"}},
            ]
        },
        "zarr.json.codec-blosc",
        {
            "codecs": [
                BYTES_LE,
                {
                    "name": "blosc",
                    "configuration": {
                        "cname": "zstd",
                        "clevel": 5,
                        "shuffle": "bitshuffle",
                        "typesize": 8,
                        "blocksize": 0,
                    },
                },
            ]
        },
    ),
    (
        {"codecs": [BYTES_LE, {"name": "crc32c", "configuration": {"x": 1}}]},
        "zarr.json.codec-crc32c",
        {"codecs": [BYTES_LE, {"name": "crc32c", "configuration": {}}]},
    ),
    (
        {"codecs": [BYTES_LE, {"name": "numcodecs.zlib", "configuration": {"level": 42}}]},
        "zarr.json.codec-numcodecs",
        {"codecs": [BYTES_LE, {"name": "numcodecs.zlib", "configuration": {"level": 1}}]},
    ),
    (
        {"codecs": [{"name": "numcodecs.delta", "configuration": {}}, BYTES_LE]},
        "zarr.json.codec-numcodecs",
        {"codecs": [{"name": "numcodecs.delta", "configuration": {"dtype": "<f8"}}, BYTES_LE]},
    ),
    # sharding
    ({"codecs": [shard(chunk_shape=[2])]}, "zarr.json.codec-sharding", {"codecs": [shard()]}),
    (
        {"codecs": [shard(chunk_shape=[3, 4])]},
        "zarr.json.codec-sharding-chunk-shape",
        {"codecs": [shard(chunk_shape=[4, 8])]},
    ),
    (
        {"codecs": [shard(index_location="middle")]},
        "zarr.json.codec-sharding",
        {"codecs": [shard(index_location="start")]},
    ),
    (
        {"codecs": [shard(codecs=[{"name": "crc32c"}])]},
        "zarr.json.codec-sharding-codecs-array-bytes",
        {"codecs": [shard()]},
    ),
    (
        {"codecs": [shard(index_codecs=[BYTES_LE, {"name": "gzip", "configuration": {"level": 1}}])]},
        "zarr.json.codec-sharding-index",
        {"codecs": [shard(index_codecs=[{"name": "bytes", "configuration": {"endian": "big"}}])]},
    ),
    (
        {"codecs": [shard(index_codecs=[{"name": "bytes"}])]},
        "zarr.json.codec-bytes-endian",
        {"codecs": [shard(index_codecs=[BYTES_LE])]},
    ),
    (
        {"codecs": [{"name": "sharding_indexed", "configuration": {}}]},
        "zarr.json.codec-sharding",
        {"codecs": [shard()]},
    ),
    # other members
    ({"dimension_names": ["x"]}, "zarr.json.dimension-names", {"dimension_names": ["x", None]}),
    ({"dimension_names": ["x", 1]}, "zarr.json.dimension-names", {"dimension_names": None}),
    ({"storage_transformers": {}}, "zarr.json.storage-transformers", {"storage_transformers": []}),
    (
        {"storage_transformers": [3]},
        "zarr.json.storage-transformers",
        {"storage_transformers": [{"name": "x", "must_understand": False}]},
    ),
]


@pytest.mark.parametrize("bad,rule,good", ARRAY_CASES, ids=[c[1] for c in ARRAY_CASES])
def test_array_rule(bad, rule, good):
    assert rule in rules(check(with_(V3_ARRAY, **bad)))
    assert errors(check(with_(V3_ARRAY, **good))) == []


def test_a_raw_type_is_named_by_its_whole_name():
    """``r8`` and a newline is no raw type (a pattern's ``$`` matches before a last newline):
    an unknown type, which is a warning, where ``r8`` itself is checked and passes."""
    assert [p.rule for p in check(with_(V3_ARRAY, **dtype_case("r8", [255])))] == []
    newline = check(with_(V3_ARRAY, **dtype_case("r8\n", [0])))
    assert [p.rule for p in newline] == ["zarr.json.data-type-unknown"]


@pytest.mark.parametrize(
    "changes,rule",
    [
        ({"data_type": "float8_e4m3fn", "fill_value": 0, "codecs": [{"name": "bytes"}]}, None),
        ({"data_type": "bfloat16", "fill_value": "0x7fc0"}, None),
        (
            {"data_type": {"name": "x.fancy", "configuration": {"a": 1}}, "fill_value": None},
            "zarr.json.data-type-unknown",
        ),
        ({"chunk_grid": {"name": "rectilinear", "configuration": {}}}, "zarr.json.chunk-grid-unknown"),
        ({"chunk_key_encoding": {"name": "fancy"}}, "zarr.json.chunk-key-encoding-unknown"),
        ({"codecs": [BYTES_LE, {"name": "x.new-codec"}]}, "zarr.json.codec-unknown"),
        ({"codecs": [BYTES_LE, {"name": "numcodecs.not-installed-here"}]}, "zarr.json.codec-unknown"),
        ({"codecs": [{"name": "x.new-array-to-bytes"}]}, "zarr.json.codec-unknown"),
        ({"codecs": [{"name": "x.optional", "must_understand": False}, BYTES_LE]}, None),
        (
            {"codecs": [{"name": "transpose", "configuration": {"order": "F"}}, BYTES_LE]},
            "zarr.json.codec-transpose",
        ),
        ({"storage_transformers": [{"name": "x.tx"}]}, "zarr.json.storage-transformer-unknown"),
        ({"fill_value": "1.5"}, "zarr.json.fill-value"),
        ({**dtype_case("int32", 3.0), "codecs": [BYTES_LE]}, "zarr.json.fill-value"),
        ({**dtype_case("int32", "3"), "codecs": [BYTES_LE]}, "zarr.json.fill-value"),
        ({"attributes": {"x": float("nan")}}, "zarr.json.nan-literal"),
    ],
)
def test_array_warnings_are_not_errors(changes, rule):
    problems = check(with_(V3_ARRAY, **changes))
    assert errors(problems) == []
    if rule is None:
        assert problems == []
    else:
        assert rule in rules(problems, "warning")


GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}


def consolidated(entries, **extra):
    return {"kind": "inline", "must_understand": False, "metadata": entries, **extra}


def test_group_rules():
    assert check(GROUP) == []
    assert check(with_(GROUP, attributes=DROP)) == []
    assert "zarr.json.attributes" in rules(check(with_(GROUP, attributes=5)))
    assert "zarr.json.unknown-key" in rules(check(with_(GROUP, shape=[1])))
    assert check(with_(GROUP, ext={"must_understand": False})) == []
    assert "zarr.json.zarr-format" in rules(check(with_(GROUP, zarr_format="3")))
    assert "zarr.json.not-object" in rules(check([GROUP]))
    assert "zarr.json.invalid" in rules(check(b'{"zarr_format": 3,'))


def test_group_consolidated_metadata():
    sub = {"zarr_format": 3, "node_type": "group", "consolidated_metadata": consolidated({})}
    good = with_(GROUP, consolidated_metadata=consolidated({"a": sub, "a/b": V3_ARRAY}))
    assert check(good) == []
    assert check(with_(GROUP, consolidated_metadata=None)) == []
    no_mu = with_(GROUP, consolidated_metadata={"kind": "inline", "metadata": {}})
    assert "zarr.json.unknown-key" in rules(check(no_mu))
    kind = with_(GROUP, consolidated_metadata=consolidated({}, kind="other"))
    assert "zarr.json.consolidated-metadata" in rules(check(kind))
    bad_entry = with_(GROUP, consolidated_metadata=consolidated({"a/b": with_(V3_ARRAY, shape=[1])}))
    assert "zarr.json.consolidated.chunk-shape-length" in rules(check(bad_entry))
    not_obj = with_(GROUP, consolidated_metadata=consolidated({"a": 1}))
    assert "zarr.json.consolidated-metadata" in rules(check(not_obj))
    bad_name = with_(GROUP, consolidated_metadata=consolidated({"a/../b": sub}))
    assert "zarr.json.consolidated-metadata" in rules(check(bad_name))
    v2 = {"x": {"zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "<i4"}}
    assert "zarr.json.consolidated.zarray.missing-key" in rules(
        check(with_(GROUP, consolidated_metadata=consolidated(v2)))
    )


def test_v3_hierarchy_warnings():
    store = Store().put_json("arr/zarr.json", V3_ARRAY)
    inside = check(GROUP, "arr/sub/zarr.json", store)
    assert errors(inside) == [] and "hierarchy.node-inside-array" in rules(inside, "warning")
    store = Store().put_json("g/zarr.json", GROUP)
    assert check(V3_ARRAY, "g/arr/zarr.json", store) == []


def test_a_v3_array_of_core_codecs_is_checked_without_numcodecs():
    """numcodecs (with its registry's entry points) is imported at the first codec it builds, and
    NumPy at the first dtype made, not with the checks: a mount's first commit of a zarr-python 3
    array of a core type pays neither import (docs/performance.md, "A fresh mount's first Zarr
    metadata: numpy's import"). A v2 compressor outside the common settings still is built by
    numcodecs (``numcodecs_configs.known_good``)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import json, sys
        from zarrfs.format.validate import validate_metadata
        doc = {"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "float32",
               "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
               "chunk_key_encoding": {"name": "default"}, "fill_value": 0.0, "attributes": {},
               "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                          {"name": "blosc", "configuration": {"typesize": 4, "cname": "lz4",
                           "clevel": 5, "shuffle": "shuffle", "blocksize": 0}}]}
        assert validate_metadata("a/zarr.json", json.dumps(doc).encode(), lambda k: None) == []
        print("numcodecs" in sys.modules, "numpy" in sys.modules)
        for name, fill in [("int64", -2**63), ("uint8", 255), ("complex64", ["NaN", 1.5]),
                           ("bool", True), ("float16", "0x7c00"), ("r16", [1, 2])]:
            doc.update(data_type=name, fill_value=fill, codecs=doc["codecs"][:1])
            assert validate_metadata("a/zarr.json", json.dumps(doc).encode(), lambda k: None) == []
        print("numpy" in sys.modules)
        v2 = {"zarr_format": 2, "shape": [8], "chunks": [4], "dtype": "<f4", "order": "C",
              "compressor": {"id": "bz2", "level": 1}, "fill_value": 0, "filters": None}
        assert validate_metadata("b/.zarray", json.dumps(v2).encode(), lambda k: None) == []
        print("numcodecs" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False", "True"]

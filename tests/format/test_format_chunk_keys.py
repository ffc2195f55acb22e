"""Chunk key rules for keys committed inside arrays (validate_data_key)."""

from __future__ import annotations

import pytest
from format_cases import V1_META, V2_ARRAY, V3_ARRAY, Store, rules, with_

from zarrfs.format import find_array, validate_data_key
from zarrfs.format.chunk_keys import ChunkGrid


def v3_enc(name, sep=None):
    enc = {"name": name}
    if sep is not None:
        enc["configuration"] = {"separator": sep}
    return enc


STORE = (
    Store()
    .put_json(".zgroup", {"zarr_format": 2})
    .put_json("dot/.zarray", V2_ARRAY)  # shape 10x20, chunks 4x8: grid 3x3
    .put_json("slash/.zarray", with_(V2_ARRAY, dimension_separator="/"))
    .put_json("scalar/.zarray", with_(V2_ARRAY, shape=[], chunks=[]))
    .put_json("g/.zgroup", {"zarr_format": 2})
    .put_json("g/deep/arr/.zarray", with_(V2_ARRAY, shape=[5], chunks=[5]))
    .put_json("v3/zarr.json", {"zarr_format": 3, "node_type": "group"})
    .put_json("v3/a/zarr.json", V3_ARRAY)
    .put_json("v3/dots/zarr.json", with_(V3_ARRAY, chunk_key_encoding=v3_enc("default", ".")))
    .put_json("v3/v2enc/zarr.json", with_(V3_ARRAY, chunk_key_encoding=v3_enc("v2")))
    .put_json("v3/v2slash/zarr.json", with_(V3_ARRAY, chunk_key_encoding=v3_enc("v2", "/")))
    .put_json("v3/short/zarr.json", with_(V3_ARRAY, chunk_key_encoding="default"))
    .put_json(
        "v3/scalar/zarr.json",
        with_(V3_ARRAY, shape=[], chunk_grid={"name": "regular", "configuration": {"chunk_shape": []}}),
    )
    .put_json(
        "v3/scalar2/zarr.json",
        with_(
            V3_ARRAY,
            shape=[],
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": []}},
            chunk_key_encoding=v3_enc("v2"),
        ),
    )
    .put_json("v3/rect/zarr.json", with_(V3_ARRAY, chunk_grid={"name": "rectilinear", "configuration": {}}))
    .put_json("v3/fancy/zarr.json", with_(V3_ARRAY, chunk_key_encoding={"name": "fancy"}))
    .put_json("v3/tx/zarr.json", with_(V3_ARRAY, storage_transformers=[{"name": "x.tx"}]))
)
STORE["broken/.zarray"] = b"{not json"


# (refused key, rule, neighbouring accepted key)
CASES = [
    ("dot/0.0.0", "chunk-key.dimensions", "dot/0.0"),
    ("dot/0", "chunk-key.dimensions", "dot/2.2"),
    ("dot/3.0", "chunk-key.out-of-grid", "dot/2.0"),
    ("dot/0.3", "chunk-key.out-of-grid", "dot/0.2"),
    ("dot/0/0", "chunk-key.separator", "dot/1.1"),
    ("dot/a.0", "chunk-key.not-integer", "dot/1.0"),
    ("dot/-1.0", "chunk-key.not-integer", "dot/0.1"),
    ("dot/01.0", "chunk-key.not-integer", "dot/1.0"),
    ("dot/foo", "chunk-key.not-integer", "dot/0.0"),
    ("dot/1\n.0", "chunk-key.not-integer", "dot/1.0"),  # a newline is no digit, last or not
    ("dot/1.0\n", "chunk-key.not-integer", "dot/1.0"),
    ("dot/\u0661.0", "chunk-key.not-integer", "dot/1.0"),  # a digit, not an ASCII one
    ("slash/0.0", "chunk-key.separator", "slash/0/0"),
    ("slash/0/0/0", "chunk-key.dimensions", "slash/2/2"),
    ("slash/3/0", "chunk-key.out-of-grid", "slash/0/2"),
    ("scalar/0.0", "chunk-key.format", "scalar/0"),
    ("scalar/1", "chunk-key.format", "scalar/0"),
    ("g/deep/arr/1", "chunk-key.out-of-grid", "g/deep/arr/0"),
    ("v3/a/0/0", "chunk-key.format", "v3/a/c/0/0"),
    ("v3/a/c.0.0", "chunk-key.format", "v3/a/c/2/2"),
    ("v3/a/c/0.0", "chunk-key.separator", "v3/a/c/0/1"),
    ("v3/a/c/3/0", "chunk-key.out-of-grid", "v3/a/c/2/0"),
    ("v3/a/c/0", "chunk-key.dimensions", "v3/a/c/1/2"),
    ("v3/a/c", "chunk-key.format", "v3/a/c/0/0"),
    ("v3/dots/c/0/0", "chunk-key.format", "v3/dots/c.0.0"),
    ("v3/v2enc/c/0/0", "chunk-key.not-integer", "v3/v2enc/0.0"),
    ("v3/v2enc/0/0", "chunk-key.separator", "v3/v2enc/2.2"),
    ("v3/v2slash/0.0", "chunk-key.separator", "v3/v2slash/0/0"),
    ("v3/short/c.0.0", "chunk-key.format", "v3/short/c/0/0"),
    ("v3/scalar/c/0", "chunk-key.format", "v3/scalar/c"),
    ("v3/scalar/0", "chunk-key.format", "v3/scalar/c"),
    ("v3/scalar2/c", "chunk-key.format", "v3/scalar2/0"),
]


@pytest.mark.parametrize("bad,rule,good", CASES, ids=[c[0] for c in CASES])
def test_chunk_key_rule(bad, rule, good):
    assert rule in rules(validate_data_key(bad, STORE.get))
    assert validate_data_key(good, STORE.get) == []


@pytest.mark.parametrize(
    "key",
    [
        "dot/.zarray",  # metadata keys are validate_metadata's business
        "dot/.zattrs",
        "dot/0.0.0123456789abcdef0123456789abcdef.partial",  # temporaries
        "dot/0.0a1b2c3d4e5f60718293a4b5c6d7e8f9.partial",
        "dot/.0.0.aB3dE9",
        "dot/.DS_Store",
        "v3/a/zarr.5ac0ffee5ac0ffee5ac0ffee5ac0ffee.partial",
        "v3/a/__ext/anything",  # v3 reserves __ names for extensions
        "readme.txt",  # not inside any array
        "g/notes/whatever",
        "v3/notes.md",
        "broken/0.0.0",  # metadata unreadable: nothing to judge against
        "v3/rect/c/9/9",  # unknown grid
        "v3/fancy/anything",  # unknown key encoding
        "v3/tx/anything",  # storage transformer may move keys
    ],
)
def test_keys_not_judged(key):
    assert validate_data_key(key, STORE.get) == []


def test_innermost_array_wins():
    store = Store().put_json("a/.zarray", with_(V2_ARRAY, dimension_separator="/"))
    store.put_json("a/b/.zarray", with_(V2_ARRAY, shape=[2], chunks=[1]))
    assert validate_data_key("a/b/1", store.get) == []
    assert validate_data_key("a/0/0", store.get) == []
    assert "chunk-key.out-of-grid" in rules(validate_data_key("a/b/2", store.get))


def test_v1_root_array():
    store = Store().put_json("meta", V1_META).put_json("attrs", {})
    assert validate_data_key("2.2", store.get) == []
    assert "chunk-key.out-of-grid" in rules(validate_data_key("3.2", store.get))
    assert "chunk-key.separator" in rules(validate_data_key("0/0", store.get))
    # a root "meta" that is not v1 metadata does not make an array
    other = Store()
    other["meta"] = b"hello"
    assert validate_data_key("anything", other.get) == []


def test_empty_dimension_has_no_chunks():
    store = Store().put_json("e/.zarray", with_(V2_ARRAY, shape=[0, 20]))
    assert "chunk-key.out-of-grid" in rules(validate_data_key("e/0.0", store.get))


def test_grid_round_trip():
    for grid in [
        ChunkGrid((10, 20), (4, 8), ".", "v2"),
        ChunkGrid((10, 20), (4, 8), "/", "v2"),
        ChunkGrid((10, 20), (4, 8), "/", "default"),
        ChunkGrid((10, 20), (4, 8), ".", "default"),
        ChunkGrid((), (), "/", "default"),
        ChunkGrid((), (), ".", "v2"),
    ]:
        for coords in [(0, 0), (2, 2), (1, 0)] if grid.shape else [()]:
            assert grid.parse(grid.key(coords)) == coords


@pytest.mark.parametrize("bad,rule,good", CASES[:6] + CASES[-8:], ids=[c[0] for c in CASES[:6] + CASES[-8:]])
def test_batched_lookups_give_the_same_answers(bad, rule, good):
    calls = []

    def get_many(keys):
        calls.append(keys)
        return [STORE.get(k) for k in keys]

    def no_single_gets(key):
        raise AssertionError(f"unexpected get({key!r})")

    assert rule in rules(validate_data_key(bad, no_single_gets, get_many))
    assert validate_data_key(good, no_single_gets, get_many) == []
    assert len(calls) == 2  # one batch per key
    prefix, info = find_array(good, no_single_gets, get_many)
    assert info.chunk_coords(good) is not None and good.startswith(prefix + "/")

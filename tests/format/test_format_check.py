"""The whole-store checker (check_items) behind ``zarrfs check``."""

from __future__ import annotations

import json

from format_cases import V2_ARRAY, V3_ARRAY, Store, errors, rules, with_

from zarrfs.format import build_consolidated, build_consolidated_v3, check_items, dumps_consolidated


def run(store: Store, get=None):
    return list(check_items(sorted(store.items()), get or store.get))


def clean_v2() -> Store:
    store = Store().put_json(".zgroup", {"zarr_format": 2}).put_json(".zattrs", {})
    store.put_json("a/.zarray", V2_ARRAY).put_json("a/.zattrs", {"_ARRAY_DIMENSIONS": ["y", "x"]})
    for i in range(3):
        for k in range(3):
            store[f"a/{i}.{k}"] = b"chunk"
    store[".zmetadata"] = dumps_consolidated(build_consolidated(store.items()))
    return store


def test_clean_store_has_no_problems():
    assert run(clean_v2()) == []


def test_every_kind_of_problem_is_reported():
    store = clean_v2()
    store["a/3.0"] = b"out of the grid"
    store["a/0.0.0123456789abcdef0123456789abcdef.partial"] = b"leftover"
    store["bad\\name"] = b"x"
    store.put_json("b/.zarray", with_(V2_ARRAY, order="Z"))
    store["b/0.0"] = b"chunk of an array whose metadata is invalid: not judged"
    store.put_json("a/.zattrs", {"_ARRAY_DIMENSIONS": ["x"]})
    found = run(store)
    assert {
        "chunk-key.out-of-grid",
        "name.backslash",
        "zarray.order",
        "zattrs.array-dimensions-length",
        "zmetadata.stale",  # an error: a reader trusting the document sees other metadata
    } == rules(found)
    assert "key.temporary" in rules(found, "warning")
    # .zmetadata no longer matches: b/.zarray is missing from it, a/.zattrs differs
    stale = [p for p in found if p.rule == "zmetadata.stale"]
    assert {p.key for p in stale} == {".zmetadata"}
    assert any("'a/.zattrs' differs" in p.value for p in stale)
    assert any("'b/.zarray' is missing" in p.value for p in stale)


def test_stale_entries_and_missing_entries():
    store = clean_v2()
    store.put_json("c/.zgroup", {"zarr_format": 2})
    doc = json.loads(store[".zmetadata"])
    doc["metadata"]["gone/.zarray"] = V2_ARRAY
    store[".zmetadata"] = dumps_consolidated(doc)
    values = {p.value for p in run(store) if p.rule == "zmetadata.stale"}
    assert values == {
        "consolidated metadata is stale: 'c/.zgroup' is missing from it",
        "consolidated metadata is stale: entry 'gone/.zarray' has no document in the store",
    }


def test_many_stale_entries_are_summarised():
    store = clean_v2()
    doc = json.loads(store[".zmetadata"])
    for i in range(60):
        doc["metadata"][f"g{i}/.zgroup"] = {"zarr_format": 2}
    store[".zmetadata"] = dumps_consolidated(doc)
    stale = [p for p in run(store) if p.rule == "zmetadata.stale"]
    assert len(stale) == 51 and stale[-1].value.startswith("... and 10 more")


def test_consolidated_in_a_subgroup():
    store = clean_v2()
    store.put_json("sub/.zgroup", {"zarr_format": 2}).put_json("sub/x/.zarray", V2_ARRAY)
    inner = [(k[len("sub/") :], v) for k, v in store.items() if k.startswith("sub/")]
    store["sub/.zmetadata"] = dumps_consolidated(build_consolidated(inner))
    found = run(store)
    assert [p for p in found if p.key == "sub/.zmetadata"] == []
    assert "zmetadata.stale" in rules(found)  # an error: the root one misses the sub entries


def test_v3_consolidated():
    store = Store().put_json("g/zarr.json", {"zarr_format": 3, "node_type": "group"})
    store.put_json("g/a/zarr.json", V3_ARRAY)
    store["g/a/c/0/0"] = b"chunk"
    store.put_json("g/deep/er/zarr.json", V3_ARRAY)  # g/deep has no zarr.json: a stand-in entry
    root = {"zarr_format": 3, "node_type": "group", "attributes": {}}
    root["consolidated_metadata"] = build_consolidated_v3(store.items())
    store.put_json("zarr.json", root)
    assert run(store) == []
    store.put_json("g/b/zarr.json", V3_ARRAY)
    store["g/a/c/9/0"] = b"bad"
    found = run(store)
    assert rules(found) == {"chunk-key.out-of-grid", "zarr.json.consolidated-stale"}
    stale = [p.value for p in found if p.rule == "zarr.json.consolidated-stale"]
    assert stale == ["consolidated metadata is stale: 'g/b' is missing from it"]


def test_metadata_lookups_are_memoised():
    store = Store().put_json("a/.zarray", with_(V2_ARRAY, shape=[1000], chunks=[1], dimension_separator="/"))
    for i in range(1000):
        store[f"a/{i}"] = b"x"
    calls = []

    def counting_get(key):
        calls.append(key)
        return store.get(key)

    assert errors(run(store, counting_get)) == []
    assert len(calls) < 20

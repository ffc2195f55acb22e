"""Live consolidated metadata: .zmetadata (v2) and the inline map of a v3 root zarr.json."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import zarr
from format_cases import V2_ARRAY, V3_ARRAY, dir_getter, dir_keys, with_

from zarrfs.format import (
    FormatError,
    build_consolidated,
    build_consolidated_v3,
    consolidated_update,
    consolidated_update_v3,
    dumps_consolidated,
    dumps_zarr_json,
    load_consolidated,
)
from zarrfs.format.consolidated import V2_JSON

pytestmark = pytest.mark.filterwarnings("ignore")


def j(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


def reference_v2(doc) -> bytes:
    """What zarr-python 2's json_dumps produces."""
    return json.dumps(doc, **V2_JSON).encode("ascii")


BASE = {
    "metadata": {".zgroup": {"zarr_format": 2}, ".zattrs": {}, "a/.zarray": V2_ARRAY, "a/.zattrs": {"x": 1}},
    "zarr_consolidated_format": 1,
}


def test_update_v2_nothing_to_do():
    assert consolidated_update(None, "a/.zarray", j(V2_ARRAY)) is None
    for key in ("a/0.0", ".zmetadata", "a/zarr.json", "meta"):
        assert consolidated_update(BASE, key, b"{}") is None
    assert consolidated_update(BASE, "b/.zarray", None) is None  # deleting what is not there
    assert consolidated_update(BASE, "a/.zattrs", j({"x": 1})) is None  # same document
    assert consolidated_update({"metadata": [1]}, "a/.zattrs", b"{}") is None


def test_update_v2_changes_copy_on_write():
    before = copy.deepcopy(BASE)
    new = consolidated_update(BASE, "a/.zattrs", j({"x": 2}))
    assert new["metadata"]["a/.zattrs"] == {"x": 2}
    assert BASE == before  # the cached input is never modified
    added = consolidated_update(new, "b/c/.zgroup", j({"zarr_format": 2}))
    assert added["metadata"]["b/c/.zgroup"] == {"zarr_format": 2} and "b/c/.zgroup" not in new["metadata"]
    gone = consolidated_update(added, "a/.zarray", None)
    assert "a/.zarray" not in gone["metadata"] and "a/.zarray" in added["metadata"]
    assert gone["zarr_consolidated_format"] == 1
    with pytest.raises(FormatError):
        consolidated_update(BASE, "a/.zattrs", b"{not json")


def test_dumps_v2_matches_zarr_python_2_formatting():
    doc = with_(BASE, metadata={**BASE["metadata"], "é/.zattrs": {"ü": [1.5, float("nan"), {}], "b": []}})
    assert dumps_consolidated(doc) == reference_v2(doc)
    empty = {"metadata": {}, "zarr_consolidated_format": 1}
    assert dumps_consolidated(empty) == reference_v2(empty)
    assert dumps_consolidated(build_consolidated([])) == reference_v2(empty)


def test_dumps_v2_after_many_updates_stays_exact():
    doc = load_consolidated(reference_v2(BASE))
    rng = np.random.default_rng(0)
    for i in range(200):
        key = f"g{rng.integers(20)}/{['.zarray', '.zattrs', '.zgroup'][i % 3]}"
        value = None if i % 7 == 0 else j({"i": i, "nested": {"k": [i, "x"]}})
        new = consolidated_update(doc, key, value)
        if new is not None:
            doc = new
        if i % 10 == 0:
            assert dumps_consolidated(doc) == reference_v2(doc)
    assert dumps_consolidated(doc) == reference_v2(doc)


def test_build_v2():
    items = [
        (".zgroup", j({"zarr_format": 2})),
        ("a/.zarray", j(V2_ARRAY)),
        ("a/0.0", b"\x00binary"),
        ("a/zarr.json", j({})),
        ("b/.zattrs", b"{broken"),
        (".zmetadata", j(BASE)),
    ]
    doc = build_consolidated(items)
    assert doc == {
        "metadata": {".zgroup": {"zarr_format": 2}, "a/.zarray": V2_ARRAY},
        "zarr_consolidated_format": 1,
    }


def test_unchanged_entries_are_not_serialised_again(monkeypatch):
    from zarrfs.format import consolidated

    entries = {f"arr{i}/.zarray": with_(V2_ARRAY, shape=[i, 20]) for i in range(3000)}
    doc = build_consolidated([(k, j(v)) for k, v in entries.items()])
    first = dumps_consolidated(doc)
    changed = consolidated_update(doc, "arr5/.zattrs", j({"units": "K"}))
    kept = [k for k in doc.fragments if k in changed.fragments]
    assert len(kept) == 3000 and all(changed.fragments[k][2] is doc.fragments[k][2] for k in kept)

    # Counted, not timed: serialising the changed document encodes only the new entry (its
    # key and value) and the document's frame, not the 3,000 kept ones.
    calls = []

    class CountingJson:
        @staticmethod
        def dumps(obj, **opts):
            calls.append(obj)
            return json.dumps(obj, **opts)

    monkeypatch.setattr(consolidated, "json", CountingJson)
    text = dumps_consolidated(changed)
    monkeypatch.undo()
    assert text == reference_v2(changed) and len(text) > len(first)
    assert len(calls) <= 4, len(calls)


def test_zarr_python_3_reads_our_zmetadata(tmp_path):
    path = str(tmp_path / "h.zarr")
    root = zarr.open_group(path, mode="w", zarr_format=2)
    root.create_array("a", shape=(4,), dtype="i4")
    zarr.consolidate_metadata(path)
    get = dir_getter(path)
    doc = load_consolidated(get(".zmetadata"))
    # a new array arrives after consolidation: the filesystem would apply it like this
    root.create_array("b", shape=(5, 6), chunks=(5, 3), dtype="f8")
    for key in ("b/.zarray", "b/.zattrs"):
        doc = consolidated_update(doc, key, get(key)) or doc
    with open(os.path.join(path, ".zmetadata"), "wb") as f:
        f.write(dumps_consolidated(doc))
    g = zarr.open_consolidated(path, zarr_format=2)
    assert g["b"].shape == (5, 6) and g["b"].chunks == (5, 3)


# --- v3 ----------------------------------------------------------------------------------------

GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}
EMPTY_CM = {"kind": "inline", "must_understand": False, "metadata": {}}


def root_doc(entries=None):
    return {**GROUP, "consolidated_metadata": {**EMPTY_CM, "metadata": entries or {}}}


def test_update_v3_nothing_to_do():
    assert consolidated_update_v3(None, "a/zarr.json", j(V3_ARRAY)) is None
    assert consolidated_update_v3(GROUP, "a/zarr.json", j(V3_ARRAY)) is None  # not consolidated
    assert consolidated_update_v3(root_doc(), "zarr.json", j(GROUP)) is None  # the root itself
    assert consolidated_update_v3(root_doc(), "a/.zarray", j(V2_ARRAY)) is None
    assert consolidated_update_v3(root_doc(), "a/zarr.json", None) is None
    doc = root_doc({"a": V3_ARRAY})
    assert consolidated_update_v3(doc, "a/zarr.json", j(V3_ARRAY)) is None


def test_update_v3_entries():
    doc = root_doc()
    before = copy.deepcopy(doc)
    doc2 = consolidated_update_v3(doc, "x/y/arr/zarr.json", j(V3_ARRAY))
    assert doc == before
    meta = doc2["consolidated_metadata"]["metadata"]
    # ancestors get stand-in group entries, in zarr-python's order: shallow first, then by name
    assert list(meta) == ["x", "x/y", "x/y/arr"]
    assert meta["x"]["node_type"] == "group" and meta["x"]["consolidated_metadata"] == EMPTY_CM
    doc3 = consolidated_update_v3(doc2, "x/zarr.json", j({**GROUP, "attributes": {"a": 1}}))
    assert doc3["consolidated_metadata"]["metadata"]["x"]["attributes"] == {"a": 1}
    assert doc3["consolidated_metadata"]["metadata"]["x"]["consolidated_metadata"] == EMPTY_CM
    doc4 = consolidated_update_v3(doc3, "B/zarr.json", j(GROUP))
    assert list(doc4["consolidated_metadata"]["metadata"]) == ["B", "x", "x/y", "x/y/arr"]
    # deleting a leaf removes it; deleting a group with entries below leaves a stand-in
    doc5 = consolidated_update_v3(doc4, "x/y/arr/zarr.json", None)
    assert "x/y/arr" not in doc5["consolidated_metadata"]["metadata"]
    doc6 = consolidated_update_v3(doc4, "x/zarr.json", None)
    assert doc6["consolidated_metadata"]["metadata"]["x"]["attributes"] == {}
    assert consolidated_update_v3(doc6, "x/zarr.json", None) is None
    for d in (doc2, doc3, doc4, doc5, doc6):
        assert dumps_zarr_json(d) == json.dumps(d, indent=2).encode()


def test_build_v3():
    items = [
        ("zarr.json", j(GROUP)),
        ("a/b/zarr.json", j(V3_ARRAY)),
        ("a/b/c/0/0", b"x"),
        ("c/zarr.json", j(GROUP)),
    ]
    cm = build_consolidated_v3(items)
    assert list(cm["metadata"]) == ["a", "c", "a/b"]
    assert cm["metadata"]["a/b"] == V3_ARRAY and cm["must_understand"] is False


def test_zarr_python_3_reads_our_v3_consolidated_metadata(tmp_path):
    path = str(tmp_path / "h3.zarr")
    root = zarr.open_group(path, mode="w")
    root.create_group("g").create_array("a", shape=(4,), dtype="i4")
    zarr.consolidate_metadata(path)
    get = dir_getter(path)
    assert dumps_zarr_json(load_consolidated(get("zarr.json"))) == get("zarr.json")
    doc = load_consolidated(get("zarr.json"))
    root.create_group("g/h/i").create_array("b", shape=(3, 7), chunks=(3, 3), dtype="u2")
    for key in dir_keys(path):
        if key.endswith("zarr.json"):
            doc = consolidated_update_v3(doc, key, get(key)) or doc
    with open(os.path.join(path, "zarr.json"), "wb") as f:
        f.write(dumps_zarr_json(doc))
    g = zarr.open_consolidated(path)
    assert g["g/h/i/b"].shape == (3, 7)
    assert sorted(k for k, _ in g.members(max_depth=None)) == ["g", "g/a", "g/h", "g/h/i", "g/h/i/b"]
    # and it equals what zarr-python itself consolidates
    zarr.consolidate_metadata(path)
    assert json.loads(get("zarr.json"))["consolidated_metadata"] == doc["consolidated_metadata"]

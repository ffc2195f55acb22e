"""Consolidated metadata that stays true through a mount (``consolidate=auto``): a rewritten
document's mtime moves, a stale document is rebuilt rather than patched, and a client writing
an outdated copy cannot make it stale; ``zarrfs check`` fails on stale documents and
``zarrfs consolidate`` rebuilds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import zarr
from mounting import needs_fuse, stored

from zarrfs.backends import open_driver

pytestmark = needs_fuse


def entries(url: str, key: str = ".zmetadata") -> dict:
    return json.loads(stored(url, key))["metadata"]


def hierarchy_v2(root) -> None:
    g = zarr.open_group(root, mode="w", zarr_format=2, attributes={"t": 1})
    g.create_array("a", shape=(4,), chunks=(2,), dtype="i2")
    g.create_group("sub").create_array("b", shape=(3,), chunks=(3,), dtype="f4")
    zarr.consolidate_metadata(root)


def test_a_rewritten_document_gets_a_new_mtime(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    hierarchy_v2(m.path / "h")
    before = os.stat(m.path / "h/.zmetadata").st_mtime_ns
    zarr.open_group(m.path / "h", mode="r+", use_consolidated=False)["a"].attrs["units"] = "K"
    assert entries(db_url, "h/.zmetadata")["a/.zattrs"] == {"units": "K"}
    assert os.stat(m.path / "h/.zmetadata").st_mtime_ns > before


def test_a_stale_document_is_rebuilt_not_patched(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    hierarchy_v2(m.path / "h")
    m.stop()
    with open_driver(db_url) as d:  # a writer that bypassed the mount left it stale
        doc = json.loads(d.get("h/.zmetadata"))
        del doc["metadata"]["sub/b/.zarray"], doc["metadata"]["sub/.zgroup"]
        d.put("h/.zmetadata", json.dumps(doc).encode())
    m = mount_factory(db_url, name="again")
    zarr.open_group(m.path / "h", mode="r+", use_consolidated=False).attrs["t"] = 2
    got = entries(db_url, "h/.zmetadata")
    assert got[".zattrs"] == {"t": 2}
    assert "sub/b/.zarray" in got and "sub/.zgroup" in got  # rebuilt from what is stored
    assert zarr.open_consolidated(m.path / "h", zarr_format=2)["sub/b"].shape == (3,)


def test_a_client_writing_an_outdated_copy_cannot_make_it_stale(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    hierarchy_v2(m.path / "h")
    outdated = (m.path / "h/.zmetadata").read_bytes()
    zarr.open_group(m.path / "h", mode="r+", use_consolidated=False).create_array(
        "new", shape=(2,), chunks=(2,), dtype="u1"
    )
    (m.path / "h/.zmetadata").write_bytes(outdated)  # its own copy, from before "new"
    assert "new/.zarray" in entries(db_url, "h/.zmetadata")
    # zarr-python 3 rewrites a v3 group's zarr.json, consolidated map included, from the copy
    # it opened, when it changes the group's attributes
    g3 = zarr.open_group(m.path / "v3", mode="w", zarr_format=3)
    g3.create_array("x", shape=(2,), chunks=(2,), dtype="u1")
    zarr.consolidate_metadata(m.path / "v3")
    opened = zarr.open_consolidated(m.path / "v3", zarr_format=3)
    zarr.open_group(m.path / "v3", mode="r+", use_consolidated=False).create_array(
        "y", shape=(2,), chunks=(2,), dtype="u1"
    )
    opened.attrs["changed"] = True
    root = json.loads(stored(db_url, "v3/zarr.json"))
    assert root["attributes"] == {"changed": True}
    assert set(root["consolidated_metadata"]["metadata"]) == {"x", "y"}
    assert sorted(zarr.open_consolidated(m.path / "v3", zarr_format=3).array_keys()) == ["x", "y"]


@pytest.mark.parametrize("where", ["url", "folder"])
def test_check_fails_on_stale_documents_and_consolidate_rebuilds_them(where, tmp_path):
    folder = tmp_path / "plain"
    hierarchy_v2(folder / "h")
    target = str(folder)
    if where == "url":
        url = f"lmdb://{tmp_path}/db.lmdb"
        subprocess.run([sys.executable, "-m", "zarrfs", "copy", str(folder), url], check=True)
        with open_driver(url) as d:
            d.put("h/sub/b/.zattrs", b'{"late": 1}')
        target = url
    else:
        (folder / "h/sub/b/.zattrs").write_text('{"late": 1}')

    def zarrfs(*args):
        return subprocess.run([sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True)

    if where == "url":
        res = zarrfs("check", target)
        assert res.returncode == 1 and "zmetadata.stale" in res.stdout, res.stdout + res.stderr
    res = zarrfs("consolidate", target)
    assert res.returncode == 0 and "rebuilt 1" in res.stderr, res.stderr
    got = entries(target, "h/.zmetadata") if where == "url" else json.loads(
        (folder / "h/.zmetadata").read_text()
    )["metadata"]
    assert got["sub/b/.zattrs"] == {"late": 1}
    if where == "url":
        assert zarrfs("check", target).returncode == 0
    res = zarrfs("consolidate", target)
    assert res.returncode == 0 and "rebuilt 0" in res.stderr  # nothing stale any more

"""``zarrfs copy`` / ``zarrfs.copy`` between folders, database URLs and zarr-python 3 stores:
byte-exact, if_exists, dry runs, consolidated metadata included."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import zarr
from numpy.testing import assert_array_equal
from zarr.storage import LocalStore, MemoryStore

import zarrfs
from zarrfs.backends import open_driver
from zarrfs.tools.copy import CopyError


def _hierarchy(store) -> None:
    g = zarr.open_group(store, mode="w", zarr_format=2)
    g.attrs["title"] = "copied"
    g.create_array("a", data=np.arange(20, dtype="i4"), chunks=(6,))
    g.create_group("sub").create_array("b", data=np.ones((3, 3)), chunks=(2, 2))
    zarr.consolidate_metadata(store)


def _keys(url: str) -> dict[str, bytes]:
    with open_driver(url, readonly=True) as d:
        return dict(d.scan(fetch="values"))


@pytest.fixture(params=["lmdb", "sqlite", "redis"])
def url(request, tmp_path):
    from mounting import make_url

    return make_url(request.param, tmp_path, request)


def test_between_a_zarr3_store_a_database_and_a_folder_byte_exact(url, tmp_path):
    mem = MemoryStore()
    _hierarchy(mem)
    done = zarrfs.copy(mem, url)
    stored = _keys(url)
    assert done.keys == len(stored) and ".zmetadata" in stored and "sub/b/1.1" in stored
    out = tmp_path / "out"
    zarrfs.copy(url, str(out))
    zarrfs.copy(str(out), str(tmp_path / "again"))  # folder -> folder
    assert (tmp_path / "again" / ".zmetadata").read_bytes() == stored[".zmetadata"]
    g = zarr.open_consolidated(str(out), zarr_format=2)
    assert g.attrs["title"] == "copied"
    assert_array_equal(g["a"][:], np.arange(20))
    assert_array_equal(g["sub/b"][:], np.ones((3, 3)))
    for key, value in stored.items():  # byte for byte, chunks never decoded
        assert (out / key).read_bytes() == value
    local = LocalStore(tmp_path / "local")
    zarrfs.copy(url, local)  # a database -> any zarr-python 3 store
    assert (tmp_path / "local" / "sub/b/.zarray").read_bytes() == stored["sub/b/.zarray"]


def test_if_exists_and_dry_run(tmp_path):
    src = tmp_path / "src"
    (src / "g").mkdir(parents=True)
    for name in ("x", "y", "z"):
        (src / "g" / name).write_bytes(name.encode() * 3)
    url = f"lmdb://{tmp_path}/db.lmdb"
    assert zarrfs.copy(str(src), f"lmdb://{tmp_path}/none.lmdb", dry_run=True).keys == 3
    assert not (tmp_path / "none.lmdb").exists()  # a dry run creates nothing
    with open_driver(url) as d:
        d.put("g/y", b"kpt")  # the size the source's has: skip takes it as copied whole
        d.put("g/z", b"z")  # a shorter one: what an interrupted copy left, copied again by skip
    with pytest.raises(CopyError, match="g/y"):
        zarrfs.copy(str(src), url, if_exists="raise")
    assert _keys(url) == {"g/y": b"kpt", "g/z": b"z"}  # nothing copied
    dry = zarrfs.copy(str(src), url, if_exists="skip", dry_run=True)
    assert (dry.keys, dry.skipped) == (2, 1) and _keys(url) == {"g/y": b"kpt", "g/z": b"z"}
    done = zarrfs.copy(str(src), url, if_exists="skip")
    assert (done.keys, done.skipped) == (2, 1)
    assert _keys(url) == {"g/x": b"xxx", "g/y": b"kpt", "g/z": b"zzz"}
    zarrfs.copy(str(src), url)  # replace, the default
    assert _keys(url)["g/y"] == b"yyy"


def test_command_line_options(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "k").write_bytes(b"v")
    url = f"sqlite://{tmp_path}/db.sqlite"

    def run(*args):
        return subprocess.run([sys.executable, "-m", "zarrfs", "copy", *args], capture_output=True, text=True)

    res = run("--dry-run", str(src), url)
    assert res.returncode == 0 and "would copy 1 keys" in res.stderr and not (tmp_path / "db.sqlite").exists()
    assert run(str(src), url).returncode == 0
    res = run("--if-exists", "raise", str(src), url)
    assert res.returncode == 1 and "nothing was copied" in res.stderr and len(res.stderr.splitlines()) == 1
    res = run("--if-exists", "skip", str(src), url)
    assert res.returncode == 0 and "skipped 1" in res.stderr


def test_names_that_are_not_utf8_get_the_mounts_keys_and_come_back(tmp_path):
    """A folder name or file name that is not UTF-8 (a Latin-1 tarball's) is copied to the key a
    mount gives it (U+EF80 + byte, ``fs.names``), and a copy back to a folder restores its bytes."""
    src = os.fsencode(tmp_path / "src")
    os.makedirs(os.path.join(src, b"caf\xe9"))
    with open(os.path.join(src, b"caf\xe9", b"na\xefve"), "wb") as fh:
        fh.write(b"latin-1")
    url = f"sqlite://{tmp_path}/db.sqlite"
    zarrfs.copy(str(tmp_path / "src"), url)
    assert _keys(url) == {"caf\uefe9/na\uefefve": b"latin-1"}
    zarrfs.copy(url, str(tmp_path / "back"))
    back = os.fsencode(tmp_path / "back")
    assert os.listdir(back) == [b"caf\xe9"]
    with open(os.path.join(back, b"caf\xe9", b"na\xefve"), "rb") as fh:
        assert fh.read() == b"latin-1"

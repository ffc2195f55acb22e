"""Command-line pieces that need no mount: reindex, copy."""

from __future__ import annotations

import subprocess
import sys
import uuid

from zarrfs.backends import open_driver


def zarrfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=120
    )


def test_reindex_lists_keys_another_client_added(redis_server):
    prefix = f"r{uuid.uuid4().hex[:8]}"
    url = redis_server.url(0, prefix=prefix)
    with open_driver(url) as driver:
        driver.put("g/a", b"1")  # the index exists from now on
    redis_server.client().set(f"{prefix}:g/b", b"2")  # as zarr-python 2's RedisStore writes
    with open_driver(url) as driver:
        assert [k for k, _ in driver.scan("g/", "g0")] == ["g/a"]
    result = zarrfs("reindex", url)
    assert result.returncode == 0, result.stderr
    assert "indexed 2 keys" in result.stderr
    with open_driver(url) as driver:
        assert [k for k, _ in driver.scan("g/", "g0")] == ["g/a", "g/b"]


def test_reindex_refuses_a_database_without_an_index(tmp_path):
    open_driver(f"sqlite://{tmp_path}/x.sqlite").close()
    result = zarrfs("reindex", f"sqlite://{tmp_path}/x.sqlite")
    assert result.returncode == 2
    assert "keeps no index" in result.stderr


def test_copy_folder_to_database_and_back(tmp_path):
    src = tmp_path / "src"
    (src / "arr/0").mkdir(parents=True)
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    (src / "arr/0/0").write_bytes(b"\x00\x01")
    url = f"lmdb://{tmp_path}/db.lmdb"
    assert zarrfs("copy", str(src), url).returncode == 0
    with open_driver(url) as driver:
        assert driver.scan(fetch="values") == [(".zgroup", b'{"zarr_format": 2}'), ("arr/0/0", b"\x00\x01")]
    out = tmp_path / "out"
    assert zarrfs("copy", url, str(out)).returncode == 0
    assert (out / "arr/0/0").read_bytes() == b"\x00\x01"

"""Snapshot mounts (``-o snapshot``): one committed state of an LMDB, SQLite or PostgreSQL
database, unchanged while a writer appends to an array through another mount: listings,
sizes, contents and consolidated metadata all stay those of the moment it was mounted."""

from __future__ import annotations

import errno
import json
import os
import time

import numpy as np
import pytest
from mounting import make_url, needs_fuse, zarrfs

pytestmark = needs_fuse


def _tree(root) -> dict[str, bytes]:
    """Every file under ``root``: its content, read whole, checked against its size."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as fh:
                data = fh.read()
            assert os.path.getsize(path) == len(data)
            found[os.path.relpath(path, root)] = data
    return found


def _wait(predicate, what: str, deadline: float = 30.0) -> None:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _append(folder, rows: np.ndarray) -> None:
    import zarr

    arr = zarr.open_array(str(folder / "x"), mode="r+")
    start = arr.shape[0]
    arr.resize((start + rows.shape[0], arr.shape[1]))
    arr[start:] = rows
    zarr.consolidate_metadata(str(folder))


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "postgres"])
def test_a_snapshot_stays_the_state_of_its_mount_while_a_writer_appends(
    kind, tmp_path, request, mount_factory
):
    import zarr

    url = make_url(kind, tmp_path, request)
    writer = mount_factory(url, ["create"])
    root = zarr.open_group(str(writer.path), mode="a", zarr_format=2)
    first = np.arange(40, dtype="i4").reshape(4, 10)
    root.create_array("x", shape=first.shape, chunks=(2, 10), dtype="i4")[:] = first
    zarr.consolidate_metadata(str(writer.path))

    snap = mount_factory(url, ["snapshot"])
    live = mount_factory(url)
    before = _tree(snap.path)
    assert ".zmetadata" in before and os.path.join("x", "1.0") in before
    status = zarrfs("status", str(snap.path)).stdout
    assert "snapshot" in status and "costs the writers" in status and "held at most 3600 s" in status

    for step in range(3):
        _append(writer.path, np.full((2, 10), 100 + step, dtype="i4"))
        rows = 6 + 2 * step
        # Another mount sees the append (so it is committed)...
        _wait(lambda r=rows: zarr.open_array(str(live.path / "x"), mode="r").shape[0] == r, "the append")
        # ... and the snapshot reads exactly what it read at mount time.
        assert _tree(snap.path) == before
        arr = zarr.open_consolidated(str(snap.path), mode="r")["x"]
        assert arr.shape == (4, 10)
        np.testing.assert_array_equal(arr[:], first)
        np.testing.assert_array_equal(zarr.open_array(str(snap.path / "x"), mode="r")[:], first)

    with pytest.raises(OSError) as err:
        (snap.path / "x" / "9.0").write_bytes(b"x")
    assert err.value.errno == errno.EROFS


def test_a_postgresql_snapshot_is_named_and_joined_by_another_mount(tmp_path, request, mount_factory):
    url = make_url("postgres", tmp_path, request)
    writer = mount_factory(url, ["create"])
    (writer.path / "a").write_bytes(b"first")
    snap = mount_factory(url, ["snapshot"])
    (writer.path / "a").write_bytes(b"second")
    name = json.loads(zarrfs("status", str(snap.path), "--json").stdout)["version"]["name"]
    assert name
    joined = mount_factory(url, [f"snapshot={name}"])
    assert (joined.path / "a").read_bytes() == b"first"
    assert (snap.path / "a").read_bytes() == b"first"


def test_a_snapshot_held_to_its_limit_is_unmounted_with_a_message(tmp_path, request, mount_factory):
    url = make_url("lmdb", tmp_path, request)
    writer = mount_factory(url, ["create"])
    (writer.path / "a").write_bytes(b"first")
    snap = mount_factory(url, ["snapshot,snapshot_hold=2"])
    assert (snap.path / "a").read_bytes() == b"first"
    _wait(lambda: not snap.mounted(), "the unmount at the limit", deadline=60)
    assert "the snapshot was held 2 s, the limit of -o snapshot_hold=" in snap.log_text()


def test_redis_refuses_a_snapshot_with_one_line(tmp_path, request):
    url = make_url("redis", tmp_path, request)
    where = tmp_path / "m"
    where.mkdir()
    result = zarrfs("mount", url, str(where), "-o", "snapshot", check=False)
    assert result.returncode != 0 and not os.path.ismount(where)
    assert "keeps no state a reader can hold" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    lmdb = make_url("lmdb", tmp_path, request)
    zarrfs("copy", str(tmp_path / "m"), lmdb)  # an empty database
    refused = zarrfs("mount", lmdb, str(where), "-o", "snapshot=x", check=False)
    assert refused.returncode != 0 and "cannot name a state" in refused.stderr

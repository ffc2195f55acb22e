"""zarr-sqlite's file format (its SPEC.md 1.0: a ``zarr(k TEXT PRIMARY KEY, v BLOB)`` table and a
``sqlitestore_metadata`` table of three records, the ``.zarrdb`` extension): a file made by the
spec, with Python's ``sqlite3`` module here, through a mount of its bare path, a URL and
``zarrfs copy``; a database zarrfs makes carries the spec's records; a file whose
``incompatible_flags`` name a feature is refused in one line."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
import zarr
from mounting import zarrfs
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

SPEC_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sqlitestore_metadata(k TEXT PRIMARY KEY, v TEXT);"
    "CREATE TABLE IF NOT EXISTS zarr(k TEXT PRIMARY KEY, v BLOB);"
)
DATA = np.arange(30, dtype="i2").reshape(5, 6)


def _spec_file(path, incompatible: str = "") -> None:
    """A zarr-sqlite file as its spec describes it, holding the array ``a`` (``DATA``)."""
    memory = zarr.storage.MemoryStore()
    zarr.open_group(memory, mode="w", zarr_format=3).create_array("a", data=DATA, chunks=(2, 3))
    items = {k: sync(memory.get(k, default_buffer_prototype())).to_bytes() for k in sync(_keys(memory))}
    with sqlite3.connect(path) as db:
        db.executescript(SPEC_SCHEMA)
        db.executemany(
            "INSERT INTO sqlitestore_metadata VALUES (?, ?)",
            [("sqlitestore_version", "1.0"), ("compatible_flags", ""), ("incompatible_flags", incompatible)],
        )
        db.executemany("INSERT INTO zarr VALUES (?, ?)", items.items())
    db.close()


async def _keys(store) -> list[str]:
    return [k async for k in store.list()]


def _records(path) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT k, v FROM sqlitestore_metadata").fetchall()
    db.close()
    return dict(rows)


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    db.close()
    return {name for (name,) in rows}


def test_a_spec_made_file_by_url_and_zarrfs_copy(tmp_path):
    spec = tmp_path / "made.zarrdb"
    _spec_file(spec)
    np.testing.assert_array_equal(zarr.open_array(f"sqlite://{spec}/a", mode="r")[:], DATA)
    b = zarr.open_group(f"sqlite://{spec}", mode="a").create_array("b", shape=(3,), dtype="u1")
    b[:] = 9
    with sqlite3.connect(spec) as db:  # written in the spec's table, as a zarr-sqlite reader reads it
        assert db.execute("SELECT count(*) FROM zarr WHERE k = 'b/zarr.json'").fetchone() == (1,)
    db.close()
    assert _records(spec) == {"sqlitestore_version": "1.0", "compatible_flags": "", "incompatible_flags": ""}
    # zarrfs copy takes a bare .zarrdb path as SQLite, both ways; the new file is declared
    zarrfs("copy", str(spec), str(tmp_path / "folder"))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "folder" / "a"), mode="r")[:], DATA)
    zarrfs("copy", str(tmp_path / "folder"), str(tmp_path / "new.zarrdb"))
    assert _records(tmp_path / "new.zarrdb")["sqlitestore_version"] == "1.0"
    assert {"zarr", "sqlitestore_metadata", "zarrfs_side"} <= _tables(tmp_path / "new.zarrdb")
    np.testing.assert_array_equal(zarr.open_array(f"sqlite://{tmp_path}/new.zarrdb/b", mode="r")[:], [9] * 3)


def test_a_database_zarrfs_makes_is_declared_and_an_old_one_left_as_it_was(tmp_path):
    from zarrfs.store import DatabaseStore

    for name in ("x.sqlite", "x.zarrdb"):
        store = DatabaseStore(f"sqlite://{tmp_path}/{name}")
        store.set_sync("k", zarr.core.buffer.cpu.Buffer.from_bytes(b"v"))
        store.close()
        assert _records(tmp_path / name) == {
            "sqlitestore_version": "1.0",
            "compatible_flags": "",
            "incompatible_flags": "",
        }
    with sqlite3.connect(tmp_path / "old.sqlite") as db:  # zarr-python 2's SQLiteStore's table only
        db.execute("CREATE TABLE zarr(k TEXT PRIMARY KEY, v BLOB)")
    db.close()
    store = DatabaseStore(f"sqlite://{tmp_path}/old.sqlite")
    store.set_sync("k", zarr.core.buffer.cpu.Buffer.from_bytes(b"v"))
    store.close()
    assert "sqlitestore_metadata" not in _tables(tmp_path / "old.sqlite")


def test_incompatible_flags_are_refused_in_one_line(tmp_path):
    spec = tmp_path / "future.zarrdb"
    _spec_file(spec, incompatible="compressed_chunks")
    with pytest.raises(Exception, match="incompatible_flags 'compressed_chunks'") as err:
        zarr.open_array(f"sqlite://{spec}/a", mode="r")
    assert "\n" not in str(err.value)
    out = zarrfs("copy", str(spec), str(tmp_path / "out"), check=False)
    assert out.returncode != 0 and "incompatible_flags" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_bare_zarrdb_path_mounts_as_sqlite(tmp_path, mount_factory):
    spec = tmp_path / "made.zarrdb"
    _spec_file(spec)
    m = mount_factory(str(spec))
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "a"), mode="r")[:], DATA)
    (m.path / "note").write_bytes(b"through the mount")
    m.stop()
    with sqlite3.connect(spec) as db:
        assert db.execute("SELECT v FROM zarr WHERE k = 'note'").fetchone() == (b"through the mount",)
    db.close()
    assert _records(spec)["incompatible_flags"] == ""

"""The SQLite driver's own tables in a database it makes: the records (and the parts of large
files) with rowids, the change log trimmed in batches; and databases earlier versions made,
which keep their layout and read the same: records with rowids and a log trimmed an entry at a
time ("earlier"), records without rowids (made so for a while: "rowless")."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.base import PARTS, SIDE
from zarrfs.backends.sqlite import feed

EARLIER_SIDE = "CREATE TABLE zarrfs_side(k TEXT PRIMARY KEY, v BLOB)"
ROWLESS_SIDE = "CREATE TABLE zarrfs_side(k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID"


def _earlier_database(path) -> None:
    """A database as an earlier version made it: records with rowids, the log's triggers
    trimming one entry an entry."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA page_size = 32768")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE zarr(k TEXT PRIMARY KEY, v BLOB)")
    conn.execute(EARLIER_SIDE)
    conn.execute(feed.CREATE_LOG)
    for table, number in (("zarr", 0), ("zarrfs_side", 1)):
        for event, what, row in (("i", "INSERT", "NEW"), ("u", "UPDATE", "NEW"), ("d", "DELETE", "OLD")):
            conn.execute(
                f"CREATE TRIGGER zarrfs_log_{table}_{event} AFTER {what} ON {table} BEGIN "
                f"INSERT INTO zarrfs_changes(s, k) VALUES ({number}, {row}.k); "
                f"DELETE FROM zarrfs_changes WHERE id = last_insert_rowid() - {feed.KEEP}; END"
            )
    conn.close()


def _schema(path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return {name: sql for name, sql in conn.execute("SELECT name, sql FROM sqlite_master")}
    finally:
        conn.close()


def _rowless_database(path) -> None:
    """A database as zarrfs made it for a while: records without rowids, the log's triggers
    trimming in batches (made by the driver, on a side table made first)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA page_size = 32768")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(ROWLESS_SIDE)
    conn.close()


@pytest.fixture(params=["here", "earlier", "rowless"])
def made(request):
    """Who made the database: this version, or an earlier one (see the module docstring)."""
    return request.param


@pytest.fixture
def opened(tmp_path, made):
    """The database's path and a driver on it, the database made by ``made``."""
    path = tmp_path / "db.sqlite"
    if made == "earlier":
        _earlier_database(path)
    elif made == "rowless":
        _rowless_database(path)
    d = open_driver(f"sqlite://{path}")
    yield path, d
    d.close()


def test_records_are_read_whole_and_in_ranges_with_rowids_or_without(opened, made):
    path, d = opened
    value = bytes(range(256)) * 3
    d.transact(lambda t: t.put("x:a/b", value, SIDE))
    assert d.transact(lambda t: t.read("x:a/b", 5, 300, SIDE), write=False) == value[5:305]
    assert d.transact(lambda t: t.read("x:a/b", 700, 300, SIDE), write=False) == value[700:]
    assert d.transact(lambda t: t.read("x:a/b", 900, 10, SIDE), write=False) == b""
    assert d.transact(lambda t: t.read("x:none", 0, 10, SIDE), write=False) is None
    assert d.transact(lambda t: t.get("x:a/b", SIDE), write=False) == value
    side = _schema(path)["zarrfs_side"]
    # Made here: with rowids; made earlier: kept as it was.
    assert ("WITHOUT ROWID" in side) == (made == "rowless"), side


def test_a_range_of_a_large_files_part_is_read_without_reading_the_whole_part(opened, made):
    # The parts of large files are 16 MiB values in the side table: a read of a few KiB of one
    # (a page the kernel asks for) must not copy the whole part out of the database.
    _, d = opened
    part = bytes(range(256)) * 4096 * 4  # 4 MiB
    d.transact(lambda t: t.put("p:abc/00000001", part, PARTS))
    statements: list[str] = []
    conn = d._conn()  # the connection of this thread, which runs the transactions below
    conn.set_trace_callback(statements.append)
    try:
        got = d.transact(lambda t: t.read("p:abc/00000001", 3 << 20, 4096, PARTS), write=False)
        tail = d.transact(lambda t: t.read("p:abc/00000001", len(part) - 10, 4096, PARTS), write=False)
    finally:
        conn.set_trace_callback(None)
    assert got == part[3 << 20 : (3 << 20) + 4096]
    assert tail == part[-10:]
    whole = [s for s in statements if s.startswith("SELECT v FROM zarrfs_side")]
    # Only a table without rowids has no other way.
    assert bool(whole) == (made == "rowless"), statements


def test_the_log_stays_bounded_and_a_reader_behind_its_trimmed_end_is_told_something_changed(opened, made):
    path, d = opened
    behind, _ = d.changes(None)
    # Another program writes (zarr-python's SQLiteStore would): one entry a key.
    writer = sqlite3.connect(path, isolation_level=None)
    total = feed.KEEP + 3 * feed.PRUNE + 17
    counts = []
    for start in range(0, total, 500):
        writer.execute("BEGIN")
        writer.executemany(
            "INSERT INTO zarr(k, v) VALUES (?, ?)",
            [(f"c/{i}", b"v") for i in range(start, min(start + 500, total))],
        )
        writer.execute("COMMIT")
        counts.append(writer.execute("SELECT count(*) FROM zarrfs_changes").fetchone()[0])
    low, high = writer.execute("SELECT min(id), max(id) FROM zarrfs_changes").fetchone()
    writer.close()
    bound = feed.KEEP + (0 if made == "earlier" else feed.PRUNE - 1)
    assert max(counts) <= bound, counts
    assert counts[-1] >= feed.KEEP
    assert high - low + 1 == counts[-1]  # no hole: what is left is the newest entries
    # A reader whose cursor is past the trimmed end is told the keys written since.
    near = (behind[0], high - 10)
    _, records = d.changes(near)
    assert records is not None and sorted(k for _, k in records) == sorted(
        f"c/{i}" for i in range(total - 10, total)
    )
    # One behind it: "not known what".
    _, records = d.changes(behind)
    assert records is None


def test_a_database_without_rowids_is_named_in_one_log_line_saying_what_to_do(tmp_path, caplog):
    slow, fast = tmp_path / "slow.sqlite", tmp_path / "fast.sqlite"
    _rowless_database(slow)
    with caplog.at_level(logging.WARNING, logger="zarrfs.backends.sqlite"):
        open_driver(f"sqlite://{slow}").close()
        open_driver(f"sqlite://{fast}").close()
    said = [r.getMessage() for r in caplog.records if "rowids" in r.getMessage()]
    assert len(said) == 1 and str(slow) in said[0] and "zarrfs copy" in said[0], said

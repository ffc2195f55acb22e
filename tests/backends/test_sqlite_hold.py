"""Values held on SQLite (zarrfs.backends.sqlite.holder): an open file's content is kept the
version the open found by a read transaction held on a connection of its own, and read only
when a descriptor first reads it; bounded in number and time, let go before a checkpoint that
must pass every reader, and at the last close."""

from __future__ import annotations

import os
import sqlite3

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.heldvalues import Held, hold
from zarrfs.backends.sqlite import holder as sqlite_hold
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.tree import Tree

MIB = 1 << 20


@pytest.fixture
def driver(tmp_path):
    d = open_driver(f"sqlite://{tmp_path}/db.sqlite")
    yield d
    d.close()


def held_value(driver, key: str) -> Held:
    _, value = hold(driver, lambda t, view: (None, view(key)))
    assert value is not None
    return value


@pytest.fixture
def reads(monkeypatch):
    """The values read through held transactions, by size, in order."""
    done: list[int] = []
    read = sqlite_hold.Unread.read

    def counted(self):
        if self.got is None:
            done.append(self.size)
        return read(self)

    monkeypatch.setattr(sqlite_hold.Unread, "read", counted)
    return done


def test_a_held_value_is_read_when_asked_and_is_the_version_the_hold_found(driver, reads):
    first = os.urandom(MIB)
    driver.put("c", first)
    value = held_value(driver, "c")
    assert value.held and value.size == MIB and reads == []
    for i in range(10):
        driver.put("c", os.urandom(MIB))
        if i % 2:
            driver.delete("c")
    assert value.data == first and reads == [MIB]
    assert value.data == first and reads == [MIB]  # read once
    value.let_go()
    assert not value.held and value.data == first and driver.holder.since == {}


def test_small_values_are_copies_and_a_missing_key_holds_nothing(driver, tmp_path):
    driver.put("small", b"x" * 100)
    value = held_value(driver, "small")
    assert not value.held and value.data == b"x" * 100
    # Values another writer stored as TEXT, or NULL, are read at once, as bytes.
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        conn.execute("INSERT INTO zarr VALUES ('text', ?)", ("é" * MIB,))
        conn.execute("INSERT INTO zarr VALUES ('null', NULL)")
    text = held_value(driver, "text")
    assert not text.held and text.data == "é".encode() * MIB
    assert held_value(driver, "null").data == b""
    _, missing = hold(driver, lambda t, view: (None, view("nothing")))
    assert missing is None and driver.holder.since == {}


def test_holds_are_bounded_in_number_and_time(driver, monkeypatch):
    monkeypatch.setattr(sqlite_hold, "SECONDS", 3600.0)
    n = sqlite_hold.MOST + 3
    for i in range(n):
        driver.put(f"c{i}", bytes([i]) * (128 << 10))
    values = [held_value(driver, f"c{i}") for i in range(n)]
    assert len(driver.holder.since) == sqlite_hold.MOST
    assert [v.held for v in values] == [False] * 3 + [True] * sqlite_hold.MOST  # oldest let go
    assert all(v.data == bytes([i]) * (128 << 10) for i, v in enumerate(values))
    monkeypatch.setattr(sqlite_hold, "SECONDS", 0.0)
    driver.put("another", b"z")  # a write transaction lets go of those held too long
    assert driver.holder.since == {} and not any(v.held for v in values)
    assert all(v.data == bytes([i]) * (128 << 10) for i, v in enumerate(values))


def test_sync_lets_go_first_so_its_checkpoint_reaches_the_last_commit(driver, tmp_path):
    """A held reader stops a checkpoint at its snapshot: ``sync()`` lets go of every value
    first, so the WAL is copied (and synced) up to the last commit."""
    driver.put("c", b"1" * MIB)
    value = held_value(driver, "c")
    driver.put("d", b"2" * MIB)
    driver.sync()
    assert not value.held and value.data == b"1" * MIB
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        busy, log, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and log == copied


def test_the_open_file_table_reads_only_what_is_read_and_lets_go_at_the_last_close(driver, reads):
    tree = Tree(driver)
    table = HandleTable(tree)
    writer = table.create("c", 0o644, os.O_WRONLY, 0, 0)
    table.write(writer, b"1" * MIB, 0)
    table.release(writer)
    a = table.open("c", os.O_RDONLY)  # an open whose reader the kernel serves: never read
    table.release(a)
    assert reads == [] and driver.holder.since == {}
    a = table.open("c", os.O_RDONLY)
    b = table.open("c", os.O_RDONLY)  # a second descriptor shares what the first took
    assert len(driver.holder.since) == 1
    other = HandleTable(Tree(driver))  # another mount replaces the file
    w = other.open("c", os.O_WRONLY | os.O_TRUNC)
    other.write(w, b"2" * MIB, 0)
    other.release(w)
    assert bytes(table.read(a, 10, MIB - 10)) == b"1" * 10
    table.release(a)
    assert bytes(table.read(b, 10, 0)) == b"1" * 10
    table.release(b)
    assert driver.holder.since == {} and reads == [MIB]
    c = table.open("c", os.O_RDONLY)
    assert bytes(table.read(c, 10, 0)) == b"2" * 10
    table.release(c)
    assert driver.holder.since == {}


def test_closing_the_driver_reads_what_it_holds(tmp_path):
    driver = open_driver(f"sqlite://{tmp_path}/db.sqlite")
    driver.put("c", b"7" * MIB)
    value = held_value(driver, "c")
    driver.close()
    assert not value.held and value.data == b"7" * MIB


def test_a_database_outside_wal_mode_holds_nothing(tmp_path):
    """A reader held on a database with a rollback journal would keep every writer out: such a
    database (zarr-python 2's SQLiteStore leaves it so), mounted read-only, is read at once."""
    path = tmp_path / "store.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE zarr(k TEXT PRIMARY KEY, v BLOB)")
        conn.execute("INSERT INTO zarr VALUES ('c', ?)", (b"5" * MIB,))
    driver = open_driver(f"sqlite://{path}", readonly=True)
    try:
        assert driver.holder is None
        value = held_value(driver, "c")
        assert not value.held and value.data == b"5" * MIB
    finally:
        driver.close()


def test_a_value_released_unread_is_not_read_through_its_reused_connection(driver):
    """The connection of a released value goes back to the pool and holds the next value's
    transaction: a late read of the first (another thread that took it before the release)
    is refused, never answered from the next transaction's snapshot."""
    from zarrfs.backends.base import BackendError

    driver.put("c", b"1" * MIB)
    value = held_value(driver, "c")
    unread = value._value
    value.release()
    driver.put("c", b"2" * MIB)
    again = held_value(driver, "c")  # on the same connection, now idle
    with pytest.raises(BackendError):
        unread.read()
    assert again.data == b"2" * MIB
    again.release()


def test_an_open_runs_each_statement_once_and_begins_only_where_it_reads(driver, monkeypatch):
    """An open begins its transaction before its probe: the probe is not run again when the
    value is located (a read transaction begins at its second statement and runs its first
    again). An open of a file last seen larger than it reads reads no value and begins no
    transaction."""
    statements: list[str] = []
    take = sqlite_hold.Holder._take

    def traced(self):
        conn = take(self)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite_hold.Holder, "_take", traced)
    driver.put("c", b"1" * MIB)  # as another program stores it
    tree = Tree(driver)
    table = HandleTable(tree)
    assert tree.find("c") is not None  # seen by a lookup, as the kernel's open follows one
    fh = table.open("c", os.O_RDONLY)
    table.release(fh)
    assert statements[0] == "BEGIN" and statements[-1] == "ROLLBACK"
    assert len(statements) == len(set(statements)), statements  # none twice
    statements.clear()
    node, value = tree.version("c", MIB // 2)
    assert node is not None and node.size == MIB and value is None
    assert statements and "BEGIN" not in statements and "ROLLBACK" not in statements, statements

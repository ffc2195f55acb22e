"""Values read in place on LMDB (zarrfs.backends.lmdb.holder): an open file's content is a view of
the memory map, held by a read transaction that keeps it the version read however the
database changes meanwhile, bounded in number and time, and let go (copied out) before a map
grows; the open-file table lets go of it at the last close."""

from __future__ import annotations

import os

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.heldvalues import Held, hold
from zarrfs.backends.lmdb import holder as lmdb_hold
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.tree import Tree

MIB = 1 << 20


@pytest.fixture
def driver(tmp_path):
    d = open_driver(f"lmdb://{tmp_path}/db.lmdb")
    yield d
    d.close()


def held_value(driver, key: str) -> Held:
    _, value = hold(driver, lambda t, view: (None, view(key)))
    assert value is not None
    return value


def test_a_held_value_is_a_view_that_stays_the_version_read(driver):
    """Overwritten and deleted many times after the hold, the key's pages would be reused by
    LMDB (a view after its transaction ended would show them); the held view does not move."""
    first = os.urandom(MIB)
    driver.put("c", first)
    value = held_value(driver, "c")
    assert value.held and isinstance(value.data, memoryview)
    for i in range(40):
        driver.put("c", os.urandom(MIB))
        driver.put(f"other{i}", os.urandom(MIB // 2))
        if i % 2:
            driver.delete("c")
    assert value.data == first
    value.let_go()  # copied out, transaction ended
    assert not value.held and isinstance(value.data, bytes) and value.data == first
    assert driver.holder.since == {}


def test_small_values_and_other_drivers_are_copies(driver, tmp_path):
    driver.put("small", b"x" * 100)
    value = held_value(driver, "small")
    assert not value.held and value.data == b"x" * 100
    dbm = open_driver(f"dbm://{tmp_path}/db.dbm")
    try:
        dbm.put("c", b"y" * MIB)
        value = held_value(dbm, "c")
        assert not value.held and value.data == b"y" * MIB
    finally:
        dbm.close()


def test_holds_are_bounded_in_number_and_time(driver, monkeypatch):
    # The number first, with no time bound to meet on a busy machine; then the time, made 0.
    monkeypatch.setattr(lmdb_hold, "SECONDS", 3600.0)
    for i in range(lmdb_hold.MOST + 3):
        driver.put(f"c{i}", bytes([i]) * (128 << 10))
    values = [held_value(driver, f"c{i}") for i in range(lmdb_hold.MOST + 3)]
    assert len(driver.holder.since) == lmdb_hold.MOST
    assert [v.held for v in values] == [False] * 3 + [True] * lmdb_hold.MOST  # oldest let go
    assert all(v.data == bytes([i]) * (128 << 10) for i, v in enumerate(values))
    monkeypatch.setattr(lmdb_hold, "SECONDS", 0.0)
    driver.put("another", b"z")  # a write transaction lets go of those held too long
    assert driver.holder.since == {} and not any(v.held for v in values)
    assert all(v.data == bytes([i]) * (128 << 10) for i, v in enumerate(values))


def test_a_growing_map_lets_go_of_held_values(tmp_path):
    driver = open_driver(f"lmdb://{tmp_path}/db.lmdb?map_size=8M&map_max=256M")
    try:
        driver.put("c", b"a" * MIB)
        value = held_value(driver, "c")
        driver.put("big", os.urandom(16 * MIB))  # the map grows: no transaction may be open
        assert driver.env.info()["map_size"] > 8 * MIB
        assert not value.held and value.data == b"a" * MIB
    finally:
        driver.close()


def test_the_open_file_table_holds_while_open_and_lets_go_at_the_last_close(driver):
    tree = Tree(driver)
    table = HandleTable(tree)
    writer = table.create("c", 0o644, os.O_WRONLY, 0, 0)
    table.write(writer, b"1" * MIB, 0)
    table.release(writer)
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
    assert driver.holder.since == {}
    c = table.open("c", os.O_RDONLY)
    assert bytes(table.read(c, 10, 0)) == b"2" * 10
    table.release(c)
    assert driver.holder.since == {}


def test_a_held_value_counts_as_touched_when_read_not_when_held(driver, monkeypatch):
    """An open whose pages the kernel holds holds the value and never reads it: nothing enters
    the process's resident set, so nothing counts towards releasing the maps' pages (which
    costs a read of /proc/self/maps and an madvise of each map). Its first read counts it,
    once."""
    from zarrfs.backends.lmdb import pages

    counted: list[int] = []
    monkeypatch.setattr(pages, "touched", lambda d, n: counted.append(n))
    driver.put("c", b"v" * MIB)
    values = [held_value(driver, "c") for _ in range(8)]
    assert all(v.held for v in values) and counted == []
    assert values[0].size == MIB and counted == []  # its size is no read either
    assert bytes(values[0].data[:10]) == b"v" * 10 and values[0].data[5] == ord("v")
    assert counted == [MIB]
    values[1].let_go()  # a copy out reads it
    assert counted == [MIB, MIB]
    for v in values:
        v.release()

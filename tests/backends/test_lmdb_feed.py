"""The LMDB change feed (``zarrfs.backends.lmdb.feed``) after this driver's own commits: a look
that finds only them tells nothing and reads no log; another writer's commit among them, logged
or not, is still told."""

from __future__ import annotations

import lmdb
import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.base import DATA, SIDE
from zarrfs.backends.lmdb import feed


@pytest.fixture
def driver(tmp_path):
    d = open_driver(f"lmdb://{tmp_path}/db.lmdb")
    d.put("first", b"0")  # the side environment and the log exist
    yield d
    d.close()


@pytest.fixture
def walks(monkeypatch):
    """The log walks the feed makes (``feed._walk``, counted, then run)."""
    seen: list[int] = []
    real = feed._walk

    def counted(*args):
        seen.append(1)
        return real(*args)

    monkeypatch.setattr(feed, "_walk", counted)
    return seen


def test_a_look_after_this_drivers_own_commits_tells_nothing_and_reads_no_log(driver, walks):
    cursor, _ = driver.changes(None)
    for i in range(5):  # data and side, side alone, data alone
        driver.transact(lambda t, i=i: (t.put(f"k{i}", b"1"), t.put(f"s{i}", b"2", SIDE)))
        driver.put(f"side{i}", b"3", SIDE)
        driver.put(f"data{i}", b"4")
    cursor, records = driver.changes(cursor)
    assert records == [] and walks == []
    cursor, records = driver.changes(cursor)  # nothing since
    assert records == [] and walks == []


def test_another_writers_commit_among_the_own_ones_is_told(driver, walks):
    other = open_driver(driver.url)
    try:
        cursor, _ = driver.changes(None)
        driver.put("mine", b"1")
        other.transact(lambda t: (t.put("theirs", b"2"), t.put("their-side", b"3", SIDE)))
        driver.put("mine-after", b"4")
        cursor, records = driver.changes(cursor)
        assert sorted(records) == [(DATA, "theirs"), (SIDE, "their-side")]
        assert len(walks) == 1
        other.put("side-only", b"5", SIDE)  # a side commit alone, another mount's
        driver.put("mine-again", b"6")
        cursor, records = driver.changes(cursor)
        assert records == [(SIDE, "side-only")]
    finally:
        other.close()


def test_a_commit_of_a_writer_that_keeps_no_log_among_the_own_ones_says_something_changed(driver, walks):
    cursor, _ = driver.changes(None)
    driver.put("mine", b"1")
    with driver.env.begin(write=True) as txn:  # as zarr-python 2's LMDBStore writes: no entry
        txn.put(b"raw", b"2")
    driver.put("mine-after", b"3")
    cursor, records = driver.changes(cursor)
    assert records is None and len(walks) == 1


def test_a_long_run_of_own_commits_is_walked_and_still_tells_nothing(driver, walks):
    cursor, _ = driver.changes(None)
    for i in range(feed.OWN_RUN + 1):
        driver.put(f"k{i}", b"1")
    cursor, records = driver.changes(cursor)
    assert records == [] and len(walks) == 1


def test_a_readers_check_walks_the_log_back_only_to_what_the_last_check_saw(tmp_path):
    """A reader checks that its side snapshot is of one commit with its data snapshot: the
    newest log entry naming a data commit. After a run of side-only commits (``chmod -R``)
    each reader walked the whole run again, up to the log's length. Given an earlier
    snapshot's answer, the walk stops at that snapshot's entries: its answer (made up here)
    comes back, not the data commit named before the run; a data commit named after it is
    found."""
    env = lmdb.open(str(tmp_path / "side"), map_size=1 << 26)
    try:
        with env.begin(write=True) as t:
            feed.record(t, [b"dx"], 7)
        for i in range(300):
            with env.begin(write=True) as t:
                sid = feed.record(t, [b"sx"], 0)
                if i == 149:
                    middle = sid
        with env.begin() as t:
            assert feed.named_data_commit(t) == 7  # walked back over the whole run
            assert feed.named_data_commit(t, (middle, 99)) == 99  # stopped at the snapshot
        with env.begin(write=True) as t:
            feed.record(t, [b"dy"], 8)
        with env.begin(write=True) as t:
            feed.record(t, [b"sy"], 0)
        with env.begin() as t:
            assert feed.named_data_commit(t, (middle, 99)) == 8
    finally:
        env.close()


def test_the_drivers_checks_after_side_only_commits_give_a_whole_walks_answer(driver, monkeypatch):
    """Through the driver: readers between side-only commits each pass the last check's
    snapshot, and each answer is the one a walk of the whole log gives."""
    real = feed.named_data_commit
    calls: list[tuple[int, int] | None] = []

    def checked(side, known=None):
        calls.append(known)
        answer = real(side, known)
        assert answer == real(side)
        return answer

    monkeypatch.setattr(feed, "named_data_commit", checked)
    driver.put("k", b"1")
    for i in range(50):
        driver.put(f"s{i}", b"x", SIDE)
        assert driver.get("k") == b"1"
        assert driver.get(f"s{i}", SIDE) == b"x"
    assert len(calls) >= 50
    assert all(known is not None for known in calls[1:])

"""The embedded drivers' change feed wakes the daemon: LMDB and SQLite hand out a descriptor
(``feed_fileno``) that becomes readable when another writer commits to the database, and is
quiet again once the feed was looked at, and while other programs write files beside the
database; the idle loop sleeps on it instead of polling."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from zarrfs.backends.registry import open_driver


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def _settle(driver, cursor, fd: int):
    """Look at the feed until the descriptor stays quiet (the driver's own background work,
    SQLite's checkpoint, writes the file too: a wake, then quiet)."""
    for _ in range(20):
        cursor, _ = driver.changes(cursor)
        if not _readable(fd, 0.3):
            return cursor
    raise AssertionError("the descriptor never went quiet: the loop would spin")


def _commit_from_another_process(url: str, key: str, space: str = "DATA") -> None:
    """A write by another process, through its own driver (as another mount's); ``SIDE``: a
    side record alone (what a ``chmod`` commits)."""
    code = (
        "import sys; from zarrfs.backends.registry import open_driver; from zarrfs.backends import base\n"
        "d = open_driver(sys.argv[1])\n"
        "d.transact(lambda t: t.put(sys.argv[2], b'v', getattr(base, sys.argv[3]))); d.close()"
    )
    subprocess.run([sys.executable, "-c", code, url, key, space], check=True, timeout=60)


def _database(tmp_path, kind: str):
    """``(url, folder)`` of a new database of ``kind``, the folder its files are in."""
    if kind == "lmdb-file":
        open(f"{tmp_path}/db.mdb", "wb").close()  # an existing file: LMDB without a folder
        return f"lmdb://{tmp_path}/db.mdb", tmp_path
    if kind == "lmdb":
        return f"lmdb://{tmp_path}/db.lmdb", tmp_path / "db.lmdb"
    return f"sqlite://{tmp_path}/db.sqlite", tmp_path


def _feed(driver):
    """``(cursor, descriptor)`` of the feed of ``driver``, after a first commit of its own."""
    driver.transact(lambda t: t.put("first", b"x"))
    cursor, _ = driver.changes(None)
    fd = driver.feed_fileno()
    assert fd is not None
    return cursor, fd


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "lmdb-file"])
def test_another_writers_commit_wakes_the_feed_descriptor(tmp_path, kind):
    url, _ = _database(tmp_path, kind)
    driver = open_driver(url)
    try:
        cursor, fd = _feed(driver)
        cursor = _settle(driver, cursor, fd)
        _commit_from_another_process(url, "theirs")
        assert _readable(fd, 10), "another process's commit did not wake the feed"
        cursor, records = driver.changes(cursor)
        assert records is None or ("theirs" in [k for _, k in records])
        _settle(driver, cursor, fd)
    finally:
        driver.close()


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_wake_finds_the_commit_named_and_readable(tmp_path, kind):
    """Woken by another process's commits, the feed names what they changed, and what it names
    is there to read: the write that wakes the feed (LMDB's meta page) comes a moment before
    a new reader sees the commit, and a look in that moment took the entry-less commit for
    "something changed" (the mount then dropped every name the kernel held)."""
    url = f"lmdb://{tmp_path}/db.lmdb" if kind == "lmdb" else f"sqlite://{tmp_path}/db.sqlite"
    driver = open_driver(url)
    commits = 150
    code = (
        "import sys; from zarrfs.backends.registry import open_driver\n"
        "d = open_driver(sys.argv[1])\n"
        f"for i in range({commits}): d.transact(lambda t: t.put(f'k{{i}}', b'v'))\n"
        "d.close()"
    )
    try:
        driver.transact(lambda t: t.put("first", b"x"))
        cursor, _ = driver.changes(None)
        fd = driver.feed_fileno()
        cursor = _settle(driver, cursor, fd)
        writer = subprocess.Popen([sys.executable, "-c", code, url])
        seen: set[str] = set()
        unknown = 0
        while True:
            done = writer.poll() is not None  # then this look takes every commit
            cursor, records = driver.changes(cursor)
            if records is None:
                unknown += 1
            else:
                for _, key in records:
                    assert driver.get(key) == b"v", f"{key} named before it can be read"
                    seen.add(key)
            if done:
                break
            _readable(fd, 1)  # the next wake
        assert writer.returncode == 0
        assert unknown == 0, f"{unknown} looks found 'something changed' in {commits} commits"
        assert seen == {f"k{i}" for i in range(commits)}
    finally:
        driver.close()


def _neighbour_writes(folder) -> None:
    """Another program's log beside the database, appended to line by line."""
    with open(os.path.join(folder, "job.log"), "ab") as log:
        for i in range(200):
            log.write(b"line %d\n" % i)
            log.flush()


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "lmdb-file"])
def test_writes_beside_the_database_do_not_wake_the_feed(tmp_path, kind):
    """Only the database's own files wake the feed: a log another program appends to in the
    database's folder kept the daemon at 60% of a CPU, looking at the feed after each write.
    On LMDB a commit of side records alone (a ``chmod``) wakes it too, the first one (which
    makes the side environment) and the next."""
    url, folder = _database(tmp_path, kind)
    driver = open_driver(url)
    try:
        cursor, fd = _feed(driver)
        (folder / "job.log").write_bytes(b"started\n")  # a file appearing wakes it once
        woken = 0
        for _ in range(3):  # the driver's own background work (a checkpoint) may wake it once
            cursor = _settle(driver, cursor, fd)
            _neighbour_writes(folder)
            woken += _readable(fd, 0.3)
        assert woken < 3, "another program's writes beside the database woke the feed"
        _commit_from_another_process(url, "theirs")
        assert _readable(fd, 10), "another process's commit did not wake the feed"
        cursor = _settle(driver, cursor, fd)
        if kind != "sqlite":
            for n in range(2):  # the side environment made, then written again
                _commit_from_another_process(url, f"side{n}", "SIDE")
                assert _readable(fd, 10), f"side commit {n} did not wake the feed"
                cursor = _settle(driver, cursor, fd)
    finally:
        driver.close()

"""LMDB's two commits (zarrfs.backends.lmdb.driver): a writer commits its side records, then
its data. A reader whose side snapshot is a commit ahead of its data snapshot waits for the
data commit while the writer lives, however long the writer is held between its two commits
(descheduled on a loaded machine), and reads both as one commit; a writer that stays held
longer than ``-o timeout=`` is an error, not a torn read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from zarrfs.backends import SIDE, open_driver
from zarrfs.backends.errors import StalledError

# A writer process held between its two commits (HeldCommit, below, from this file).
WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[4])
    from test_lmdb_side_ahead import HeldCommit
    from zarrfs.backends import SIDE, open_driver

    url, hold, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    driver = open_driver(url)
    for i in range(1, rounds + 1):
        def fn(t, i=i):
            t.put("t/a", b"%d" % i)
            t.put("t/a", b"%d" % i, SIDE)
            t._data = HeldCommit(t._data, hold, lambda: print("between", flush=True))
        driver.transact(fn)
    print("done", flush=True)
    """
)


class HeldCommit:
    """A writer's data transaction whose commit is held ``hold`` seconds, ``between()`` told
    first; every other call goes to the real py-lmdb transaction."""

    def __init__(self, txn, hold: float, between) -> None:
        self._txn, self._hold, self._between = txn, hold, between

    def __getattr__(self, name):
        return getattr(self._txn, name)

    def commit(self):
        self._between()
        time.sleep(self._hold)
        self._txn.commit()


def start_writer(url: str, hold: float, rounds: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(hold), str(rounds), os.path.dirname(__file__)],
        stdout=subprocess.PIPE, text=True,
    )


def both(t):
    return t.get("t/a"), t.get("t/a", SIDE)


def held_writer_thread(driver, hold: float) -> tuple[threading.Thread, threading.Event]:
    """A thread (not started) whose transaction on ``driver`` writes ``1`` to both spaces and
    holds its data commit ``hold`` seconds, and the event set between its two commits."""
    between = threading.Event()

    def fn(t):
        t.put("t/a", b"1")
        t.put("t/a", b"1", SIDE)
        t._data = HeldCommit(t._data, hold, between.set)

    return threading.Thread(target=driver.transact, args=(fn,)), between


@pytest.fixture
def url(tmp_path):
    url = f"lmdb://{tmp_path}/db.lmdb"
    d = open_driver(url)
    d.transact(lambda t: (t.put("t/a", b"0"), t.put("t/a", b"0", SIDE)))
    d.close()
    return url


def test_a_writer_held_between_its_two_commits_is_waited_for(url):
    """Held 3 s (six times the wait for a dead writer's commit): the read sees data and side
    of its commit, after waiting for it past that wait (a loaded machine may start the read
    late, never after the writer's data commit)."""
    driver = open_driver(url)
    writer = start_writer(url, 3.0, 1)
    try:
        assert writer.stdout.readline() == "between\n"
        time.sleep(0.05)  # the side commit is made just before the line is printed
        started = time.monotonic()
        data, side = driver.transact(both, write=False)
        waited = time.monotonic() - started
        assert (bytes(data), bytes(side)) == (b"1", b"1"), waited
        assert waited > 0.6  # SIDE_AHEAD_WAIT and more: the writer was waited for
        assert writer.stdout.readline() == "done\n"
    finally:
        writer.kill()
        writer.wait()
        driver.close()


def test_a_writer_thread_of_the_same_process_is_waited_for(url):
    """The same with the writer another thread of the reader's process (a mount's commit
    beside its reads): LMDB's writer mutex is then this process's own."""
    driver = open_driver(url)
    writer, between = held_writer_thread(driver, 3.0)
    writer.start()
    try:
        assert between.wait(30)
        started = time.monotonic()
        data, side = driver.transact(both, write=False)
        waited = time.monotonic() - started
        assert (bytes(data), bytes(side)) == (b"1", b"1"), waited
        assert waited > 0.6
    finally:
        writer.join()
        driver.close()


def test_a_writer_that_commits_between_the_readers_two_looks_is_read_whole(url, monkeypatch):
    """The reader looks whether the data commit is seen, then, past ``SIDE_AHEAD_WAIT``,
    whether a writer still holds the environment. A writer that made its data commit and let
    go between the two looks (descheduled reader, CI) was taken for one killed between its
    commits, and the read returned the old data with the new side records. The writer
    finishes here inside the second look; the read sees its commit whole."""
    driver = open_driver(url)
    writer, between = held_writer_thread(driver, 1.0)
    lock = driver.write_lock
    held_elsewhere = lock.held_elsewhere

    def writer_done_meanwhile():
        writer.join()
        return held_elsewhere()

    monkeypatch.setattr(lock, "held_elsewhere", writer_done_meanwhile)
    writer.start()
    try:
        assert between.wait(30)
        data, side = driver.transact(both, write=False)
        assert (bytes(data), bytes(side)) == (b"1", b"1")
    finally:
        writer.join()
        driver.close()


def test_a_writer_held_longer_than_the_timeout_is_an_error(url):
    driver = open_driver(url)
    driver.set_timeout(1.0)
    writer = start_writer(url, 4.0, 1)
    try:
        assert writer.stdout.readline() == "between\n"
        time.sleep(0.05)
        with pytest.raises(StalledError, match="half made"):
            driver.transact(both, write=False)
        assert writer.stdout.readline() == "done\n"
        assert [bytes(v) for v in driver.transact(both, write=False)] == [b"1", b"1"]
    finally:
        writer.kill()
        writer.wait()
        driver.close()


# MDB_txninfo's first cache line: the magic, the format, the reader mutex (a pthread mutex of 40
# bytes on Linux x86-64 and aarch64), then the number of the last commit readers see.
_TXNID_AT = 48


def test_a_data_commit_whose_writer_was_killed_before_readers_see_it_counts_as_not_made(url):
    """LMDB writes a commit's meta page, then its number in the lock file, which is what a read
    begins from: a writer killed between the two leaves a commit the meta page shows
    (``env.info()``) and no read sees, until the next writer (which writes over it). Its side
    records, committed first, are then ahead of every read: they are read as they are, as
    after a writer killed before its data commit, not retried until ``-o timeout=``."""
    import mmap
    import struct

    driver = open_driver(url)
    driver.set_timeout(2.0)
    try:
        driver.transact(lambda t: (t.put("t/a", b"1"), t.put("t/a", b"1", SIDE)))
        last = driver.env.info()["last_txnid"]
        path = driver.path + "/lock.mdb"
        with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 4096) as lock:
            if struct.unpack_from("<Q", lock, _TXNID_AT)[0] != last:
                pytest.skip("the lock file's layout is not the one known here")
            struct.pack_into("<Q", lock, _TXNID_AT, last - 1)  # the writer killed there
        data, side = driver.transact(both, write=False)
        assert (bytes(data), bytes(side)) == (b"0", b"1")  # the data commit never became visible
        driver.transact(lambda t: (t.put("t/a", b"2"), t.put("t/a", b"2", SIDE)))  # the next writer
        assert [bytes(v) for v in driver.transact(both, write=False)] == [b"2", b"2"]
    finally:
        driver.close()


# A writer process that, once told, commits a change to both spaces and then one to the side
# alone, whole, while a reader's transaction has read its data and not yet its side.
SIDE_ONLY_AFTER = textwrap.dedent(
    """
    import sys
    from zarrfs.backends import SIDE, open_driver

    driver = open_driver(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    driver.transact(lambda t: (t.put("t/a", b"1"), t.put("t/a", b"1", SIDE)))
    driver.transact(lambda t: t.put("t/other", b"x", SIDE))  # its log entry names no data commit
    print("done", flush=True)
    """
)


def test_a_side_only_commit_after_a_writers_two_commits_does_not_hide_them(url):
    """A reader's data snapshot taken before a writer's commit and its side snapshot after
    it and after a side-only commit: the side-only commit's log entry names no data commit,
    and the check looked only at the last entry, so the transaction read the old data with
    the new side records (seen by the observers of `link` on a loaded machine). The check now
    takes the newest entry that names one: the transaction runs again and reads the commit
    whole."""
    driver = open_driver(url)
    writer = subprocess.Popen(
        [sys.executable, "-c", SIDE_ONLY_AFTER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    first = [True]

    def read(t):
        data = t.get("t/a")
        if first[0]:  # between the two snapshots of the first run: the writer's two commits
            first[0] = False
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "done\n"
        return data, t.get("t/a", SIDE)

    try:
        assert writer.stdout.readline() == "ready\n"
        data, side = driver.transact(read, write=False)
        assert (bytes(data), bytes(side)) == (b"1", b"1")
    finally:
        writer.kill()
        writer.wait()
        driver.close()

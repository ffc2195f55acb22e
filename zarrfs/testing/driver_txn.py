"""The transactional half of the driver conformance kit (see ``zarrfs.testing.driver``):
transactions, retries, concurrency across threads and processes, persistence, full storage."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from zarrfs.backends.base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    VALUES,
    BackendError,
    ReadOnlyError,
    RetryableError,
    StorageFullError,
    prefix_stop,
)
from zarrfs.backends.registry import open_driver

from .claims import Claims

__all__ = ["TransactionConformance", "increment", "keys_of", "reads_beside_commits", "scan_moving_keys"]


def keys_of(rows):
    """The keys of ``(key, x)`` rows."""
    return [k for k, _ in rows]


def increment(txn, key, space=DATA):
    """Read-modify-write a decimal counter (a transaction that conflicts with itself)."""
    old = txn.get(key, space)
    txn.put(key, str(int(old or b"0") + 1).encode(), space)


def _increment_worker(url: str, n: int) -> None:
    """Run in a separate process: ``n`` transactions, each incrementing three counters."""
    driver = open_driver(url)
    try:
        for _ in range(n):

            def fn(t):
                increment(t, "count/a")
                increment(t, "count/b")
                increment(t, "count/a", SIDE)

            driver.transact(fn)
    finally:
        driver.close()


def _write_forever(url: str) -> None:
    """Run in a separate process until killed: transactions that keep two keys (one data, one
    side) equal, and a growing value, so a kill lands in the middle of some transaction."""
    driver = open_driver(url)
    i = 0
    while True:
        i += 1

        def fn(t, i=i):
            t.put("crash/a", b"%d" % i)
            t.put("crash/blob", os.urandom(1000) * (i % 50))
            t.put("crash/a", b"%d" % i, SIDE)
            t.put("crash/b", b"%d" % i)

        driver.transact(fn)


def reads_beside_commits(driver, commit, read, wrong, reads: int) -> tuple[int, list]:
    """Commit ``commit(t, i)`` for i = 1, 2, ... in a thread while read transactions
    ``read`` run, at least ``reads`` of them and while fewer than 100 commits were made (a
    condition, not a bound on speed; 60 s at most); return how many reads ran and those
    ``wrong(result)`` says are wrong. Fails when the writer failed or committed fewer than 2."""
    done = threading.Event()
    commits = [0]
    errors: list[BaseException] = []

    def write() -> None:
        try:
            while not done.is_set():
                i = commits[0] + 1
                driver.transact(lambda t, i=i: commit(t, i))
                commits[0] = i
        except BaseException as exc:  # reported below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    seen, n = [], 0
    deadline = time.monotonic() + 60
    try:
        while (n < reads or commits[0] < 100) and time.monotonic() < deadline and not errors:
            result = driver.transact(read, write=False)
            n += 1
            if wrong(result):
                seen.append(result)
    finally:
        done.set()
        writer.join(60)
    assert not errors, errors
    assert commits[0] >= 2, "the writer committed nothing while the reads ran"
    return n, seen


def scan_moving_keys(driver, reads: int) -> None:
    """Move ``move/NNNNNN`` (and its side record) to the next number, one commit a step, in a
    thread, while ``reads`` read transactions scan for it; fail when one lists it under no name
    or two (see ``test_a_scan_finds_a_moving_key_under_one_name``)."""

    def step(t, i: int) -> None:
        old, new = f"move/{i - 1:06d}", f"move/{i:06d}"
        for space in (DATA, SIDE):
            t.delete(old, space)
            t.put(new, b"v%d" % i, space)

    def read(t) -> list:
        return [
            keys_of(t.scan("move/", prefix_stop("move/"), space=space, fetch=fetch))
            for space in (DATA, SIDE)
            for fetch in (KEYS, SIZES, VALUES)
        ]

    driver.transact(lambda t: [t.put("move/000000", b"v0", space) for space in (DATA, SIDE)])
    wrong = lambda listed: any(len(keys) != 1 for keys in listed)  # noqa: E731
    n, seen = reads_beside_commits(driver, step, read, wrong, reads)
    assert not seen, f"{len(seen)} of {n} reads listed the moving key under no name or two: {seen[:3]}"


class TransactionConformance(Claims):
    """The tests of transactions, a part of :class:`zarrfs.testing.DriverConformance`, which
    documents the fixtures, the class attributes and ``fill_to_exhaustion`` they use."""

    # -- transactions -------------------------------------------------------------------------
    def test_transaction_that_raises_keeps_nothing(self, driver):
        driver.put("keep/a", b"1")
        driver.put("keep/b", b"2", SIDE)

        class Boom(Exception):
            pass

        def fn(t):
            t.put("gone/x", b"x")
            t.put("gone/y", b"y", SIDE)
            t.put("keep/a", b"changed")
            t.delete("keep/b", SIDE)
            assert t.get("keep/a") == b"changed"
            raise Boom

        with pytest.raises(Boom):
            driver.transact(fn)
        assert driver.scan(fetch=VALUES) == [("keep/a", b"1")]
        assert driver.scan(space=SIDE, fetch=VALUES) == [("keep/b", b"2")]

    def test_read_your_writes(self, driver):
        driver.put("d/old", b"old")
        driver.put("d/gone", b"gone")
        driver.put("s/gone", b"g", SIDE)

        def fn(t):
            t.put("d/new", b"new!")
            t.put("d/old", b"replaced")
            t.delete("d/gone")
            t.put("s/new", b"s", SIDE)
            t.delete("s/gone", SIDE)
            seen = {
                "get": (t.get("d/new"), t.get("d/old"), t.get("d/gone")),
                "size": (t.size("d/new"), t.size("d/old"), t.size("d/gone")),
                "read": (t.read("d/new", 1, 2), t.read("d/gone", 0, 1)),
                "exists": (t.exists("d/new"), t.exists("d/gone")),
                "keys": list(t.scan("d/", "d0")),
                "sizes": list(t.scan("d/", "d0", fetch=SIZES)),
                "values": list(t.scan("d/", "d0", fetch=VALUES)),
                "limit": list(t.scan("d/", "d0", limit=1)),
                "side": list(t.scan(space=SIDE, fetch=VALUES)),
            }
            t.put("d/new", b"twice")
            seen["again"] = t.get("d/new")
            t.delete("d/new")
            seen["deleted"] = (t.get("d/new"), list(t.scan("d/", "d0")))
            t.put("d/new", b"thrice")
            return seen

        seen = driver.transact(fn)
        assert seen["get"] == (b"new!", b"replaced", None)
        assert seen["size"] == (4, 8, None)
        assert seen["read"] == (b"ew", None)
        assert seen["exists"] == (True, False)
        assert seen["keys"] == [("d/new", None), ("d/old", None)]
        assert seen["sizes"] == [("d/new", 4), ("d/old", 8)]
        assert seen["values"] == [("d/new", b"new!"), ("d/old", b"replaced")]
        assert seen["limit"] == [("d/new", None)]
        assert seen["side"] == [("s/new", b"s")]
        assert seen["again"] == b"twice"
        assert seen["deleted"] == (None, [("d/old", None)])
        assert driver.scan(fetch=VALUES) == [("d/new", b"thrice"), ("d/old", b"replaced")]
        assert driver.scan(space=SIDE, fetch=VALUES) == [("s/new", b"s")]

    def test_write_while_scanning(self, driver):
        for i in range(50):
            driver.put(f"w/{i:02d}", b"x")

        def fn(t):
            seen = []
            for key, _ in t.scan("w/", "w0"):
                seen.append(key)
                t.delete(key)
                t.put("moved/" + key, b"y")
            return seen

        assert driver.transact(fn) == [f"w/{i:02d}" for i in range(50)]
        assert driver.scan("w/", "w0") == []
        assert len(driver.scan("moved/", prefix_stop("moved/"))) == 50

    def test_side_data_is_separate(self, driver):
        driver.put("same/key", b"data")
        driver.put("same/key", b"side", SIDE)
        driver.put("only/side", b"s", SIDE)
        assert driver.scan(fetch=VALUES) == [("same/key", b"data")]
        assert driver.scan(space=SIDE, fetch=VALUES) == [("only/side", b"s"), ("same/key", b"side")]
        assert driver.get("only/side") is None
        driver.delete("same/key")
        assert driver.get("same/key", SIDE) == b"side"
        assert driver.scan() == []

    def test_read_only(self, driver, url):
        with pytest.raises(ReadOnlyError):
            driver.transact(lambda t: t.put("k", b"v"), write=False)
        with pytest.raises(ReadOnlyError):
            driver.transact(lambda t: t.delete("k"), write=False)
        driver.put("k", b"v")
        if not type(driver).shared:  # no reader beside a writer: the reader comes after it
            for readonly in (True, False):
                with pytest.raises(BackendError):
                    open_driver(url, readonly=readonly).close()
            driver.close()
        ro = open_driver(url, readonly=True)
        try:
            assert ro.readonly
            assert ro.get("k") == b"v"
            assert ro.scan() == [("k", None)]
            with pytest.raises(ReadOnlyError):
                ro.put("k", b"w")
            with pytest.raises(ReadOnlyError):
                ro.transact(lambda t: None)
        finally:
            ro.close()
        if type(driver).shared:
            assert driver.get("k") == b"v"

    def test_retry_actually_retries(self, driver):
        driver.backoff = 0.001
        attempts = []

        def fn(t):
            attempts.append(len(attempts))
            t.put(f"attempt/{len(attempts) - 1}", b"x")
            t.put("attempt/side", str(len(attempts)).encode(), SIDE)
            if len(attempts) < 3:
                raise RetryableError("simulated conflict")
            return "done"

        assert driver.transact(fn) == "done"
        assert attempts == [0, 1, 2]
        # Only the attempt that committed left anything behind.
        assert keys_of(driver.scan()) == ["attempt/2"]
        assert driver.get("attempt/side", SIDE) == b"3"

    def test_retry_is_bounded(self, driver):
        driver.backoff = 0.0001
        driver.max_attempts = 4
        driver.retry_for = 0
        calls = []

        def fn(t):
            calls.append(1)
            raise RetryableError("always")

        with pytest.raises(RetryableError):
            driver.transact(fn)
        assert len(calls) == 4

    def test_retries_go_on_while_the_timeout_allows(self, driver):
        """Contention on a busy machine can outlast a fixed number of attempts: a transaction
        keeps retrying for its timeout, so conflicting writers slow down rather than fail."""
        driver.backoff = 0.0001
        driver.max_attempts = 4
        driver.retry_for = 600
        calls = []

        def fn(t):
            calls.append(1)
            if len(calls) <= 12:
                raise RetryableError("still conflicting")
            return "done"

        assert driver.transact(fn) == "done"
        assert len(calls) == 13

    def test_threads_increment_exactly(self, driver):
        n_threads, n = 4, 40
        errors = []

        def work():
            try:
                for _ in range(n):
                    driver.transact(lambda t: (increment(t, "count/a"), increment(t, "count/a", SIDE)))
            except BaseException as exc:  # reported below: a thread's exception is otherwise lost
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not errors
        assert driver.get("count/a") == str(n_threads * n).encode()
        assert driver.get("count/a", SIDE) == str(n_threads * n).encode()

    def test_a_read_transaction_sees_one_commit(self, driver):
        """A read transaction sees one commit whole, whatever commits while it runs: its reads
        in separate calls (separate round trips on a server without read snapshots) find two
        records that every commit keeps equal, equal. Redis has no read snapshot: its driver
        checks at the end of a read of several round trips that nothing it read changed."""
        if driver.readonly:
            pytest.skip("read-only driver")

        def commit(t, i: int) -> None:
            t.put("pair/a", b"%d" % i)
            t.put("pair/b", b"%d" % i, SIDE)

        def read(t) -> tuple:
            return t.get("pair/a"), t.size("pair/b", SIDE), t.get("pair/b", SIDE)

        driver.transact(lambda t: (t.put("pair/a", b"0"), t.put("pair/b", b"0", SIDE)))
        wrong = lambda seen: seen[0] != seen[2] or seen[1] != len(seen[2])  # noqa: E731
        reads, seen = reads_beside_commits(driver, commit, read, wrong, 300)
        assert not seen, f"{len(seen)} of {reads} reads saw two commits: {seen[:5]}"

    def test_a_scan_finds_a_moving_key_under_one_name(self, driver):
        """A key renamed again and again (deleted and put under a new name in one commit) is
        listed by each read transaction's scan once, under one of its names, for names, sizes
        and values alike, in both spaces: never under neither, never under two. (Redis reads
        a batch's range and then its keys; a rename between the two moves the key out of what
        was read.)"""
        if driver.readonly:
            pytest.skip("read-only driver")
        scan_moving_keys(driver, reads=200)

    def test_processes_increment_exactly(self, driver, url):
        if not self.multiprocess:
            pytest.skip("an in-process store cannot be shared with another process")
        n = 150
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_increment_worker, args=(url, n)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        assert [p.exitcode for p in procs] == [0, 0]
        assert driver.get("count/a") == str(2 * n).encode()
        assert driver.get("count/b") == str(2 * n).encode()
        assert driver.get("count/a", SIDE) == str(2 * n).encode()

    def test_killed_writer_leaves_a_consistent_database(self, driver, url):
        if not self.multiprocess:
            pytest.skip("an in-process store cannot be shared with another process")
        import signal
        import time

        ctx = multiprocessing.get_context("spawn")
        for _ in range(3):
            p = ctx.Process(target=_write_forever, args=(url,))
            p.start()
            deadline = time.monotonic() + 60
            while driver.get("crash/b") is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            a, b, side = driver.get("crash/a"), driver.get("crash/b"), driver.get("crash/a", SIDE)
            assert a is not None and a == b
            if self.side_commits_with_data:
                assert side == a
            else:  # a kill between the two commits leaves side data one transaction ahead
                assert side is not None and int(side) in (int(a), int(a) + 1)
            # The killed process may have died holding the write lock: writers must go on.
            driver.transact(lambda t: t.put("crash/b", b"0"))
            driver.transact(lambda t: (t.put("crash/a", b"0"), t.put("crash/a", b"0", SIDE)))

    # -- the rest of the interface ------------------------------------------------------------
    def test_reopen_keeps_data(self, driver, url):
        driver.put("p/k", b"persist")
        driver.put("p/k", b"side", SIDE)
        if not self.persistent:
            return
        driver.close()
        again = open_driver(url)
        try:
            assert again.get("p/k") == b"persist"
            assert again.get("p/k", SIDE) == b"side"
        finally:
            again.close()

    def test_statfs_and_sync(self, driver):
        driver.put("k", b"v")
        driver.sync()
        info = driver.statfs()
        if info is not None:
            assert info["total"] > 0
            assert 0 <= info["free"] <= info["total"]

    def test_storage_full(self, driver, url):
        full = self.fill_to_exhaustion(url)
        if full is None:
            pytest.skip("this driver cannot be filled up in a test")
        with full as small:
            with pytest.raises(StorageFullError):
                small.transact(lambda t: [t.put(f"fill/{i}", os.urandom(2**20)) for i in range(8)])
            assert small.scan("fill/", prefix_stop("fill/")) == []

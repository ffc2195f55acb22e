"""The driver conformance kit: :class:`DriverConformance` checks the contract of
:mod:`zarrfs.backends.base` against a driver, the same tests for the built-in drivers and for a
third-party one. Subclass it in a test module and give it two fixtures: ``url``, a fresh
database's URL (``f"mydb://{tmp_path}/db"``), and ``driver``, that URL opened with
:func:`zarrfs.backends.open_driver`, yielded, then closed. Everything is real: the database
itself, threads, and processes started with ``spawn``.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from zarrfs.backends import open_driver, registry
from zarrfs.backends.base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    VALUES,
    BackendError,
    Driver,
    Get,
    HasPrefix,
    InvalidKeyError,
    Size,
    prefix_stop,
)
from zarrfs.backends.urls import database_path

from .driver_txn import TransactionConformance, keys_of

__all__ = ["DriverConformance"]

BIG = 64 * 2**20 + 12345  # a value of more than 64 MiB, not a multiple of any page size


class DriverConformance(TransactionConformance):
    """The contract of ``zarrfs.backends.base``, run against one driver per subclass.

    A subclass (named ``Test...``, so that pytest collects it; this class is not) provides the
    fixtures ``url`` (a fresh, empty database) and ``driver`` (that database opened, closed
    afterwards), and may set the class attributes below. The tests that reopen the database
    or share it with another process open ``url`` with :func:`zarrfs.backends.open_driver`,
    which finds a third-party driver through its entry point (``zarrfs.backends``)."""

    #: Whether two processes can open the same URL (not for the in-process memory driver).
    multiprocess = True
    #: Whether data survives closing and reopening the driver.
    persistent = True
    #: Whether side data commits atomically with data (LMDB: two environments, two commits,
    #: the side's first).
    side_commits_with_data = True

    def fill_to_exhaustion(self, url):
        """Return a context manager making the database refuse writes for lack of space, or
        ``None`` if the test cannot arrange that."""
        return None

    # -- basics -------------------------------------------------------------------------------
    def test_registry_picks_this_driver(self, driver, url):
        """The URL's scheme is declared (in its package's ``about``) to be this driver's, and
        what the driver declares it can do it does."""
        assert isinstance(driver, Driver)
        scheme, full = registry.normalize_url(url)
        about = registry.about(scheme)
        cls = type(driver)
        assert about.driver_class(scheme) is cls
        assert scheme in about.schemes and all(s == s.lower() for s in about.schemes)
        assert cls.max_key_size is None or cls.max_key_size > 0
        # A feature declared is implemented (the base's method refuses).
        assert not cls.snapshots or cls.snapshot is not Driver.snapshot
        assert not cls.keeps_index or cls.reindex is not Driver.reindex
        assert not cls.versioned or cls.commit is not Driver.commit
        path = database_path(full)
        if about.files is None:
            assert path is None, "a server's URL names no path"
        else:
            # what the driver made there is told as its own (or nothing yet), never as another's
            assert path is not None and about.files.what_is_there(path) != "other"
            assert about.files.database_at(path) == path

    def test_an_undeclared_option_is_refused(self, url):
        """A query option the driver's ``about`` does not declare is refused, and the refusal
        names those it declares (a typo is never ignored)."""
        scheme, full = registry.normalize_url(url)
        about = registry.about(scheme)
        with pytest.raises(BackendError, match="zarrfs_undeclared") as refused:
            open_driver(full + ("&" if "?" in full else "?") + "zarrfs_undeclared=1").close()
        for name in about.options:
            assert name in str(refused.value)

    @pytest.mark.parametrize("space", [DATA, SIDE])
    def test_get_put_delete(self, driver, space):
        assert driver.get("x/y", space) is None
        assert driver.size("x/y", space) is None
        assert driver.read("x/y", 0, 10, space) is None
        assert driver.transact(lambda t: t.exists("x/y", space), write=False) is False
        driver.put("x/y", b"value", space)
        assert driver.get("x/y", space) == b"value"
        assert type(driver.get("x/y", space)) is bytes
        assert driver.size("x/y", space) == 5
        assert driver.transact(lambda t: t.exists("x/y", space), write=False) is True
        driver.put("x/y", b"v2", space)
        assert driver.get("x/y", space) == b"v2"
        driver.delete("x/y", space)
        assert driver.get("x/y", space) is None
        driver.delete("x/y", space)  # deleting a missing key is not an error
        driver.delete("never/was", space)

    @pytest.mark.parametrize("space", [DATA, SIDE])
    def test_empty_value(self, driver, space):
        driver.put("e", b"", space)
        assert driver.get("e", space) == b""
        assert driver.size("e", space) == 0
        assert driver.read("e", 0, 100, space) == b""
        assert driver.transact(lambda t: (t.get("e", space), t.size("e", space), t.exists("e", space))) == (
            b"",
            0,
            True,
        )
        assert driver.scan(space=space, fetch=SIZES) == [("e", 0)]
        assert driver.scan(space=space, fetch=VALUES) == [("e", b"")]
        assert driver.scan(space=space, fetch=KEYS) == [("e", None)]

    def test_value_types(self, driver, tmp_path):
        driver.put("bytearray", bytearray(b"abc"))
        driver.put("memoryview", memoryview(b"xabcx")[1:4])
        arr = np.arange(6, dtype="<f8").reshape(2, 3)
        driver.put("numpy", arr)
        driver.put("numpy-strided", arr[:, ::2])  # not contiguous: copied
        path = tmp_path / "spill"
        path.write_bytes(b"from a spill file")
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            driver.put("mmap", m)
        assert driver.get("bytearray") == b"abc"
        assert driver.get("memoryview") == b"abc"
        assert driver.get("numpy") == arr.tobytes()
        assert driver.get("numpy-strided") == np.ascontiguousarray(arr[:, ::2]).tobytes()
        assert driver.get("mmap") == b"from a spill file"
        with pytest.raises(TypeError):
            driver.put("str", "not bytes")

    def test_buffer_reuse_after_put(self, driver):
        buf = bytearray(b"first")

        def fn(t):
            t.put("k", buf)
            buf[:] = b"XXXXX"  # the caller reuses its buffer before the commit

        driver.transact(fn)
        assert driver.get("k") == b"first"

    def test_read_ranges(self, driver):
        value = bytes(range(256)) * 4
        driver.put("r", value)
        for offset, length in [(0, 10), (100, 200), (1000, 100), (1024, 5), (5000, 1), (0, 0), (3, 1)]:
            want = value[offset : offset + length]
            assert driver.read("r", offset, length) == want
            assert driver.transact(lambda t, o=offset, n=length: t.read("r", o, n), write=False) == want

    @pytest.mark.slow
    def test_big_value(self, driver, tmp_path):
        block = os.urandom(2**20)
        value = block * (BIG // len(block)) + block[: BIG % len(block)]
        path = tmp_path / "big"
        path.write_bytes(value)
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            driver.put("big/0.0", m)
        assert driver.size("big/0.0") == BIG
        assert driver.read("big/0.0", BIG - 100, 1000) == value[-100:]
        assert driver.read("big/0.0", 2**20 - 5, 10) == value[2**20 - 5 : 2**20 + 5]
        assert driver.get("big/0.0") == value
        assert driver.scan("big/", prefix_stop("big/"), fetch=SIZES) == [("big/0.0", BIG)]
        got = driver.transact(lambda t: t.get("big/0.0"), write=False)
        assert got == value

    # -- keys ----------------------------------------------------------------------------------
    def test_scan_prefix_boundaries(self, driver):
        keys = ["a", "a-", "a.b", "a/", "a/b", "a/b/c", "a/z", "a0", "a0/x", "a\x7f", "b", "A", "_a", "a_"]
        for k in keys:
            driver.put(k, k.encode())
        assert keys_of(driver.scan()) == sorted(keys)
        assert keys_of(driver.scan("a/", prefix_stop("a/"))) == ["a/", "a/b", "a/b/c", "a/z"]
        assert keys_of(driver.scan("a/b/", prefix_stop("a/b/"))) == ["a/b/c"]
        assert keys_of(driver.scan("a0", prefix_stop("a0"))) == ["a0", "a0/x"]
        assert keys_of(driver.scan("a.", prefix_stop("a."))) == ["a.b"]
        assert keys_of(driver.scan("a_", prefix_stop("a_"))) == ["a_"]  # "_" is no wildcard
        assert keys_of(driver.scan("a", prefix_stop("a"))) == sorted(k for k in keys if k.startswith("a"))
        assert keys_of(driver.scan("a/", "a0")) == ["a/", "a/b", "a/b/c", "a/z"]
        assert keys_of(driver.scan("a/b", "a/z")) == ["a/b", "a/b/c"]  # start inclusive, stop exclusive
        assert keys_of(driver.scan("", "a")) == ["A", "_a"]
        assert keys_of(driver.scan("b")) == ["b"]
        assert driver.scan("c") == []
        assert driver.scan("b", "a") == []  # stop before start
        assert driver.scan("a", "a") == []
        assert keys_of(driver.transact(lambda t: list(t.scan_prefix("a/")), write=False)) == [
            "a/",
            "a/b",
            "a/b/c",
            "a/z",
        ]

    def test_scan_limit(self, driver):
        for i in range(30):
            driver.put(f"l/{i:02d}", b"x")
        assert driver.scan("l/", prefix_stop("l/"), limit=0) == []
        assert keys_of(driver.scan("l/", prefix_stop("l/"), limit=1)) == ["l/00"]
        assert keys_of(driver.scan("l/1", prefix_stop("l/"), limit=3)) == ["l/10", "l/11", "l/12"]
        assert len(driver.scan("l/", prefix_stop("l/"), limit=100)) == 30
        assert len(driver.scan(limit=7)) == 7

    def test_read_many(self, driver):
        driver.transact(lambda t: [t.put("g/a", b"12345"), t.put("e", b""), t.put("s:x", b"side", SIDE)])
        requests = [
            Size("g/a", DATA),
            Size("e", DATA),
            Size("nope", DATA),
            Get("s:x", SIDE),
            Get("g/a", SIDE),
            HasPrefix("g/", DATA),
            HasPrefix("g/b", DATA),
            HasPrefix("s:", SIDE),
            HasPrefix("g", SIDE),
        ]
        expected = [5, 0, None, b"side", None, True, False, True, False]
        assert driver.transact(lambda t: t.read_many(requests), write=False) == expected
        # Read apart (each answer need agree only with itself), the answers are the same.
        assert driver.transact(lambda t: t.read_many(requests, apart=True), write=False) == expected

        # Inside a write transaction the batch sees the transaction's own writes.
        def run(t):
            t.put("h/new", b"1")
            t.delete("g/a")
            return t.read_many([HasPrefix("h/", DATA), Size("g/a", DATA), HasPrefix("g/", DATA)])

        assert driver.transact(run) == [True, None, False]

        # A key asked twice, both answered by the transaction's own write; apart or not.
        for apart in (False, True):

            def twice(t, apart=apart):
                t.put("h/new2", b"22")
                return t.read_many([Size("h/new2", DATA), Get("h/new2", DATA)], apart=apart)

            assert driver.transact(twice) == [2, b"22"]

    def test_read_many_in_a_write_transaction(self, driver):
        driver.transact(
            lambda t: [
                t.put("p/a", b"1"),
                t.put("p/b", b"22"),
                t.put("q/a", b"3"),
                t.put("r/1", b""),
                t.put("r/2", b""),
                t.put("r/3", b""),
                t.put("e:p/x", b"s", SIDE),
                t.put("a:p/a", b"attrs", SIDE),
            ]
        )
        requests = [
            Size("p/a", DATA),
            Get("p/a", DATA),
            Size("p/b", DATA),
            Get("p/b", DATA),
            Size("n/new", DATA),
            Get("n/new", DATA),
            Size("r/1", DATA),
            HasPrefix("n/", DATA),  # made by a pending put
            HasPrefix("p/", DATA),  # one of its two keys deleted
            HasPrefix("q/", DATA),  # its only key deleted
            HasPrefix("r/", DATA),  # two of three deleted: r/3 remains
            HasPrefix("zz/", DATA),
            HasPrefix("e:n/", SIDE),
            HasPrefix("e:p/", SIDE),
            Get("e:n/y", SIDE),
            Get("e:p/x", SIDE),
            Size("e:p/x", SIDE),
            Get("a:p/a", SIDE),
            Size("untouched", DATA),
        ]

        def run(t):
            before = t.read_many(requests)
            t.put("n/new", b"new")
            t.put("p/a", b"changed!")
            t.delete("p/b")
            t.delete("q/a")
            t.delete("r/1")
            t.delete("r/2")
            t.put("e:n/y", b"m", SIDE)
            t.delete("e:p/x", SIDE)
            after = t.read_many(requests)
            # The same answers as the single reads of this transaction.
            single = []
            for request in requests:
                key, space = request
                if type(request) is Size:
                    single.append(t.size(key, space))
                elif type(request) is Get:
                    single.append(t.get(key, space))
                else:
                    single.append(next(iter(t.scan_prefix(key, space=space, limit=1)), None) is not None)
            t.delete("r/3")
            t.put("q/b", b"back")
            last = t.read_many([HasPrefix("r/", DATA), HasPrefix("q/", DATA), Get("q/b", DATA)])
            return before, after, single, last

        before, after, single, last = driver.transact(run)
        assert before[:12] == [1, b"1", 2, b"22", None, None, 0, False, True, True, True, False]
        assert before[12:] == [False, True, None, b"s", 1, b"attrs", None]
        expected = [8, b"changed!", None, None, 3, b"new", None, True, True, False, True, False]
        expected += [True, False, b"m", None, None, b"attrs", None]
        assert after == expected
        assert single == expected
        assert last == [False, True, b"back"]
        # Committed as seen last: r/3 deleted, q/b put.
        committed = expected[:9] + [True, False] + expected[11:]
        assert driver.transact(lambda t: t.read_many(requests), write=False) == committed
        assert driver.transact(lambda t: t.read_many(requests), write=True) == committed

    def test_read_many_refuses_bad_requests(self, driver):
        for write in (False, True):
            with pytest.raises(ValueError):
                driver.transact(lambda t: t.read_many([Size("k", "nonsense")]), write=write)
            with pytest.raises(ValueError):
                driver.transact(lambda t: t.read_many([HasPrefix("k/", "nonsense")]), write=write)
            with pytest.raises(ValueError):
                driver.transact(lambda t: t.read_many([("frobnicate", "k", DATA)]), write=write)
            with pytest.raises(ValueError):
                driver.transact(lambda t: t.read_many([("size", "k", "nonsense")]), write=write)
            with pytest.raises(ValueError):
                driver.transact(lambda t: t.read_many(["k"]), write=write)
            for bad in ("", "a\udcff"):
                with pytest.raises(InvalidKeyError):
                    driver.transact(lambda t, b=bad: t.read_many([Get(b, DATA)]), write=write)
        assert driver.transact(lambda t: t.read_many([]), write=False) == []

    def test_read_many_takes_the_older_tuples(self, driver):
        driver.put("o/a", b"123")
        old = [("size", "o/a", DATA), ("get", "o/a", "data"), ("prefix", "o/", DATA)]
        assert driver.transact(lambda t: t.read_many(old), write=False) == [3, b"123", True]

    def test_scans_inside_an_earlier_scan(self, driver):
        keys = [f"w/{i:03d}" for i in range(300)] + ["w/005/child", "w/0050"]
        driver.transact(lambda t: [t.put(k, b"x") for k in keys])

        def run(t):
            first = list(t.scan("w/", "w0", limit=100))
            # What a listing asks next: does any listed key also have children?
            below = [k for k, _ in first if next(iter(t.scan_prefix(k + "/", limit=1)), None) is not None]
            inside = list(t.scan("w/010", "w/020"))
            edge = list(t.scan("w/099", "w/101"))
            rest = list(t.scan("w/0050", "w/006"))
            return first, below, inside, edge, rest

        def paging(t):  # as a listing pages: resume after the last key, check each for children
            pages, below, pos = [], [], "w/"
            while True:
                page = keys_of(t.scan(pos, "w0", limit=16))
                pages.append(page)
                below += [k for k in page if next(iter(t.scan_prefix(k + "/", limit=1)), None) is not None]
                if len(page) < 16:
                    return pages, below
                pos = page[-1] + "\0"

        pages, paged_below = driver.transact(paging, write=False)
        assert [k for page in pages for k in page] == sorted(keys)
        assert all(len(page) == 16 for page in pages[:-1])
        assert paged_below == ["w/005"]
        first, below, inside, edge, rest = driver.transact(run, write=False)
        ordered = sorted(keys)
        assert keys_of(first) == ordered[:100]
        assert below == ["w/005"]
        assert keys_of(inside) == [f"w/{i:03d}" for i in range(10, 20)]
        assert keys_of(edge) == ["w/099", "w/100"]
        assert keys_of(rest) == ["w/0050"]

    def test_scan_fetch_modes(self, driver):
        values = {"f/a": b"", "f/b": b"1", "f/c": b"x" * 1000}
        for k, v in values.items():
            driver.put(k, v)
            driver.put(k, b"side:" + v, SIDE)
        assert driver.scan("f/", "f0") == [(k, None) for k in values]
        assert driver.scan("f/", "f0", fetch=KEYS) == [(k, None) for k in values]
        assert driver.scan("f/", "f0", fetch=SIZES) == [(k, len(v)) for k, v in values.items()]
        assert driver.scan("f/", "f0", fetch=VALUES) == list(values.items())
        assert driver.scan("f/", "f0", fetch=VALUES, space=SIDE) == [
            (k, b"side:" + v) for k, v in values.items()
        ]
        assert all(type(v) is bytes for _, v in driver.scan(fetch=VALUES))

    def test_scan_ahead_is_only_a_hint(self, driver):
        """A scan announced (``Txn.scan_ahead``) answers as it would unannounced: with reads
        sent between, with another scan announced and never made, and past a batch."""
        n = 1100  # more than a batch of the drivers that send scans ahead
        driver.transact(lambda t: [t.put(f"s/{i:05d}", b"%d" % i) for i in range(n)])
        driver.put("e:s/x", b"mark", SIDE)
        every = [(f"s/{i:05d}", len(b"%d" % i)) for i in range(n)]

        def announced(t):
            t.scan_ahead("s/", "s0", fetch=SIZES, limit=257)
            t.scan_ahead("e:s/", "e:s0", space=SIDE, fetch=VALUES)
            t.scan_ahead("never/", "never0")
            t.scan_ahead("s/", "s/", limit=0)  # nothing to scan
            first = t.read_many([Get("s/00001"), HasPrefix("s/", DATA)])
            return (
                first,
                list(t.scan("s/", "s0", fetch=SIZES, limit=257)),
                list(t.scan("e:s/", "e:s0", space=SIDE, fetch=VALUES)),
                list(t.scan("s/", "s0", fetch=SIZES)),
            )

        first, head, side, whole = driver.transact(announced, write=False)
        assert first == [b"1", True]
        assert head == every[:257] and whole == every
        assert side == [("e:s/x", b"mark")]

    def test_scan_ahead_sees_the_transactions_own_writes(self, driver):
        """A scan announced in a write transaction after its own puts and deletes shows them,
        as the same scan unannounced would."""
        driver.transact(lambda t: [t.put(f"s/{i:05d}", b"%d" % i) for i in range(20)])

        def written(t):
            t.put("s/00000a", b"new")
            t.delete("s/00002")
            t.scan_ahead("s/", "s/0001", fetch=KEYS)
            return keys_of(t.scan("s/", "s/0001"))

        rest = [f"s/{i:05d}" for i in range(3, 10)]
        assert driver.transact(written) == ["s/00000", "s/00000a", "s/00001", *rest]

    def test_read_many_of_keys_with_quotes_braces_and_backslashes(self, driver):
        # Keys a driver may have to quote or escape to send as a list (a SQL array literal:
        # quotes, backslashes, commas, braces, spaces, the word NULL).
        keys = ['q/"a"', "q/b\\", "q/\\\"", "q/c,d", "q/{e}", "q/NULL", "q/ f ", "q/é\\ß"]
        driver.transact(lambda t: [t.put(k, k.encode("utf-8")) for k in keys])
        requests = [Get(k, DATA) for k in keys] + [Size(k, DATA) for k in keys]
        requests += [HasPrefix(p, DATA) for p in ("q/\\", 'q/"', "q/{", 'q/"b')]
        expected = [k.encode("utf-8") for k in keys] + [len(k.encode("utf-8")) for k in keys]
        expected += [True, True, True, False]
        assert driver.transact(lambda t: t.read_many(requests), write=False) == expected
        assert driver.transact(lambda t: t.read_many(requests)) == expected

    def test_many_keys_scan_in_batches(self, driver):
        n = 2500  # more than one batch in every driver
        driver.transact(lambda t: [t.put(f"m/{i:05d}", b"%d" % i) for i in range(n)])
        rows = driver.scan("m/", prefix_stop("m/"), fetch=VALUES)
        assert [k for k, _ in rows] == [f"m/{i:05d}" for i in range(n)]
        assert [v for _, v in rows] == [b"%d" % i for i in range(n)]
        assert len(driver.scan("m/", prefix_stop("m/"), fetch=SIZES, limit=1234)) == 1234

    def test_non_ascii_keys(self, driver):
        keys = [
            "é/ß",
            "日本/データ.0",
            "emoji/😀",
            "emoji/\U0010fffd",
            "x\uffff",
            "x\ue000",
            "x\u07ff",
            "tab\tkey",
            "sp ace",
        ]
        for k in keys:
            driver.put(k, k.encode("utf-8"))
            driver.put(k, b"s", SIDE)
        for k in keys:
            assert driver.get(k) == k.encode("utf-8")
        got = keys_of(driver.scan())
        assert got == sorted(keys)
        # Python's str order is the order of the UTF-8 bytes, which the database uses.
        assert got == sorted(keys, key=lambda k: k.encode("utf-8"))
        assert keys_of(driver.scan(space=SIDE)) == sorted(keys)
        assert keys_of(driver.scan("emoji/", prefix_stop("emoji/"))) == ["emoji/😀", "emoji/\U0010fffd"]
        assert keys_of(driver.scan("日本/", prefix_stop("日本/"))) == ["日本/データ.0"]

    @pytest.mark.parametrize("bad", ["", "a\udcff", "\ud800/x"])
    def test_invalid_keys(self, driver, bad):
        for space in (DATA, SIDE):
            with pytest.raises(InvalidKeyError):
                driver.put(bad, b"x", space)
            with pytest.raises(InvalidKeyError):
                driver.get(bad, space)
            with pytest.raises(InvalidKeyError):
                driver.size(bad, space)
            with pytest.raises(InvalidKeyError):
                driver.read(bad, 0, 1, space)
            with pytest.raises(InvalidKeyError):
                driver.delete(bad, space)
            with pytest.raises(InvalidKeyError):
                driver.transact(lambda t, s=space: t.exists(bad, s), write=False)
        assert issubclass(InvalidKeyError, ValueError)
        if bad:
            with pytest.raises(InvalidKeyError):
                driver.scan(bad)
            with pytest.raises(InvalidKeyError):
                driver.scan("", bad)
        assert driver.scan() == []

    def test_long_keys(self, driver):
        ok = "k/" + "x" * 400
        driver.put(ok, b"1")
        assert driver.get(ok) == b"1"
        huge = "k/" + "y" * 4000
        limit = type(driver).max_key_size
        if limit is not None and len(huge) > limit:
            with pytest.raises(InvalidKeyError):
                driver.put(huge, b"2")
            with pytest.raises(InvalidKeyError):
                driver.get(huge)
        else:
            driver.put(huge, b"2")
            assert driver.get(huge) == b"2"

    def test_unknown_space(self, driver):
        with pytest.raises(ValueError):
            driver.put("k", b"v", "nonsense")
        with pytest.raises(ValueError):
            driver.scan(space="nonsense")

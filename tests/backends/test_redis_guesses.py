"""What a Redis write transaction may take without reading (``redis.guesses``): the table's
facts follow the mount's reads and commits, a guess is never made from a fact another client
changed, and a commit's checks hold exactly when the answers taken are what the server says.
The table alone first (no server), then against a real ``redis-server``."""

from __future__ import annotations

import uuid

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.base import DATA
from zarrfs.backends.buffered import DELETED
from zarrfs.backends.redis.guesses import BYTES, KEEP, MEMBERS, MISS, NAMES, Guesses, Taken
from zarrfs.backends.redis.url import KeyNames

KEYS = KeyNames("p")
INDEX = KEYS.index[DATA]


def prefix_read(raw: bytes, limit: int = 1) -> tuple:
    return ("ZRANGEBYLEX", INDEX, b"[" + raw, b"(" + raw[:-1] + b"0", "LIMIT", 0, limit)


def name(raw: bytes) -> bytes:
    return KEYS.name(DATA, raw)


def wrote(guesses: Guesses, writes: dict, taken: Taken | None = None) -> None:
    guesses.wrote({(DATA, raw): v for raw, v in writes.items()}, KEYS.name, KEYS.index, taken)


def test_a_name_never_seen_is_guessed_absent_and_one_read_is_answered_as_read():
    g = Guesses()
    g.learn([("EXISTS", name(b"a")), ("STRLEN", name(b"a")), ("GET", name(b"m"))], [1, 5, b"meta"])
    t = Taken()
    got = t.answer(g, (("EXISTS", name(b"a")), ("STRLEN", name(b"a")), ("MGET", name(b"m"), name(b"new"))))
    assert got == [1, 5, [b"meta", None]]
    # a length alone answers no GET: the whole query is read for real, and nothing of it taken
    assert t.answer(g, (("GET", name(b"x")), ("GET", name(b"a")))) is None
    assert name(b"x") not in t.names
    keys, args, names, ranges = t.checks()
    assert (names, ranges) == (3, 0)
    assert dict(zip(keys, args, strict=True)) == {
        name(b"a"): b"#5",
        name(b"m"): __import__("hashlib").sha1(b"meta").hexdigest().encode(),
        name(b"new"): b"-",
    }


def test_a_name_another_client_changed_or_guessed_wrong_is_read_not_guessed_absent():
    g = Guesses()
    g.learn([("GET", name(b"a")), ("GET", name(b"b"))], [b"1", b"2"])
    g.forget([name(b"a")])
    assert Taken().answer(g, (("GET", name(b"a")),)) is None
    t = Taken()
    assert t.answer(g, (("EXISTS", name(b"b")), ("STRLEN", name(b"b")))) == [1, 1]
    g.missed(t)
    assert Taken().answer(g, (("GET", name(b"b")),)) is None
    assert not g.wanted()  # and write transactions read for a while
    g.learn([("GET", name(b"b"))], [b"3"])
    assert Taken().answer(g, (("GET", name(b"b")),)) == [b"3"]


def test_a_folder_range_follows_this_mounts_commits():
    g = Guesses()
    g.learn([prefix_read(b"d/")], [[]])  # a new folder: nothing below it
    assert Taken().answer(g, (prefix_read(b"d/"),)) == [[]]
    wrote(g, {b"d/5": b"x", b"d/3": b"x"})
    assert Taken().answer(g, (prefix_read(b"d/", 2),)) == [[b"d/3", b"d/5"]]
    wrote(g, {b"d/3": DELETED})
    assert Taken().answer(g, (prefix_read(b"d/", 2),)) == [[b"d/5"]]
    # only the first members are known once a read said there are more: a removal of one of
    # them leaves the range not known
    g.learn([prefix_read(b"e/")], [[b"e/1"]])
    wrote(g, {b"e/9": b"x"})
    assert Taken().answer(g, (prefix_read(b"e/"),)) == [[b"e/1"]]
    assert Taken().answer(g, (prefix_read(b"e/", 2),)) is None
    wrote(g, {b"e/0": b"x"})
    assert Taken().answer(g, (prefix_read(b"e/"),)) == [[b"e/0"]]
    wrote(g, {b"e/0": DELETED})
    assert Taken().answer(g, (prefix_read(b"e/"),)) is None
    # of the first members known, a removal of the first leaves the next ones known
    g.learn([prefix_read(b"f/", MEMBERS)], [[b"f/%d" % i for i in range(1, MEMBERS + 1)]])
    wrote(g, {b"f/1": DELETED})
    assert Taken().answer(g, (prefix_read(b"f/"),)) == [[b"f/2"]]
    # a folder's range grows to MEMBERS, then holds its first ones
    wrote(g, {b"d/%02d" % i: b"x" for i in range(MEMBERS + 4)})
    assert Taken().answer(g, (prefix_read(b"d/", MEMBERS),)) == [[b"d/%02d" % i for i in range(MEMBERS)]]
    assert Taken().answer(g, (prefix_read(b"d/", MEMBERS + 1),)) is None


def test_what_a_commit_checked_is_known_after_it():
    g = Guesses()
    t = Taken()
    assert t.answer(g, (prefix_read(b"new/"), ("GET", name(b"new")))) == [[], None]
    wrote(g, {b"new/a": b"v"}, t)
    assert Taken().answer(g, (prefix_read(b"new/", 4), ("GET", name(b"new")))) == [[b"new/a"], None]


def test_the_table_stays_bounded():
    g = Guesses()
    for i in range(NAMES + 100):
        g.learn([("GET", name(b"k%d" % i))], [b"v"])
    assert len(g.names) <= NAMES
    big = b"x" * KEEP
    for i in range(2 * BYTES // KEEP):
        g.learn([("GET", name(b"b%d" % i))], [big])
    assert sum(len(v) for v in g.names.values() if type(v) is bytes) <= BYTES
    g.learn([("GET", name(b"huge"))], [b"y" * (KEEP + 1)])
    assert g.names[name(b"huge")] == KEEP + 1  # its length alone
    assert Taken().answer(g, (("GET", name(b"huge")),)) is None
    assert Taken().answer(g, (("STRLEN", name(b"huge")),)) == [KEEP + 1]
    assert MISS not in g.names.values()


# -- against a server -------------------------------------------------------------------------


@pytest.fixture
def driver(redis_server):
    d = open_driver(redis_server.url(0, prefix=f"g{uuid.uuid4().hex[:10]}"))
    yield d
    d.close()


def test_an_error_raised_on_guessed_answers_is_the_one_a_real_read_raises(driver, redis_server):
    """A transaction that raises on what it took (a value guessed absent) runs again, reading:
    its caller hears what holds on the server, never an error of a guess."""
    other = open_driver(redis_server.url(0, prefix=driver.prefix))
    try:
        other.put("x", b"there")  # a value this driver never saw
        runs = []

        def need(t):
            runs.append(t.get("x"))
            if runs[-1] is None:
                raise LookupError("absent")
            t.put("y", runs[-1])

        driver.transact(need)
        assert runs == [None, b"there"] and driver.get("y") == b"there"

        def refuse(t):
            raise LookupError("refused by a check of its own")

        with pytest.raises(LookupError):  # an error that holds is raised, after one run reading
            driver.transact(refuse)
    finally:
        other.close()


def test_a_commit_of_wrong_guesses_writes_nothing(driver, redis_server):
    """The checks of a commit whose guess another client made wrong stop its writes: the
    transaction's first run stores nothing, whatever it wrote."""
    other = open_driver(redis_server.url(0, prefix=driver.prefix))
    try:
        driver.put("n", b"0")
        seen = []

        def increment(t):
            value = t.get("n")
            seen.append(value)
            if len(seen) == 1:
                other.put("n", b"10")
            t.put("n", b"%d" % (int(value) + 1))
            t.put(f"log/{len(seen)}", value)

        driver.transact(increment)
        assert seen == [b"0", b"10"]
        assert driver.get("n") == b"11"
        assert [k for k, _ in driver.scan("log/", "log0")] == ["log/2"]
        assert (driver.guesses.holds, driver.guesses.misses) == (0, 1)
    finally:
        other.close()


def test_what_a_run_learnt_is_kept_only_when_it_commits(driver, redis_server):
    """``Txn.after_commit``: a run that takes a wrong guess (or conflicts) and runs again
    leaves nothing it learnt; the run that commits does (the format layer's trust in a
    consolidated document was kept from a run on guesses: tests/format/test_consolidated_trust.py)."""
    other = open_driver(redis_server.url(0, prefix=driver.prefix))
    try:
        driver.put("v", b"old")
        kept: list[bytes] = []

        def learn(t):
            seen = t.get("v")
            if not kept and seen == b"old":
                other.put("v", b"new")  # the guess of "old" is wrong by the commit
            t.after_commit(lambda: kept.append(seen))
            t.put("w", seen)

        driver.transact(learn)
        assert kept == [b"new"] and driver.get("w") == b"new"
        reads = []
        driver.transact(lambda t: t.after_commit(lambda: reads.append(1)), write=False)
        assert reads == [1]  # a read transaction's: at once
    finally:
        other.close()

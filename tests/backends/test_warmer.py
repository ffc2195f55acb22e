"""A long listing's next keys are read ahead in a thread of their own (``Driver.warm``,
zarrfs.backends.warmer), on LMDB and SQLite: ahead of the listing's scan, within what it asked
for, safely beside LMDB's map growth, and ended with the driver."""

from __future__ import annotations

import os
import threading

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.warmer import STEP
from zarrfs.fs.listing import FIRST_BATCH, DirListing
from zarrfs.fs.tree import Tree

URLS = {"lmdb": "lmdb://{}/db.lmdb", "sqlite": "sqlite://{}/db.zarrdb"}


@pytest.fixture(params=sorted(URLS))
def url(request, tmp_path):
    return URLS[request.param].format(tmp_path)


def _fill(driver, keys: list[str], value: bytes = b"v") -> None:
    driver.transact(lambda t: [t.put(k, value) for k in keys])


def test_a_long_listing_reads_the_keys_of_its_next_windows_ahead(url):
    with open_driver(url) as driver:
        _fill(driver, [f"f/{i:05}" for i in range(3000)] + [f"g/{i:05}" for i in range(3000)])
        listing = DirListing(Tree(driver), "f")
        first = listing.rows(2, 10)  # the first window alone: FIRST_BATCH names
        assert [name for name, _, _ in first] == [f"{i:05}" for i in range(10)]
        assert len(listing.window) == FIRST_BATCH
        assert driver.warmer is not None
        assert driver.warmer.settled(10)
        # The whole folder was walked while the listing had read its first window, and the
        # walk stopped at the folder's end (within its last step).
        assert driver.warmer.reached >= b"f/02999"
        assert driver.warmer.reached <= f"g/{STEP:05}".encode()
        names = [name for name, _, _ in listing.entries(0)][2:]
        assert names == [f"{i:05}" for i in range(3000)]


def test_a_short_listing_asks_for_nothing(url):
    with open_driver(url) as driver:
        _fill(driver, [f"f/{i:05}" for i in range(FIRST_BATCH - 1)])
        assert len(list(DirListing(Tree(driver), "f").entries(0))) == FIRST_BATCH + 1
        assert driver.warmer is None  # no thread for a folder read in one window


def test_the_walk_keeps_to_what_was_asked(url):
    with open_driver(url) as driver:
        _fill(driver, [f"k{i:05}" for i in range(10000)])
        driver.warm("k00000", None, 1000)  # four steps of 256 keys
        warmer = driver.warmer
        assert warmer.settled(10)
        assert b"k01000" <= warmer.reached <= b"k01030"
        # Asked again from before where it got to: it goes on from there, half as far.
        driver.warm("k00500", None, 1000)
        assert warmer.settled(10)
        assert b"k01500" <= warmer.reached <= b"k01540"
        driver.warm("k09900", "k09950", 5000)  # a bound: it stops there, or a step past it
        assert warmer.settled(10)
        assert b"k09949" <= warmer.reached <= b"k09999"  # the database's end within the step


def test_lmdb_maps_grow_while_keys_are_walked(tmp_path):
    with open_driver(f"lmdb://{tmp_path}/db.lmdb?map_size=1M&map_max=256M") as driver:
        _fill(driver, [f"a/{i:06}" for i in range(20000)])
        stop = threading.Event()

        def keep_asking() -> None:
            while not stop.is_set():
                driver.warm("a/", "a0", 20000)
                driver.warmer.settled(5)

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            grown = driver.env.info()["map_size"]
            value = os.urandom(64 << 10)
            for i in range(400):  # 25 MiB: the data map grows several times under the walks
                driver.put(f"b/{i:04}", value)
            assert driver.env.info()["map_size"] > grown
        finally:
            stop.set()
            asker.join(30)
        assert all(driver.get(f"b/{i:04}") == value for i in range(400))
        assert len(driver.scan("a/", "a0")) == 20000


def test_the_thread_ends_with_the_driver(url):
    driver = open_driver(url)
    _fill(driver, [f"f/{i:05}" for i in range(1000)])
    assert len(list(DirListing(Tree(driver), "f").entries(0))) == 1002
    warmer = driver.warmer
    assert warmer is not None and warmer._thread is not None
    driver.close()
    assert not warmer._thread.is_alive()
    driver.warm("f/", None, 100)  # asked after the close: nothing starts
    assert warmer.settled(1)

"""The LMDB driver's maps grow when a transaction finds one full (zarrfs.backends.lmdb.maps):
the side map (parts of large files, long keys) up to ``?map_max=`` or the data map's size, the
data map only up to ``?map_max=``; a map another process grew is adopted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zarrfs.backends import open_driver
from zarrfs.backends.base import SIDE, StorageFullError
from zarrfs.fs.api import Operations
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.tree import Tree

MIB = 1 << 20


def test_the_side_map_grows_for_a_value_larger_than_it(tmp_path):
    with open_driver(f"lmdb://{tmp_path}/db.lmdb?side_map_size=1M") as driver:
        value = os.urandom(5 * MIB)
        driver.put("big", value, SIDE)
        assert driver.get("big", SIDE) == value
        assert driver.side.env(False).info()["map_size"] >= 5 * MIB
        long_key = "k" * 600  # held in the side environment too (lmdb.longkeys)
        driver.put(long_key, value)
        assert driver.get(long_key) == value


def test_a_parted_file_larger_than_the_side_map(tmp_path):
    url = f"lmdb://{tmp_path}/db.lmdb?side_map_size=1M"
    with open_driver(url) as driver:
        tree = Tree(driver)
        ops = Operations(tree, HandleTable(tree, spill_threshold=64 << 10, parts_above=256 << 10))
        data = os.urandom(6 * MIB)
        fh = ops.create("big", 0o644, os.O_WRONLY, 0, 0)
        for start in range(0, len(data), MIB):
            ops.handles.write(fh, data[start : start + MIB], start)
        ops.flush(fh)
        ops.release(fh)
        assert len(driver.get("big")) == 49  # a manifest: the parts are in the side map
        assert tree.read_value("big") == data
    again = open_driver(url)  # the grown map is kept in the environment
    try:
        assert Tree(again).read_value("big") == data
    finally:
        again.close()


def test_the_side_map_stops_at_its_bound(tmp_path):
    with open_driver(f"lmdb://{tmp_path}/db.lmdb?map_size=2M&side_map_size=1M") as driver:
        with pytest.raises(StorageFullError, match="side map is full"):
            driver.put("big", os.urandom(3 * MIB), SIDE)
        assert driver.get("big", SIDE) is None
        driver.put("small", b"x", SIDE)  # the store goes on


def test_the_data_map_grows_up_to_map_max_only(tmp_path):
    with open_driver(f"lmdb://{tmp_path}/capped.lmdb?map_size=1M") as driver:
        with pytest.raises(StorageFullError, match="map is full"):  # ?map_size= alone: a quota
            driver.put("big", os.urandom(3 * MIB))
    with open_driver(f"lmdb://{tmp_path}/grows.lmdb?map_size=1M&map_max=8M") as driver:
        value = os.urandom(3 * MIB)
        driver.put("big", value)
        assert driver.get("big") == value
        with pytest.raises(StorageFullError):
            driver.put("bigger", os.urandom(9 * MIB))
        assert driver.get("bigger") is None and driver.get("big") == value


def test_a_map_another_process_grew_is_adopted(tmp_path):
    url = f"lmdb://{tmp_path}/db.lmdb?map_size=1M&map_max=64M"
    with open_driver(url) as driver:
        driver.put("small", b"x")
        code = (
            "import sys; from zarrfs.backends import open_driver; d = open_driver(sys.argv[1]); "
            "d.put('big', b'y' * (6 << 20)); d.close()"
        )
        subprocess.run([sys.executable, "-c", code, url], check=True, env={**os.environ})
        assert driver.size("big") == 6 * MIB  # the one-shot size adopts it
        assert driver.get("big") == b"y" * (6 * MIB)
        driver.put("after", b"z" * (2 * MIB))
        assert driver.get("after") == b"z" * (2 * MIB)

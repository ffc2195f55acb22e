"""``zarrfs copy``: move a hierarchy between a plain folder (a DirectoryStore) and a database,
or between two databases, key for key, without a mount."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from zarrfs.backends import open_driver
from zarrfs.backends.base import VALUES, Driver

BATCH = 256


def is_url(location: str) -> bool:
    """Whether ``location`` names a database (``scheme://...``) rather than a folder."""
    return "://" in location


def folder_items(root: str) -> Iterator[tuple[str, bytes]]:
    """Every file under ``root`` as ``(key, value)``, in key order."""
    base = Path(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            yield path.relative_to(base).as_posix(), path.read_bytes()


def database_items(driver: Driver) -> Iterator[tuple[str, bytes]]:
    """Every Zarr key of a database with its value, read in batches."""
    after = ""
    while True:
        batch = driver.scan(after, None, fetch=VALUES, limit=BATCH)
        yield from batch
        if len(batch) < BATCH:
            return
        after = batch[-1][0] + "\0"


def copy(source: str, dest: str) -> int:
    """Copy every key of ``source`` to ``dest``; return how many were copied."""
    src_driver = open_driver(source, readonly=True) if is_url(source) else None
    items = database_items(src_driver) if src_driver else folder_items(source)
    count = 0
    try:
        if is_url(dest):
            with open_driver(dest) as driver:
                pending: list[tuple[str, bytes]] = []
                for item in items:
                    pending.append(item)
                    if len(pending) >= BATCH:
                        driver.transact(lambda t, p=pending: [t.put(k, v) for k, v in p])
                        count += len(pending)
                        pending = []
                driver.transact(lambda t: [t.put(k, v) for k, v in pending])
                count += len(pending)
        else:
            for key, value in items:
                path = Path(dest, *key.split("/"))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(value)
                count += 1
    finally:
        if src_driver:
            src_driver.close()
    return count

"""``zarrfs copy``: move a hierarchy between a plain folder (a DirectoryStore) and a database,
or between two databases, key for key, without a mount.

A missing source is an error before anything is created at the destination. ``validate`` runs
the format layer's whole-store checks (:func:`zarrfs.format.check.check_items`, as ``zarrfs
check``) over the source first and copies nothing if they find an error. ``progress`` shows a
tqdm bar on stderr (keys, bytes, rate, time left), after a first pass that sizes the source.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from zarrfs.backends.base import SIZES, VALUES, Driver

BATCH = 256  # keys per read batch and per write transaction
BATCH_BYTES = 64 << 20  # and at most this much data per write transaction


class CopyError(Exception):
    """The copy cannot start (missing source, invalid data with ``validate``): one line."""


def is_url(location: str) -> bool:
    """Whether ``location`` names a database (``scheme://...``) rather than a folder."""
    return "://" in location


def _folder_files(root: str) -> Iterator[tuple[str, str]]:
    """``(key, path)`` of every file under ``root``, in key order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in sorted(filenames):
            yield prefix + name, os.path.join(dirpath, name)


def folder_items(root: str) -> Iterator[tuple[str, bytes]]:
    """Every file under ``root`` as ``(key, value)``, in key order."""
    for key, path in _folder_files(root):
        with open(path, "rb") as fh:
            yield key, fh.read()


def database_items(driver: Driver, fetch: str = VALUES) -> Iterator[tuple[str, bytes]]:
    """Every Zarr key of a database with its value (or size), read in batches."""
    after = ""
    while True:
        batch = driver.scan(after, None, fetch=fetch, limit=BATCH)
        yield from batch
        if len(batch) < BATCH:
            return
        after = batch[-1][0] + "\0"


def _open_source(source: str) -> Driver | None:
    from zarrfs.daemon import open_database
    from zarrfs.options import parse_options
    from zarrfs.urls import MountFailure

    if not is_url(source):
        if not os.path.exists(source):
            raise CopyError(f"source {source} does not exist")
        if not os.path.isdir(source):
            raise CopyError(f"source {source} is not a folder (nor a database URL)")
        return None
    try:
        return open_database(source, parse_options(["ro"]), hint=False)
    except MountFailure as exc:
        raise CopyError(f"source {exc}") from None


def _validate(source: str, driver: Driver | None) -> None:
    from zarrfs.format.check import check_database, check_items
    from zarrfs.format.keys import is_metadata_key

    if driver is not None:
        problems = check_database(driver)
    else:

        def get(key: str) -> bytes | None:
            try:
                with open(os.path.join(source, *key.split("/")), "rb") as fh:
                    return fh.read()
            except OSError:
                return None

        items = ((k, get(k) if is_metadata_key(k) else None) for k, _ in _folder_files(source))
        problems = check_items(items, get)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        first = errors[0]
        raise CopyError(
            f"{source} does not pass validation, nothing was copied: {len(errors)} problem(s), "
            f"the first: {first.key}: {first.rule}: {first.value} (zarrfs check lists them all)"
        )


def _measure(source: str, driver: Driver | None) -> tuple[int, int]:
    """Keys and bytes of the source, for the progress bar."""
    if driver is not None:
        sizes = [size or 0 for _, size in database_items(driver, SIZES)]
    else:
        sizes = [os.stat(path).st_size for _, path in _folder_files(source)]
    return len(sizes), sum(sizes)


class _Progress:
    """A tqdm bar of bytes with the keys done alongside; nothing when disabled."""

    def __init__(self, enabled: bool, keys: int, total: int) -> None:
        self.bar = None
        self.keys = keys
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.2,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} {postfix} [{elapsed}<{remaining}, {rate_fmt}]",
            )

    def advance(self, count: int, size: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{count}/{self.keys} keys", refresh=False)
            self.bar.update(size)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def copy(source: str, dest: str, progress: bool = False, validate: bool = False) -> tuple[int, int]:
    """Copy every key of ``source`` to ``dest``; return how many keys and bytes were copied."""
    from zarrfs.daemon import open_database
    from zarrfs.options import parse_options

    src_driver = _open_source(source)
    count = size = 0
    try:
        if validate:
            _validate(source, src_driver)
        bar = _Progress(progress, *(_measure(source, src_driver) if progress else (0, 0)))
        items = database_items(src_driver) if src_driver else folder_items(source)
        try:
            if is_url(dest):
                with open_database(dest, parse_options(["create"])) as driver:
                    pending: list[tuple[str, bytes]] = []
                    pending_bytes = 0

                    def flush() -> None:
                        nonlocal count, size, pending, pending_bytes
                        batch = pending
                        driver.transact(lambda t: [t.put(k, v) for k, v in batch])
                        count += len(batch)
                        size += pending_bytes
                        bar.advance(count, pending_bytes)
                        pending, pending_bytes = [], 0

                    for item in items:
                        pending.append(item)
                        pending_bytes += len(item[1])
                        if len(pending) >= BATCH or pending_bytes >= BATCH_BYTES:
                            flush()
                    flush()
            else:
                made: set[str] = set()
                done = 0
                for key, value in items:
                    path = os.path.join(dest, *key.split("/"))
                    folder = os.path.dirname(path)
                    if folder not in made:
                        Path(folder).mkdir(parents=True, exist_ok=True)
                        made.add(folder)
                    with open(path, "wb") as fh:
                        fh.write(value)
                    count += 1
                    size += len(value)
                    done += len(value)
                    if count % BATCH == 0:
                        bar.advance(count, done)
                        done = 0
                bar.advance(count, done)
        finally:
            bar.close()
    finally:
        if src_driver:
            src_driver.close()
    return count, size

"""``zarrfs copy`` and :func:`zarrfs.copy`: a hierarchy from one place to another, key for key and
byte for byte (chunks never decoded, consolidated metadata copied as the key it is), with the
extended attributes of files and folders (:mod:`zarrfs.tools.xattrcopy`), without a mount.

Either end is a folder, a database URL (any driver) or, from Python, a zarr-python 3 store (its
async API, several keys at a time). Between folders and databases the driver is used directly:
reads in batches, writes of 256 keys or 64 MiB per transaction, files written by a few threads.
``if_exists``: ``replace`` (the default) overwrites, ``skip`` keeps keys already whole at the
destination (the source's size, so rerunning an interrupted copy with ``skip`` finishes it),
``raise`` copies nothing if any key exists (checked before the first write). ``dry_run`` counts
what would be copied and skipped, writing nothing; ``progress`` shows a tqdm bar on stderr after a
pass that sizes the source. A parted value (:mod:`zarrfs.fs.parts`) is copied part by part, a read
transaction per part (to a database in parts of the same size); one replaced at the source
meanwhile fails the copy. A missing source fails before anything is created; ``validate`` runs
:func:`zarrfs.format.check.check_items` over the source first and copies nothing on an error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zarrfs.backends.base import KEYS, SIDE, SIZES, VALUES, Driver, Get
from zarrfs.fs import parts, records
from zarrfs.fs.errors import FsError
from zarrfs.fs.manifest import MAGIC, MANIFEST_SIZE, MAP_MAGIC
from zarrfs.fs.names import key_text, name_bytes
from zarrfs.fs.sidedata import attr_key, xattr_key
from zarrfs.tools import xattrcopy

BATCH = 256  # keys per read batch and per write transaction
BATCH_BYTES = 64 << 20  # and at most this much data per write transaction
WORKERS = 4  # threads writing files, or keys in flight to a zarr store
IF_EXISTS = ("replace", "skip", "raise")


class CopyError(Exception):
    """The copy cannot start (missing source, invalid data with ``validate``): one line."""


def is_url(location: str) -> bool:
    """Whether ``location`` names a database (``scheme://...``, or a ``.zarrdb`` file, which is
    SQLite) rather than a folder."""
    from zarrfs.backends.registry import about, bare_path_scheme

    return "://" in location or about(bare_path_scheme(location)).bare != ""


def folder_key(rel: str) -> str:
    """The key of a path relative to a folder, its names mapped as a mount maps them
    (``fs.names``: a byte that is not UTF-8 becomes U+EF80 + byte), so that a copy and a mount
    of the same tree agree."""
    try:
        return "/".join(key_text(os.fsencode(name)) for name in rel.split(os.sep))
    except FsError as exc:
        raise CopyError(f"cannot copy {rel!r}: {exc}") from None


def key_path(root: str, key: str) -> str:
    """The path under ``root`` of ``key``, the inverse of :func:`folder_key`."""
    return os.path.join(root, *(os.fsdecode(name_bytes(name)) for name in key.split("/")))


def folder_files(root: str) -> Iterator[tuple[str, str]]:
    """``(key, path)`` of every file under ``root``, in key order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else folder_key(rel) + "/"
        for name in sorted(filenames):
            yield prefix + folder_key(name), os.path.join(dirpath, name)


def folder_items(root: str) -> Iterator[tuple[str, bytes]]:
    """Every file under ``root`` as ``(key, value)``, in key order."""
    for key, path in folder_files(root):
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
    from zarrfs.dbfiles import open_database
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
                with open(key_path(source, key), "rb") as fh:
                    return fh.read()
            except OSError:
                return None

        items = ((k, get(k) if is_metadata_key(k) else None) for k, _ in folder_files(source))
        problems = check_items(items, get)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        first = errors[0]
        raise CopyError(
            f"{source} does not pass validation, nothing was copied: {len(errors)} problem(s), "
            f"the first: {first.key}: {first.rule}: {first.value} (zarrfs check lists them all)"
        )


def _measure(source: str, driver: Driver | None) -> tuple[int, int]:
    """Keys and bytes of the source, for the progress bar (counted as they stream by)."""
    if driver is not None:
        sizes = (size or 0 for _, size in database_items(driver, SIZES))
    else:
        sizes = (os.stat(path).st_size for _, path in folder_files(source))
    keys = total = 0
    for size in sizes:
        keys += 1
        total += size
    return keys, total


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


@dataclass
class Copied:
    """What a copy did (or, with ``dry_run``, would do): keys and bytes copied, keys skipped."""

    keys: int = 0
    bytes: int = 0
    skipped: int = 0


class _Parted:
    """A value a mount stored in parts at the source: its size, and its bytes read a part at a
    time (each part in a read transaction of its own), never whole."""

    def __init__(self, driver: Driver, parted: Any) -> None:
        self.driver = driver
        self.parted = parted

    def __len__(self) -> int:
        return self.parted.size

    def readinto(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` with the bytes from ``offset`` (fewer at the end): ``parts.store``'s
        source."""
        size = min(len(view), self.parted.part - offset % self.parted.part)  # within one part
        piece = self.driver.transact(lambda t: parts.read_parts(t, self.parted, offset, size), write=False)
        view[: len(piece)] = piece
        return len(piece)

    def pieces(self) -> Iterator[bytes]:
        """The bytes, a part at a time."""
        buffer = bytearray(min(self.parted.part, self.parted.size))
        for n in range(self.parted.count):
            view = memoryview(buffer)[: self.parted.length(n)]
            got = 0
            while got < len(view):
                got += self.readinto(n * self.parted.part + got, view[got:])
            yield view

    def to_bytes(self) -> bytes:
        """The whole value (for an end that takes whole values only)."""
        return b"".join(bytes(piece) for piece in self.pieces())


def _whole(value: Any) -> Any:
    return value.to_bytes() if isinstance(value, _Parted) else value


class _Folder:
    """A folder end: files are keys."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, key: str) -> str:
        return key_path(self.root, key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return folder_items(self.root)

    def keys(self) -> Iterator[str]:
        return (k for k, _ in folder_files(self.root))

    def exists(self, keys: list[str]) -> list[bool]:
        return [os.path.isfile(self._path(k)) for k in keys]

    def with_xattrs(self, keys: list[str]) -> list[str]:
        return [k for k in keys if xattrcopy.has_folder_xattrs(self._path(k))]

    def sizes(self, keys: list[str]) -> list[int | None]:
        paths = [self._path(k) for k in keys]
        return [os.path.getsize(p) if os.path.isfile(p) else None for p in paths]

    def write(self, batch: list[tuple[str, Any]]) -> None:
        def one(item: tuple[str, Any]) -> None:
            path = self._path(item[0])
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                if isinstance(item[1], _Parted):
                    for piece in item[1].pieces():
                        fh.write(piece)
                else:
                    fh.write(item[1])

        # File writes release the GIL: a few threads keep the disk busy. Parted values are
        # read from the source in this thread (a driver's connection is not shared).
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(one, [item for item in batch if not isinstance(item[1], _Parted)]))
        for item in batch:
            if isinstance(item[1], _Parted):
                one(item)

    def close(self) -> None:
        pass


class _Database:
    """A database end, through its driver: batched reads, a transaction per batch of writes."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def items(self) -> Iterator[tuple[str, Any]]:
        # A value a mount stored in parts (zarrfs.fs.parts) comes as a _Parted, read later.
        for key, value in database_items(self.driver):
            if len(value) == MANIFEST_SIZE and bytes(value[: len(MAGIC)]) in (MAGIC, MAP_MAGIC):
                found = self.driver.transact(lambda t, k=key, v=value: parts.current(t, k, v), write=False)
                if found is not None:
                    yield key, _Parted(self.driver, found)
                    continue
            yield key, value

    def keys(self) -> Iterator[str]:
        return (k for k, _ in database_items(self.driver, KEYS))

    def exists(self, keys: list[str]) -> list[bool]:
        return [size is not None for size in self.sizes(keys)]

    def with_xattrs(self, keys: list[str]) -> list[str]:
        reads = [Get(xattr_key(k), SIDE) for k in keys]
        found = self.driver.transact(lambda t: t.read_many(reads), write=False)
        return [k for k, raw in zip(keys, found, strict=True) if raw is not None]

    def sizes(self, keys: list[str]) -> list[int | None]:
        def sized(t: Any) -> list[int | None]:
            found = []
            for k in keys:
                size = t.size(k)
                if size == MANIFEST_SIZE:  # a value stored in parts: the size it stands for
                    current = parts.current(t, k, t.get(k))
                    size = size if current is None else current.size
                found.append(size)
            return found

        return self.driver.transact(sized, write=False)

    def write(self, batch: list[tuple[str, Any]]) -> None:
        # A value above the database's largest is stored in parts, as a mount stores it; so is
        # a value stored in parts at the source, streamed in parts of the same size.
        limit = self.driver.transact(lambda t: t.max_value, write=False)
        parted = [(k, v) for k, v in batch if isinstance(v, _Parted)]
        whole = [
            (k, v) for k, v in batch if not isinstance(v, _Parted) and (limit is None or len(v) <= limit)
        ]
        if whole:
            parts.free(self.driver, self.driver.transact(lambda t: _put_whole(t, whole)))
        for key, value in parted:
            part = min(value.parted.part, limit or value.parted.part)
            records.put_parts(self.driver, key, len(value), value.readinto, part)
        for key, value in batch:
            if not isinstance(value, _Parted) and limit is not None and len(value) > limit:
                records.put_value(self.driver, key, value, parts.part_size(parts.DEFAULT_ABOVE, limit))

    def close(self) -> None:
        self.driver.close()


def _put_whole(t: Any, items: list[tuple[str, Any]]) -> list[Any]:
    """Put ``items``; the parts that values a mount stored in parts there let go of (freed
    after the commit, as a mount frees them)."""
    records = t.read_many([Get(attr_key(k), SIDE) for k, _ in items])
    freed = [
        parts.let_go(t, k, raw) for (k, _), raw in zip(items, records, strict=True) if parts.parted_of(raw)
    ]
    for k, v in items:
        t.put(k, v)
    return [p for p in freed if p is not None]


class _Store:
    """A zarr-python 3 store end, through its async API (several keys at a time)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _run(self, coro):
        from zarr.core.sync import sync

        return sync(coro)

    def keys(self) -> list[str]:
        async def listed() -> list[str]:
            return sorted([k async for k in self.store.list()])

        return self._run(listed())

    def items(self) -> Iterator[tuple[str, bytes]]:
        from zarr.core.buffer import default_buffer_prototype

        proto = default_buffer_prototype()
        names = self.keys()
        for start in range(0, len(names), BATCH):
            part = names[start : start + BATCH]
            values = self._run(_gather([self.store.get(k, proto) for k in part]))
            for key, value in zip(part, values, strict=True):
                if value is not None:
                    yield key, value.to_bytes()

    def exists(self, keys: list[str]) -> list[bool]:
        return self._run(_gather([self.store.exists(k) for k in keys]))

    def with_xattrs(self, keys: list[str]) -> list[str]:
        return []  # a zarr store has none, and none are carried from it

    def sizes(self, keys: list[str]) -> list[int | None]:
        async def size(k: str) -> int | None:
            try:
                return await self.store.getsize(k)
            except FileNotFoundError:
                return None

        return self._run(_gather([size(k) for k in keys]))

    def write(self, batch: list[tuple[str, bytes]]) -> None:
        from zarr.core.buffer import default_buffer_prototype

        buf = default_buffer_prototype().buffer
        self._run(_gather([self.store.set(k, buf.from_bytes(_whole(v))) for k, v in batch]))

    def close(self) -> None:
        pass


async def _gather(coros: list) -> list:
    import asyncio

    sem = asyncio.Semaphore(WORKERS * 4)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


def _open_end(location: Any, source: bool) -> Any:
    from zarrfs.dbfiles import open_database
    from zarrfs.options import parse_options

    if not isinstance(location, str):  # a zarr-python 3 store
        return _Store(location)
    if source:
        driver = _open_source(location)
        return _Folder(location) if driver is None else _Database(driver)
    if is_url(location):
        return _Database(open_database(location, parse_options(["create"])))
    return _Folder(location)


def _batches(items: Iterable[tuple[str, bytes]]) -> Iterator[list[tuple[str, bytes]]]:
    pending: list[tuple[str, bytes]] = []
    pending_bytes = 0
    for item in items:
        pending.append(item)
        pending_bytes += len(item[1])
        if len(pending) >= BATCH or pending_bytes >= BATCH_BYTES:
            yield pending
            pending, pending_bytes = [], 0
    if pending:
        yield pending


def copy(
    source: Any,
    dest: Any,
    *,
    if_exists: str = "replace",
    dry_run: bool = False,
    progress: bool = False,
    validate: bool = False,
) -> Copied:
    """Copy every key of ``source`` to ``dest`` (each a folder, a database URL or a zarr-python 3
    store) and say what was copied; see the module docstring for ``if_exists`` and ``dry_run``."""
    if if_exists not in IF_EXISTS:
        raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}")
    source, dest = _as_database(source), _as_database(dest)
    _check_ends(source, dest)
    src = _open_end(source, source=True)
    result = Copied()
    try:
        driver = src.driver if isinstance(src, _Database) else None
        if validate and isinstance(source, str):
            _validate(source, driver)
        if if_exists == "raise":
            _refuse_existing(src, dest)
        # A dry run opens the destination only to ask what it holds, and creates nothing.
        dst = None if dry_run and not _exists_at_all(dest) else _open_end(dest, source=False)
        measured = _measure(source, driver) if progress and isinstance(source, str) else (0, 0)
        bar = _Progress(progress, *measured)
        try:
            # The keys skipped whose extended attributes are not carried: only those that have
            # some at the source (what _carry_xattrs holds anyway), not every key skipped.
            skipped: set[str] = set()
            for batch in _batches(src.items()):
                if if_exists == "skip" and dst is not None:
                    sizes = dst.sizes([k for k, _ in batch])
                    whole = [size == len(v) for (_, v), size in zip(batch, sizes, strict=True)]
                    result.skipped += sum(whole)
                    kept = [item[0] for item, w in zip(batch, whole, strict=True) if w]
                    if kept:
                        skipped.update(src.with_xattrs(kept))
                    # What is there already counts on the bar too, so that it ends at 100%.
                    there = sum(len(v) for (_, v), w in zip(batch, whole, strict=True) if w)
                    bar.advance(result.keys + result.skipped, there)
                    batch = [item for item, w in zip(batch, whole, strict=True) if not w]
                if batch and not dry_run:
                    dst.write(batch)
                result.keys += len(batch)
                done = sum(len(v) for _, v in batch)
                result.bytes += done
                bar.advance(result.keys + result.skipped, done)
            if not dry_run:
                _carry_xattrs(src, dst, skipped)
        finally:
            bar.close()
            if dst is not None:
                dst.close()
    finally:
        src.close()
    return result


def _carry_xattrs(src: Any, dst: Any, skipped: set[str]) -> None:
    """The extended attributes of what was copied, between folders and databases."""
    if isinstance(src, _Folder):
        found = xattrcopy.folder_xattrs(src.root)
    elif isinstance(src, _Database):
        found = xattrcopy.database_xattrs(src.driver)
    else:
        return
    items = [(k, x) for k, x in found if k not in skipped]
    if items and isinstance(dst, _Folder):
        xattrcopy.put_folder_xattrs(dst.root, items)
    elif items and isinstance(dst, _Database):
        xattrcopy.put_database_xattrs(dst.driver, items)


def _exists_at_all(dest: Any) -> bool:
    """Whether a destination folder or file database is there already (a dry run creates none)."""
    from zarrfs.backends.urls import database_path

    if not isinstance(dest, str):
        return True
    path = database_path(dest) if is_url(dest) else dest
    return path is None or os.path.exists(path)


def _as_database(location: Any) -> Any:
    """A path that holds an LMDB database as its ``lmdb://`` URL (what a bare path means to
    every command: its keys are copied, not its ``data.mdb``); anything else as it is."""
    from zarrfs.backends.registry import bare_path_scheme, what_is_there
    from zarrfs.backends.urls import whole_database

    if isinstance(location, str) and not is_url(location):
        scheme = bare_path_scheme(location)  # the one that takes it: LMDB
        if what_is_there(scheme, location) == "database":
            return whole_database(f"{scheme}://" + os.path.abspath(location))  # data.mdb: its folder
    return location


def _identity(location: str) -> str:
    """What tells two ends apart: a file database's or a folder's real path, else the URL
    without credentials."""
    from zarrfs.backends.urls import database_path, shown_url, whole_database

    path = database_path(whole_database(location)) if is_url(location) else location
    return os.path.realpath(path) if path is not None else shown_url(location)


def _check_ends(source: Any, dest: Any) -> None:
    """Refuse, before anything is opened, a copy onto itself or into its own folder, and a
    destination folder where a file is."""
    if not (isinstance(source, str) and isinstance(dest, str)):
        return
    same, inside = _identity(source), _identity(dest)
    if same == inside:
        what = "database" if is_url(source) or is_url(dest) else "folder"
        raise CopyError(f"{source} and {dest} are the same {what}: nothing to copy (give another one)")
    if not is_url(source) and not is_url(dest) and inside.startswith(same.rstrip("/") + "/"):
        raise CopyError(f"destination {dest} is inside the source folder {source}: give a folder outside it")
    if is_url(dest):
        return
    at = dest
    while at and not os.path.lexists(at):
        at = os.path.dirname(at.rstrip("/"))
    if at and not os.path.isdir(at):
        from zarrfs.backends.registry import about, kind_at

        kind = kind_at(at)
        what = f"{about(kind).kind} (its URL: {kind}://{os.path.abspath(at)})" if kind else "a file"
        where = f"destination {dest}" if at == dest else f"destination {dest}: {at}"
        raise CopyError(f"{where} is {what}, not a folder: give a folder, or a database URL")


def _refuse_existing(src: Any, dest: Any) -> None:
    """``if_exists="raise"``: fail before any write when a key to copy is at the destination."""
    if not _exists_at_all(dest):
        return
    dst = _open_end(dest, source=False)
    try:
        for batch in _batches((k, b"") for k in src.keys()):
            keys = [k for k, _ in batch]
            found = [k for k, there in zip(keys, dst.exists(keys), strict=True) if there]
            if found:
                raise CopyError(
                    f"{len(found)} key(s) to copy exist at the destination, the first: {found[0]};"
                    " nothing was copied (--if-exists skip or replace)"
                )
    finally:
        dst.close()


__all__ = ["Copied", "CopyError", "copy"]

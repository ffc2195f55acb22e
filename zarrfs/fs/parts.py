"""Large files stored in parts: bounded memory whatever a file's size, and no value limit.

A driver's ``put`` of N bytes costs about N bytes of memory (LMDB's dirty pages, the copies
SQLite, redis-py and psycopg make of a bound value) and each database caps a value (LMDB 4 GiB,
SQLite 10^9 bytes, Redis' ``proto-max-bulk-len``, PostgreSQL 1 GiB). So a file larger than
``parts_above`` (a mount option, 64 MiB by default), or than the driver's largest value, is
stored as:

* parts of :func:`part_size` bytes (16 MiB by default) under side keys ``p:<id>/<n>``, ``id``
  fresh for every stored version (:mod:`zarrfs.fs.manifest`). Each part is read from the
  file's spill buffer by ``pread`` into one reused buffer and put in its own write transaction
  before the commit: a driver's transaction never holds more than one part;
* then the commit, one transaction as for any file: under the data key a 49-byte manifest
  (magic, id, total size, part size), and the same manifest at the end of the file's
  attribute record. Lookups and listings show the total size when the record says parted and
  the data key holds that many bytes; reads check the manifest, then read ranges of the parts
  (immutable once written: the id pins the version).

The parts of the version a commit replaces, or of a file whose last name is removed, are
deleted after that commit, each part in its own transaction (freed memory stays one part: LMDB
keeps a copy of a removed side value until the commit). A crash between the parts and the
commit, or between the commit and the deletions, leaves orphan parts only, never a changed
file: ``zarrfs check`` reports them and ``zarrfs check --repair`` deletes them.

Hard links share their parts (each name holds the manifest): the parts go when no name is
left. A rename moves the manifest and the record; the parts stay where they are. Metadata
documents and files of the decoded view are never parted (the format layer reads them whole).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from zarrfs.backends.base import DATA, KEYS, PARTS, SIDE, Size, Txn
from zarrfs.fs import hardlinks
from zarrfs.fs.errors import FsError
from zarrfs.fs.manifest import MAGIC, MANIFEST_SIZE, Parted, new_id
from zarrfs.fs.sidedata import Attrs, attr_key

log = logging.getLogger("zarrfs.fs.parts")

DEFAULT_ABOVE = 64 << 20
PART_SIZE = 16 << 20
MIN_PART = 4096


def part_size(above: int, max_value: int | None) -> int:
    """The size of the parts of a mount that parts files above ``above`` bytes: 16 MiB, less
    for a low threshold (the model tests part files of a few KiB), never above the driver's
    largest value."""
    size = min(PART_SIZE, max(above, MIN_PART))
    return min(size, max_value) if max_value else size


def parted_of(raw_attrs: bytes | None) -> Parted | None:
    """The manifest an attribute record ends with, if any."""
    attrs = Attrs.unpack(raw_attrs) if raw_attrs is not None else None
    return attrs.parted if attrs is not None else None


# ---------------------------------------------------------------------- reading (in a transaction)
def current(t: Txn, key: str, value: Any = None, parted: Parted | None | bool = False) -> Parted | None:
    """The parts of the value at ``key`` when it is stored in parts: its data key holds the
    manifest its attribute record ends with. ``value``: the data key's value, when read;
    ``parted``: the record's manifest, when read (a probe reads the record)."""
    if value is None:
        if parted is False and t.size(key) != MANIFEST_SIZE:
            return None
        value = t.get(key)
    if value is None or len(value) != MANIFEST_SIZE:
        return None
    if not isinstance(parted, Parted):
        parted = parted_of(t.get(attr_key(key), SIDE))
    return parted if parted is not None and parted.manifest() == bytes(value) else None


def let_go(t: Txn, key: str, raw_attrs: bytes | None, *, every_name: bool = False) -> Parted | None:
    """The parts that the value at ``key`` lets go of when a writer that is not a mount (the
    zarr-python 3 store) overwrites or deletes it; ``raw_attrs``: its attribute record, both
    read before the change, in its transaction. Its version when the data key holds the
    manifest the record names and no other name of a hard link group holds it (the parts go
    with the last name, as through a mount) or ``every_name`` of the group is being rewritten;
    :func:`free` them after the commit."""
    parted = parted_of(raw_attrs)
    if parted is None or current(t, key, parted=parted) is None:
        return None
    if every_name:
        return parted
    group = hardlinks.load(t, key, t.get(hardlinks.pointer_key(key), SIDE))
    return parted if group is None or len(group.names) <= 1 else None


def read_parts(t: Txn, parted: Parted, offset: int, size: int) -> bytes:
    """``size`` bytes (fewer at the end) from ``offset`` of a parted value."""
    end = min(parted.size, offset + size) if size >= 0 else parted.size
    pieces: list[bytes] = []
    while offset < end:
        n, within = divmod(offset, parted.part)
        piece = t.read(parted.key(n), within, min(end - offset, parted.part - within), PARTS)
        if not piece:
            raise FsError(errno.EIO, f"part {n} of a value stored in parts ({parted.id}) is missing")
        pieces.append(piece)
        offset += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def read(t: Txn, key: str, offset: int, size: int, parted: Parted | None | bool = False) -> bytes | None:
    """Stored bytes of ``key`` from ``offset`` (a parted value's as well); None when absent.
    ``parted``: what the file's attribute record says (None: not parted), when a probe read it.

    Without it, the range is read first and the manifest looked for only when what came back
    may be a manifest's: an ordinary value costs one read (one round trip on a server)."""
    if parted is False and size >= 0:
        got = t.read(key, offset, size)
        if got is None or size == 0 or not may_be_manifest(got, offset, size):
            return got
        # A short read of the whole value: the value itself, no second read for it.
        whole_value = got if offset == 0 and len(got) == MANIFEST_SIZE < size else None
        found = current(t, key, whole_value)
        return got if found is None else read_parts(t, found, offset, size)
    found = current(t, key, parted=parted) if parted is not None else None
    if found is not None:
        return read_parts(t, found, offset, size)
    return t.read(key, offset, size)


def may_be_manifest(got: bytes, offset: int, size: int) -> bool:
    """Whether ``got``, what a read of ``size`` bytes from ``offset`` returned, may be from a
    value of exactly :data:`MANIFEST_SIZE` bytes that starts with the manifest's magic."""
    n = len(got)
    if n == size:  # the value goes on at least to the range's end
        fits = offset + size <= MANIFEST_SIZE
    elif n:  # a short read ends where the value ends
        fits = offset + n == MANIFEST_SIZE
    else:  # nothing from ``offset``: the value ends at or before it
        fits = offset >= MANIFEST_SIZE
    head = MAGIC[offset:]
    k = min(len(head), n)
    return fits and bytes(got[:k]) == head[:k]


def whole(t: Txn, key: str, value: Any) -> Any:
    """The value of ``key`` whose data key holds ``value``: assembled from its parts when it
    is parted."""
    if value is None or len(value) != MANIFEST_SIZE:
        return value
    found = current(t, key, value)
    return value if found is None else read_parts(t, found, 0, found.size)


def size_of(t: Txn, key: str) -> int | None:
    """The size of the value of ``key`` (a parted value's total), None when absent."""
    size = t.size(key)
    if size == MANIFEST_SIZE and (found := current(t, key)) is not None:
        return found.size
    return size


def reader(t: Txn, key: str) -> Callable[[int, int], bytes | None]:
    """``read(offset, size)`` of the value of ``key`` in transaction ``t``, the manifest
    looked up once."""
    found = current(t, key)
    if found is None:
        return lambda offset, size: read(t, key, offset, size)
    return lambda offset, size: read_parts(t, found, offset, size)


def check_present(t: Txn, key: str, parted: Parted) -> None:
    """In the commit of ``parted`` at ``key``: every part is there (EIO otherwise: a
    ``zarrfs check --repair`` running beside the mount took them for orphans), so a file is
    never stored with parts missing. A scan of their keys: asking the sizes of large values
    in a write transaction makes LMDB page them in."""
    if t.spaces[PARTS] is PARTS:  # parts kept apart (on other servers): asked, in one batch
        sizes = t.read_many([Size(parted.key(n), PARTS) for n in range(parted.count)])
        missing = sum(1 for size in sizes if size is None)
    else:
        prefix = parted.key(0).rpartition("/")[0] + "/"
        present = {k for k, _ in t.scan_prefix(prefix, space=PARTS, fetch=KEYS)}
        missing = sum(1 for n in range(parted.count) if parted.key(n) not in present)
    if missing:
        raise FsError(errno.EIO, f"{key}: {missing} of its {parted.count} parts vanished before the commit")


# ---------------------------------------------------------------------- writing (own transactions)
def store(driver: Any, size: int, readinto: Callable[[int, memoryview], int], part: int) -> Parted:
    """Write the parts of a new version of ``size`` bytes, each in its own transaction;
    ``readinto(offset, view)`` fills a view with the bytes from ``offset``. On failure the
    parts written are deleted again (best effort) and the error raised."""
    parted = Parted(new_id(), size, part)
    buffer = bytearray(min(part, size))
    done = 0
    try:
        for n in range(parted.count):
            view = memoryview(buffer)[: parted.length(n)]
            got = 0
            while got < len(view):
                step = readinto(n * part + got, view[got:])
                if step <= 0:
                    raise FsError(errno.EIO, "the file's buffer ended before its size")
                got += step
            driver.transact(lambda t, n=n, view=view: t.put(parted.key(n), view, PARTS))
            done = n + 1
    except BaseException:
        free(driver, [parted], upto=done)
        raise
    finally:
        del buffer
    return parted


def free(driver: Any, versions: Iterable[Parted], upto: int | None = None) -> None:
    """Delete the parts of ``versions`` (the first ``upto`` of each when given), each part in
    its own transaction. Best effort: a failure is logged, and the parts left are orphans for
    ``zarrfs check --repair``."""
    for parted in versions:
        count = parted.count if upto is None else upto
        try:
            for n in range(count):
                key = parted.key(n)
                driver.transact(lambda t, key=key: t.delete(key, PARTS))
        except Exception as exc:
            log.error("parts of %s not deleted (zarrfs check --repair deletes them): %s", parted.id, exc)


def put_value(driver: Any, key: str, value: Any, part: int = PART_SIZE) -> None:
    """Store ``value`` at ``key`` in parts, with an attribute record saying so (``zarrfs
    copy`` of a value larger than the destination's largest value)."""
    view = memoryview(value).cast("B")

    def fill(offset: int, into: memoryview) -> int:
        n = min(len(into), len(view) - offset)
        into[:n] = view[offset : offset + n]
        return n

    put_parts(driver, key, len(view), fill, part)


def put_parts(
    driver: Any, key: str, size: int, readinto: Callable[[int, memoryview], int], part: int
) -> None:
    """Store the ``size`` bytes that ``readinto`` gives (as for :func:`store`) at ``key`` in
    parts, part by part, then the commit of the manifest with an attribute record saying so;
    the parts of the version replaced are freed after it (``zarrfs copy``)."""
    parted = store(driver, size, readinto, part)

    def run(t: Txn) -> Parted | None:
        check_present(t, key, parted)
        raw = t.get(attr_key(key), SIDE)
        attrs = Attrs.unpack(raw) if raw is not None else None
        old = let_go(t, key, raw)
        t.put(key, parted.manifest(), DATA)
        if attrs is not None:
            t.put(attr_key(key), replace(attrs, parted=parted).pack(), SIDE)
        else:
            import os
            import stat
            import time

            now = time.time_ns()
            fresh = Attrs(stat.S_IFREG | 0o644, os.getuid(), os.getgid(), now, now, now, parted)
            t.put(attr_key(key), fresh.pack(), SIDE)
        return old

    try:
        old = driver.transact(run)
    except BaseException:
        free(driver, [parted])
        raise
    if old is not None and old != parted:
        free(driver, [old])


class Parting:
    """Storing the files of a mount: whole, or in parts (see the module docstring)."""

    def __init__(self, tree: Any, above: int = DEFAULT_ABOVE) -> None:
        self.tree = tree
        self.above = above
        self._max_value: int | None | bool = False

    @property
    def max_value(self) -> int | None:
        """The driver's largest value (None: no limit)."""
        if self._max_value is False:
            self._max_value = self.tree.driver.transact(lambda t: t.max_value, write=False)
        return self._max_value  # type: ignore[return-value]

    def wanted(self, key: str, size: int) -> bool:
        """Whether a file of ``size`` bytes at ``key`` is stored in parts."""
        limit = self.max_value
        if limit is not None and size > limit:
            whole_only = self.tree.hooks_transform or getattr(self.tree.hooks, "whole", lambda k: False)(key)
            return not whole_only  # too large either way: EFBIG, as before
        above = self.above
        if self.tree.driver.parts_above is not None:
            above = min(above, self.tree.driver.parts_above)
        if size <= above or self.tree.hooks_transform:
            return False
        return not getattr(self.tree.hooks, "whole", lambda k: False)(key)

    def commit(self, key: str, buffer: Any, attrs: Attrs | None, *args: Any, **kwargs: Any) -> None:
        """:meth:`zarrfs.fs.tree.Tree.commit` of the content of ``buffer`` (a
        :class:`zarrfs.fs.spill.SpillBuffer`): its parts first when it is large. A file stored
        in parts is stored as the buffer holds it (its parts are written before the commit's
        transaction, so nothing can be laid on the newest version: ``base`` and ``lay`` unused)."""
        if not self.wanted(key, buffer.size):
            self.tree.commit(key, buffer.view(), attrs, *args, **kwargs)
            return
        kwargs.pop("base", None)
        kwargs.pop("lay", None)
        if attrs is None:
            attrs = self.tree.lookup_attrs(key)
        part = part_size(self.above, self.max_value)
        parted = store(self.tree.driver, buffer.size, buffer.readinto, part)
        try:
            self.tree.commit(key, parted.manifest(), attrs, *args, parted=parted, **kwargs)
        except BaseException:
            free(self.tree.driver, [parted])
            raise

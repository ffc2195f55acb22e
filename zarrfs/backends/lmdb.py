"""LMDB driver: ``lmdb:///abs/path/db.lmdb[?map_size=2**40&sync=0]`` (or a bare path).

Data keys live in the environment's main, unnamed database, exactly as zarr-python 2's
``LMDBStore`` writes them. A folder (``data.mdb`` + ``lock.mdb``, zarr's default) or, when the
path is an existing regular file, a single-file environment (``subdir=False``).

Side data lives in a second environment (a named database would be a record of the main one,
listed by ``LMDBStore.keys()``): ``<dir>/zarrfs-side.mdb`` beside ``data.mdb``, or
``<file>.zarrfs-side``, made at the first side write. A write transaction locks the data
environment, then the side's, always in that order, so writers cannot deadlock.

Two environments make two commits; one transaction still has one outcome. The side commits
first, and the transaction keeps the side values it overwrote; then the data commits. If the
data commit fails (a full disk), the side records are put back as they were and the error is
raised: committed data implies committed side data, and a failed commit leaves nothing new. A
kill between the two commits can leave side data one transaction ahead of the data; side data
is advisory (a mark of a folder or an mtime with no file behind it is ignored).

Like ``LMDBStore`` (``sync=False``), commits are not forced to disk one by one: a crash of the
process can never corrupt or lose a committed transaction (the kernel holds its pages). A crash
of the machine can lose the last ones, and, as LMDB documents for ``MDB_NOSYNC``, can corrupt
the environment on a filesystem that writes pages out of order (ext4 may) when the crash
comes before the kernel has written them back. ``Driver.sync()`` (a file's ``fsync``) is the
barrier, as on any filesystem: what was committed before it survives a crash of the machine;
``?sync=1`` forces every commit to disk instead, at a cost of an fsync per file written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import lmdb

from ._util import Preallocator, Reserve, check_options, parse_bool, parse_file_url, parse_size, statvfs
from .base import DATA, KEYS, SIDE, SIZES, Driver, Fetch, HasPrefix, Size, Space, Txn, check_space, encode_key
from .lmdb_env import KnownSizes, SideEnvironment, environments, translate, translated
from .lmdb_feed import Own, changes, record

SIDE_IN_FOLDER = "zarrfs-side.mdb"
SIDE_FILE_SUFFIX = ".zarrfs-side"
RESERVE_IN_FOLDER = "zarrfs-reserve"
RESERVE_SUFFIX = ".zarrfs-reserve"
_NONE: dict[Any, Any] = {}  # what a read transaction changed: nothing (never written to)


class LMDBTxn(Txn):
    """One transaction over the data environment and, lazily, the side environment; its own
    context manager (leaving the block commits, or aborts when the block raised)."""

    # A node records a value's size in 32 bits.
    max_value = 0xFFFFFFFF
    value_limit = "LMDB's largest value"

    def __init__(self, driver: LMDBDriver, write: bool) -> None:
        # Txn.__init__ inlined, and no tables for a read: one of these is made per lookup.
        self.write, self.where, self.max_key = write, driver.path, driver.max_key_size
        self.put_bytes = 0
        self._driver = driver
        if write:
            driver.write_lock.acquire()
        try:
            self._data = driver.env.begin(write=write, buffers=True)
        except BaseException as exc:
            if write:
                driver.write_lock.release()
            if isinstance(exc, lmdb.Error):
                raise translate(exc, driver.path) from exc
            raise
        self._side: lmdb.Transaction | None = None
        # The commit whose sizes KnownSizes may answer for: this snapshot's, or for a write
        # transaction the one it follows (for keys it has not changed itself).
        self._id = self._data.id() - 1 if write else self._data.id()
        self._changes: dict[bytes, int | None] = {} if write else _NONE
        # Side values as they were before this transaction first changed them (None: absent),
        # to put back if the data commit fails after the side commit.
        self._side_before: dict[bytes, bytes | None] = {} if write else _NONE

    def __enter__(self) -> LMDBTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exc_type is None)

    def _known(self, raw: bytes, space: Space) -> int | None:
        if space is not DATA or raw in self._changes:
            return None
        return self._driver.known.get(self._id, raw)

    def _txn(self, space: Space) -> lmdb.Transaction | None:
        if space is DATA:
            return self._data
        if self._side is None:
            env = self._driver.side_env(create=self.write)
            if env is None:
                return None
            with translated(self.where):
                self._side = env.begin(write=self.write, buffers=True)
        return self._side

    def _value(self, raw: bytes, space: Space) -> Any:
        """The value of ``raw`` as a buffer into the map (valid in this transaction), or None."""
        txn = self._txn(space)
        if txn is None:
            return None
        try:
            return txn.get(raw)
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        value = self._value(raw, space)
        return None if value is None else bytes(value)

    def _size(self, raw: bytes, space: Space) -> int | None:
        # buffers=True: len() of a pointer into the map, nothing copied.
        known = self._known(raw, space)
        if known is not None:
            return known
        value = self._value(raw, space)
        return None if value is None else len(value)

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        value = self._value(raw, space)  # copy only the range out of the map
        return None if value is None else bytes(value[offset : offset + length])

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        txn = self._txn(space)
        assert txn is not None  # a write transaction creates the side environment
        with translated(self.where):
            if space is SIDE and raw not in self._side_before:
                old = txn.get(raw)
                self._side_before[raw] = None if old is None else bytes(old)
            txn.put(raw, value)
        if space is DATA:
            n = len(value)
            self._changes[raw] = n if n >= KnownSizes.LARGE else None

    def _delete(self, raw: bytes, space: Space) -> None:
        txn = self._txn(space)
        assert txn is not None
        with translated(self.where):
            if space is SIDE and raw not in self._side_before:
                old = txn.get(raw)
                if old is None:
                    return
                self._side_before[raw] = bytes(old)
            found = txn.delete(raw)
        if found and space is DATA:  # a delete of nothing changes nothing (no new commit)
            self._changes[raw] = None

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        txn = self._txn(space)
        if txn is None:
            return
        write, known = self.write, self._known
        try:
            cur = txn.cursor()
            try:
                found = cur.set_range(lo) if lo else cur.first()
                while found:
                    raw = bytes(cur.key())
                    if (hi is not None and raw >= hi) or raw[:1] == b"\xff":
                        return  # 0xFF: the change log (lmdb_feed), last in key order
                    if fetch is KEYS:
                        x = None
                    elif fetch is SIZES:
                        x = known(raw, space)
                        if x is None:
                            x = len(cur.value())
                    else:
                        x = bytes(cur.value())
                    yield raw, x
                    if write:
                        # The caller may have written while we were suspended: seek again from
                        # the last key instead of trusting the cursor's position.
                        found = cur.set_range(raw)
                        if found and bytes(cur.key()) == raw:
                            found = cur.next()
                    else:
                        found = cur.next()
            finally:
                cur.close()
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _has_prefix(self, raw: bytes, space: Space) -> bool:
        txn = self._txn(space)
        if txn is None:
            return False
        with txn.cursor() as cur:
            first = bytes(cur.key()) if cur.set_range(raw) else None
        if first is None or not first.startswith(raw):
            return False
        try:
            first.decode("utf-8")
        except UnicodeDecodeError:  # not a key (scan skips it): scan decides whether one follows
            return super()._has_prefix(raw, space)
        return True

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        # Straight on LMDB, without a method call per read: a lookup makes five of these.
        out: list[Any] = []
        append = out.append
        data = self._data
        try:
            for kind, raw, space in plan:
                txn = data if space is DATA else self._txn(space)
                if txn is None:
                    append(False if kind is HasPrefix else None)
                elif kind is Size:
                    known = self._known(raw, space)
                    if known is not None:
                        append(known)
                        continue
                    value = txn.get(raw)
                    append(None if value is None else len(value))
                elif kind is HasPrefix:
                    append(self._has_prefix(raw, space))
                else:
                    value = txn.get(raw)
                    append(None if value is None else bytes(value))
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc
        return out

    def finish(self, ok: bool) -> None:
        """Commit (side first, then data) or abort both."""
        if not self.write:
            self._data.abort()
            if self._side is not None:
                self._side.abort()
            return
        try:
            self._finish(ok)
        finally:
            self._driver.write_lock.release()

    def _finish(self, commit: bool) -> None:
        if not commit:
            side, self._side = self._side, None
            self._data.abort()
            if side is not None:
                side.abort()
            return
        try:
            logged = record(self) if self._driver.log_changes else None
        except BaseException as exc:
            side, self._side = self._side, None
            self._data.abort()
            if side is not None:
                side.abort()
            if isinstance(exc, lmdb.Error):
                raise translate(exc, self.where) from exc
            raise
        side, self._side = self._side, None  # record() may have begun it
        try:
            if side is not None:
                side.commit()
        except BaseException as exc:
            self._data.abort()
            if isinstance(exc, lmdb.Error):
                raise translate(exc, self.where) from exc
            raise
        try:
            self._data.commit()
        except BaseException as exc:
            if self._side_before:
                self._driver.side.restore(self._side_before)
            if isinstance(exc, lmdb.Error):
                raise translate(exc, self.where) from exc
            raise
        if self._changes:
            self._driver.known.committed(self._id + 1, self._changes)
        if logged is not None:
            self._driver.own.add(logged)


class LMDBDriver(Driver):
    """Driver for LMDB environments; see the module docstring."""

    schemes = ("lmdb",)

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        path, options = parse_file_url(url)
        check_options(url, options, {"map_size", "sync"})
        self.path = path
        self.map_size = parse_size("map_size", options.get("map_size", str(2**40)))
        sync = parse_bool("sync", options.get("sync", "0"))
        self._env_options = {"sync": sync, "metasync": sync, "map_async": False, "writemap": False}
        self.subdir = not os.path.isfile(path)
        self.folder = path if self.subdir else os.path.dirname(path)
        self._key, self.env = environments.acquire(
            path, self.subdir, readonly, map_size=self.map_size, meminit=False, **self._env_options
        )
        self.max_key_size = self.env.max_key_size()
        self.write_lock = environments.write_lock(self._key)
        data_file = os.path.join(path, "data.mdb") if self.subdir else path
        self._prealloc = None if readonly else Preallocator(data_file)
        side_path = os.path.join(path, SIDE_IN_FOLDER) if self.subdir else path + SIDE_FILE_SUFFIX
        self.side = SideEnvironment(side_path, readonly, self._env_options)
        self._closed = False
        self.known = KnownSizes()
        reserve = os.path.join(path, RESERVE_IN_FOLDER) if self.subdir else path + RESERVE_SUFFIX
        self.reserve = None if readonly else Reserve(reserve)

        # Every write keeps a change log for the other mounts (lmdb_feed); own: its entries.
        self.log_changes = not readonly
        self.own = Own()

    def side_env(self, create: bool) -> lmdb.Environment | None:
        """Return the side environment, opening it on first use; ``None`` when it does not
        exist and ``create`` is false (nothing was ever written there)."""
        return self.side.env(create)

    # The one-shot size skips the Txn object and the retry loop: the mount asks a file's stored
    # size before each read of it, and this path measurably halves the call's cost
    # (docs/performance.md). It runs the same checks; get and read gained nothing this way.
    def size(self, key: str, space: Space = DATA) -> int | None:
        """One-shot :meth:`Txn.size` in a bare read transaction."""
        raw, sp = encode_key(key, self.max_key_size), check_space(space)
        env = self.env if sp is DATA else self.side.env(False)
        if env is None:
            return None
        try:
            with env.begin(buffers=True) as txn:
                if sp is DATA:
                    known = self.known.get(txn.id(), raw)
                    if known is not None:
                        return known
                value = txn.get(raw)
                return None if value is None else len(value)
        except lmdb.Error as exc:
            raise translate(exc, self.path) from exc

    def _begin(self, write: bool) -> LMDBTxn:
        if write and self._prealloc is not None:
            self._prealloc.grow()
            if self.reserve is not None:
                self.reserve.again()
        return LMDBTxn(self, write)

    def free_reserve(self) -> bool:
        """Free the disk room kept for removals on a full disk (see ``_util.Reserve``)."""
        return self.reserve is not None and self.reserve.free()

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other writers committed since ``since`` (see ``lmdb_feed``)."""
        with translated(self.path):
            return changes(self, since)

    def sync(self) -> None:
        """Force committed transactions of both environments to disk."""
        with translated(self.path):
            self.env.sync(True)
            self.side.sync()

    def statfs(self) -> dict[str, int] | None:
        """The filesystem's space, capped by what the LMDB map can still hold."""
        fs = statvfs(self.folder)
        info, stat = self.env.info(), self.env.stat()
        map_size = info["map_size"]
        used = (info["last_pgno"] + 1) * stat["psize"]
        return {"total": min(fs["total"], map_size), "free": max(0, min(fs["free"], map_size - used))}

    def close(self) -> None:
        """Release both environments (closed when no other driver in the process uses them)."""
        if self._closed:
            return
        self._closed = True
        if self._prealloc is not None:
            self._give_back_reserve()
        environments.release(self._key)
        self.side.close()
        if self._prealloc is not None:
            self._prealloc.close()

    def _give_back_reserve(self) -> None:
        # Under LMDB's writer lock (a write transaction, aborted), which every process takes
        # before it grows the file: the truncation to the file's own size cannot cut a write.
        with self.write_lock, translated(self.path):
            txn = self.env.begin(write=True)
            try:
                self._prealloc.release()
            finally:
                txn.abort()

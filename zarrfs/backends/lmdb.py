"""LMDB driver: ``lmdb:///abs/path/db.lmdb[?map_size=2**40&sync=0]`` (or a bare path).

Data keys live in the environment's main, unnamed database, exactly as zarr-python 2's
``LMDBStore`` writes them. A folder (``data.mdb`` + ``lock.mdb``, zarr's default) or, when the
path is an existing regular file, a single-file environment (``subdir=False``).

Side data lives in a second environment, because a named database would itself be a record of
the main database and so show up in ``LMDBStore.keys()``: ``<dir>/zarrfs-side.mdb`` next to
``data.mdb`` for a folder, ``<file>.zarrfs-side`` for a single file. It is created on the first
side write. A write transaction takes the data environment's write lock first and the side's
second, always in that order, so writers cannot deadlock; it commits data, then side.

Like ``LMDBStore`` (``sync=False``), commits are not forced to disk one by one: a crash of the
process can never corrupt or lose a committed transaction (the kernel holds its pages). A crash
of the machine can lose the last ones, and, as LMDB documents for ``MDB_NOSYNC``, can corrupt
the environment on a filesystem that writes pages out of order (ext4 may) when the crash
comes before the kernel has written them back. ``Driver.sync()`` (a file's ``fsync``) is the
barrier, as on any filesystem: what was committed before it survives a crash of the machine;
``?sync=1`` forces every commit to disk instead, at a cost of an fsync per file written.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import lmdb

from ._util import (
    Preallocator,
    as_buffer,
    check_options,
    decode_key,
    empty_range,
    encode_bound,
    is_utf8,
    parse_bool,
    parse_file_url,
    parse_size,
    statvfs,
)
from .base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    BackendError,
    Driver,
    InvalidKeyError,
    KeyTooLongError,
    ReadOnlyError,
    RetryableError,
    StorageFullError,
    Txn,
    UnavailableError,
    encode_key,
)

SIDE_IN_FOLDER = "zarrfs-side.mdb"
SIDE_FILE_SUFFIX = ".zarrfs-side"
MAX_READERS = 512
# Side data is small (a few dozen bytes per file); the map is only address space.
SIDE_MAP_SIZE = 2**36


_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.ENOENT, errno.EACCES, errno.ENOTDIR)


def _errno_of(exc: lmdb.Error) -> int:
    """The system error an ``lmdb.Error`` reports. py-lmdb before 3.0 gives only the message,
    ``"<what>: <strerror>"`` (LMDB's ``mdb_strerror`` is ``strerror`` for system errors)."""
    text = str(exc)
    return next((code for code in _ERRNOS if text.endswith(": " + os.strerror(code))), 0)


def _translate(exc: lmdb.Error, what: str) -> BackendError:
    """The driver interface's exception for an ``lmdb`` exception."""
    if isinstance(exc, lmdb.MapFullError):
        return StorageFullError(f"{what}: the LMDB map is full (open with a larger ?map_size=)")
    if isinstance(exc, lmdb.ReadonlyError):
        return ReadOnlyError(f"{what}: {exc}")
    if isinstance(exc, lmdb.BadValsizeError):
        return InvalidKeyError(f"{what}: key or value size not accepted by LMDB: {exc}")
    if isinstance(exc, (lmdb.ReadersFullError, lmdb.TlsFullError)):
        return RetryableError(f"{what}: {exc}")
    code = getattr(exc, "code", None) or _errno_of(exc)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"{what}: {exc}")
    if code in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
        return UnavailableError(f"{what}: {exc}")
    return BackendError(f"{what}: {exc}")


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn ``lmdb`` exceptions into the driver interface's classes (hot paths use a plain
    ``try`` with :func:`_translate` instead: a context manager per key costs more than LMDB)."""
    try:
        yield
    except lmdb.Error as exc:
        raise _translate(exc, what) from exc


class KnownSizes:
    """Sizes of the large values this driver committed, right for the snapshot of its last
    commit, so that a lookup need not touch the value.

    py-lmdb touches every page of a value it returns (to take the page faults without holding
    the GIL), also for ``len()``: the size of a 4 MiB chunk costs 1,024 page touches, page
    faults the first time (the daemon writes with ``pwrite``, so nothing is mapped yet), and a
    read of the whole chunk from disk when it is not cached. LMDB numbers every commit, so the
    sizes are exact in any transaction whose snapshot is that commit: nobody, in this process
    or another, has written since. Otherwise the value is read as before.

    Readers may run in other threads than the writer: :meth:`get` checks the commit number
    again after reading (a writer sets it to -1 while it changes the table)."""

    LARGE = 1 << 14  # smaller values sit in a page the lookup reads anyway
    LIMIT = 1 << 16  # entries kept; past that the table starts again

    def __init__(self) -> None:
        self.txnid = -1
        self.sizes: dict[bytes, int] = {}

    def get(self, txnid: int, raw: bytes) -> int | None:
        """The size of ``raw`` in the snapshot of commit ``txnid``, or None when not known."""
        if txnid != self.txnid:
            return None
        size = self.sizes.get(raw)
        return size if txnid == self.txnid else None

    def committed(self, txnid: int, changes: dict[bytes, int | None]) -> None:
        """Commit ``txnid`` changed these keys (size, or None: removed or small)."""
        previous, self.txnid = self.txnid, -1
        if previous != txnid - 1 or len(self.sizes) + len(changes) > self.LIMIT:
            self.sizes.clear()  # someone else committed in between: start from this commit
        for raw, size in changes.items():
            if size is None:
                self.sizes.pop(raw, None)
            else:
                self.sizes[raw] = size
        self.txnid = txnid


class _Envs:
    """Process-wide, reference-counted environments: LMDB forbids opening one environment twice
    in a process (its fcntl locks belong to the process), but two drivers on one database in a
    process (a mount and a ``check``, or tests) are legitimate."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[str, list[Any]] = {}  # key -> [env, refcount, readonly, write lock]

    def acquire(
        self, path: str, subdir: bool, readonly: bool, **options: Any
    ) -> tuple[str, lmdb.Environment]:
        """Return ``(key, env)`` for the environment at ``path``, opening it if this process has
        not yet; pass ``key`` to :meth:`release`."""
        key = os.path.realpath(os.path.join(path, "data.mdb") if subdir else path)
        with self.lock:
            entry = self.open.get(key)
            if entry is not None:
                if entry[2] and not readonly:
                    raise BackendError(f"{path} is already open read-only in this process")
                entry[1] += 1
                return key, entry[0]
            with _translated(path):
                env = lmdb.open(
                    path,
                    subdir=subdir,
                    readonly=readonly,
                    create=not readonly,
                    lock=True,
                    max_readers=MAX_READERS,
                    max_dbs=0,
                    **options,
                )
            self.open[key] = [env, 1, readonly, threading.RLock()]
            return key, env

    def write_lock(self, key: str) -> threading.RLock:
        """The lock a write transaction of this process holds on environment ``key``. LMDB lets
        one write transaction run at a time and makes the others wait; py-lmdb 1.8 and later
        refuse a second one of the same environment instead (EBUSY), so threads queue here.
        Reentrant: a write transaction begun inside another on the same thread gets py-lmdb's
        error rather than waiting for itself."""
        with self.lock:
            return self.open[key][3]

    def release(self, key: str) -> None:
        """Drop one reference; the last one closes the environment."""
        with self.lock:
            entry = self.open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self.open[key]
                entry[0].close()


_envs = _Envs()


class LMDBTxn(Txn):
    """One transaction over the data environment and, lazily, the side environment."""

    def __init__(self, driver: LMDBDriver, write: bool) -> None:
        self._driver = driver
        self._write = write
        if write:
            driver.write_lock.acquire()
        try:
            self._data = driver.env.begin(write=write, buffers=True)
        except BaseException as exc:
            if write:
                driver.write_lock.release()
            if isinstance(exc, lmdb.Error):
                raise _translate(exc, driver.path) from exc
            raise
        self._side: lmdb.Transaction | None = None
        self._max_key = driver.max_key_size
        # The commit whose sizes KnownSizes may answer for: this snapshot's, or for a write
        # transaction the one it follows (for keys it has not changed itself).
        self._id = self._data.id() - 1 if write else self._data.id()
        self._changes: dict[bytes, int | None] = {}

    def _known(self, raw: bytes, space: str) -> int | None:
        if space != DATA or raw in self._changes:
            return None
        return self._driver.known.get(self._id, raw)

    def _txn(self, space: str) -> lmdb.Transaction | None:
        if space == DATA:
            return self._data
        if space != SIDE:
            raise ValueError(f"unknown key space {space!r}")
        if self._side is None:
            env = self._driver.side_env(create=self._write)
            if env is None:
                return None
            try:  # not _translated: a context manager costs more than the begin (hot path)
                self._side = env.begin(write=self._write, buffers=True)
            except lmdb.Error as exc:
                raise _translate(exc, self._driver.path) from exc
        return self._side

    def _key(self, key: str) -> bytes:
        raw = encode_key(key)
        if len(raw) > self._max_key:
            raise KeyTooLongError(f"key of {len(raw)} bytes is longer than LMDB's {self._max_key}")
        return raw

    def _value(self, key: str, space: str) -> Any:
        """The value of ``key`` as a buffer into the map (valid in this transaction), or None."""
        raw = self._key(key)
        txn = self._txn(space)
        if txn is None:
            return None
        try:
            return txn.get(raw)
        except lmdb.Error as exc:
            raise _translate(exc, self._driver.path) from exc

    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key`` or ``None``."""
        value = self._value(key, space)
        return None if value is None else bytes(value)

    def size(self, key: str, space: str = DATA) -> int | None:
        """Return the value's length; ``buffers=True`` makes this a pointer into the map."""
        known = self._known(self._key(key), space)
        if known is not None:
            return known
        value = self._value(key, space)
        return None if value is None else len(value)

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """Return a byte range, copying only that range out of the map."""
        value = self._value(key, space)
        return None if value is None else bytes(value[offset : offset + length])

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """Set ``key``."""
        raw = self._key(key)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        txn = self._txn(space)
        assert txn is not None  # a write transaction creates the side environment
        value = as_buffer(value)
        with _translated(self._driver.path):
            txn.put(raw, value)
        if space == DATA:
            n = len(value)
            self._changes[raw] = n if n >= KnownSizes.LARGE else None

    def delete(self, key: str, space: str = DATA) -> None:
        """Remove ``key`` if present."""
        raw = self._key(key)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        txn = self._txn(space)
        assert txn is not None
        with _translated(self._driver.path):
            found = txn.delete(raw)
        if found and space == DATA:  # a delete of nothing changes nothing (no new commit)
            self._changes[raw] = None

    def scan(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: str = DATA,
        fetch: str = KEYS,
        limit: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``[start, stop)`` in key order with an LMDB cursor."""
        lo, hi = encode_bound(start), encode_bound(stop)
        txn = self._txn(space)
        if txn is None or empty_range(lo, hi, limit):
            return
        where = self._driver.path
        write = self._write
        known = self._known
        try:
            cur = txn.cursor()
            try:
                found = cur.set_range(lo) if lo else cur.first()
                count = 0
                while found:
                    raw = bytes(cur.key())
                    if hi is not None and raw >= hi:
                        return
                    if fetch == KEYS:
                        x = None
                    elif fetch == SIZES:
                        x = known(raw, space)
                        if x is None:
                            x = len(cur.value())
                    else:
                        x = bytes(cur.value())
                    key = decode_key(raw, where)
                    if key is not None:
                        yield key, x
                        count += 1
                        if limit is not None and count >= limit:
                            return
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
            raise _translate(exc, where) from exc

    def read_many(self, requests: Sequence[tuple[str, str, str]]) -> list[Any]:
        """As :meth:`Txn.read_many`, straight on LMDB (a lookup makes five of these reads)."""
        out: list[Any] = []
        append = out.append
        data, max_key = self._data, self._max_key
        try:
            for op, key, space in requests:
                txn = data if space == DATA else self._txn(space)
                try:
                    raw = key.encode("utf-8")
                except UnicodeEncodeError:
                    raw = b""
                if not raw or len(raw) > max_key:
                    raw = self._key(key)  # raises the error that key deserves
                if txn is None:
                    append(False if op == "prefix" else None)
                elif op == "size":
                    known = self._known(raw, space)
                    if known is not None:
                        append(known)
                        continue
                    value = txn.get(raw)
                    append(None if value is None else len(value))
                elif op == "get":
                    value = txn.get(raw)
                    append(None if value is None else bytes(value))
                elif op == "prefix":
                    with txn.cursor() as cur:
                        first = bytes(cur.key()) if cur.set_range(raw) else None
                    below = first is not None and first.startswith(raw)
                    if below and not is_utf8(first):
                        # Not a key (scan skips it); scan decides whether a real one follows.
                        below = next(iter(self.scan_prefix(key, space=space, limit=1)), None) is not None
                    append(below)
                else:
                    raise ValueError(f"unknown read {op!r}")
        except lmdb.Error as exc:
            raise _translate(exc, self._driver.path) from exc
        return out

    def finish(self, ok: bool) -> None:
        """Commit (data first, then side) or abort both."""
        try:
            self._finish(ok)
        finally:
            if self._write:
                self._driver.write_lock.release()

    def _finish(self, ok: bool) -> None:
        side, self._side = self._side, None
        if not ok:
            self._data.abort()
            if side is not None:
                side.abort()
            return
        try:
            with _translated(self._driver.path):
                self._data.commit()
        except BaseException:
            if side is not None:
                side.abort()
            raise
        if self._changes:
            self._driver.known.committed(self._id + 1, self._changes)
        if side is not None:
            with _translated(self._driver.path):
                side.commit()


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
        if self.subdir:
            self.side_path = os.path.join(path, SIDE_IN_FOLDER)
            self.folder = path
        else:
            self.side_path = path + SIDE_FILE_SUFFIX
            self.folder = os.path.dirname(path)
        self._key, self.env = _envs.acquire(
            path, self.subdir, readonly, map_size=self.map_size, meminit=False, **self._env_options
        )
        self.max_key_size = self.env.max_key_size()
        self.write_lock = _envs.write_lock(self._key)
        data_file = os.path.join(path, "data.mdb") if self.subdir else path
        self._prealloc = None if readonly else Preallocator(data_file)
        self._side_key: str | None = None
        self._side_env: lmdb.Environment | None = None
        self._side_lock = threading.Lock()
        self._closed = False
        self.known = KnownSizes()

    def side_env(self, create: bool) -> lmdb.Environment | None:
        """Return the side environment, opening it on first use; ``None`` when it does not
        exist and ``create`` is false (nothing was ever written there)."""
        if self._side_env is not None:
            return self._side_env
        with self._side_lock:
            if self._side_env is None:
                if not os.path.exists(self.side_path) and (not create or self.readonly):
                    return None
                self._side_key, self._side_env = _envs.acquire(
                    self.side_path,
                    False,
                    self.readonly,
                    map_size=SIDE_MAP_SIZE,
                    meminit=False,
                    **self._env_options,
                )
            return self._side_env

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        txn = LMDBTxn(self, write)
        try:
            yield txn
        except BaseException:
            txn.finish(False)
            raise
        txn.finish(True)

    def transact(self, fn, write: bool = True):
        """As :meth:`Driver.transact`; a read needs no retry loop and no commit (every lookup
        runs one, so the shortcut counts)."""
        if write:
            if self._prealloc is not None:
                self._prealloc.grow()
            return super().transact(fn, write)
        txn = LMDBTxn(self, False)
        try:
            return fn(txn)
        finally:
            txn.finish(False)

    def _env_for(self, space: str) -> lmdb.Environment | None:
        if space == DATA:
            return self.env
        if space == SIDE:
            return self.side_env(create=False)
        raise ValueError(f"unknown key space {space!r}")

    def _one_shot(self, key: str, space: str) -> tuple[bytes, lmdb.Environment | None]:
        raw = encode_key(key)
        if len(raw) > self.max_key_size:
            raise KeyTooLongError(f"key of {len(raw)} bytes is longer than LMDB's {self.max_key_size}")
        return raw, self._env_for(space)

    # One-shot reads skip the Txn object: getattr calls size() on every lookup.
    def get(self, key: str, space: str = DATA) -> bytes | None:
        """One-shot get in a bare read transaction."""
        raw, env = self._one_shot(key, space)
        if env is None:
            return None
        with _translated(self.path), env.begin() as txn:
            return txn.get(raw)

    def size(self, key: str, space: str = DATA) -> int | None:
        """One-shot size: the length of a buffer pointing into the map, nothing copied."""
        raw, env = self._one_shot(key, space)
        if env is None:
            return None
        try:
            with env.begin(buffers=True) as txn:
                if space == DATA:
                    known = self.known.get(txn.id(), raw)
                    if known is not None:
                        return known
                value = txn.get(raw)
                return None if value is None else len(value)
        except lmdb.Error as exc:
            raise _translate(exc, self.path) from exc

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """One-shot byte range, copying only the range."""
        raw, env = self._one_shot(key, space)
        if env is None:
            return None
        with _translated(self.path), env.begin(buffers=True) as txn:
            value = txn.get(raw)
            return None if value is None else bytes(value[offset : offset + length])

    def sync(self) -> None:
        """Force committed transactions of both environments to disk."""
        with _translated(self.path):
            self.env.sync(True)
            if self._side_env is not None:
                self._side_env.sync(True)

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
        _envs.release(self._key)
        if self._side_key is not None:
            _envs.release(self._side_key)
        if self._prealloc is not None:
            self._prealloc.close()

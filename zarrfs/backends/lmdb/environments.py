"""LMDB plumbing shared by the LMDB driver: error translation, process-wide environments, the
side environment, the sizes of committed values and the disk room kept around the data file."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lmdb

from ..base import (
    DATA,
    SIDE,
    BackendError,
    InvalidKeyError,
    ReadOnlyError,
    RetryableError,
    Space,
    StorageFullError,
    UnavailableError,
)
from ..filespace import Preallocator, Reserve
from ..writer_wait import LMDBWriterLock
from .about import RESERVE_IN_FOLDER, RESERVE_SUFFIX
from .leaf import value_size
from .maps import SIDE_MAP_SIZE, MapTooSmall, gate

MAX_READERS = 512

log = logging.getLogger("zarrfs.backends.lmdb")

_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOENT, errno.EACCES, errno.ENOTDIR)
FULL_BELOW = 1 << 20  # free bytes under which a filesystem counts as full


def _errno_of(exc: lmdb.Error) -> int:
    """The system error an ``lmdb.Error`` reports. py-lmdb before 3.0 gives only the message,
    ``"<what>: <strerror>"`` (LMDB's ``mdb_strerror`` is ``strerror`` for system errors)."""
    text = str(exc)
    return next((code for code in _ERRNOS if text.endswith(": " + os.strerror(code))), 0)


def _disk_full(path: str) -> bool:
    """Whether the filesystem holding ``path`` is (about) full. LMDB reports a short write as
    EIO, and a write that only partly fits on a full disk is a short write."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW


def translate(exc: lmdb.Error, what: str, space: Space = DATA) -> BackendError:
    """The driver interface's exception for an ``lmdb`` exception: a full map or disk
    (``MDB_MAP_FULL``, ``ENOSPC``, ``EDQUOT``, a short write to a full disk) is
    :class:`StorageFullError`; a full map, or one another process grew, of ``space``'s
    environment is a :class:`MapTooSmall`, which the driver may grow (``maps``)."""
    said = str(exc).removeprefix(f"{what}: ")  # py-lmdb names the path too: once is enough
    if isinstance(exc, lmdb.MapFullError):
        which, option = ("map", "map_size") if space is DATA else ("side map", "map_max")
        return MapTooSmall(f"{what}: the LMDB {which} is full (open with a larger ?{option}=)", space)
    if isinstance(exc, lmdb.MapResizedError):
        return MapTooSmall(f"{what}: another process grew the LMDB map", space, adopt=True)
    if isinstance(exc, lmdb.ReadonlyError):
        return ReadOnlyError(f"{what}: {said}")
    if isinstance(exc, lmdb.BadValsizeError):
        return InvalidKeyError(f"{what}: key or value size not accepted by LMDB: {said}")
    if isinstance(exc, (lmdb.ReadersFullError, lmdb.TlsFullError)):
        return RetryableError(f"{what}: {said}")
    code = getattr(exc, "code", None) or _errno_of(exc)
    if code in (errno.ENOSPC, errno.EDQUOT) or (code == errno.EIO and _disk_full(what)):
        return StorageFullError(f"{what}: {said}")
    if code in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
        return UnavailableError(f"{what}: {said}")
    return BackendError(f"{what}: {said}")


@contextmanager
def translated(what: str, space: Space = DATA) -> Iterator[None]:
    """Turn ``lmdb`` exceptions (of ``space``'s environment) into the driver interface's
    classes (hot paths use a plain ``try`` with :func:`translate` instead: a context manager
    per key costs more than LMDB)."""
    try:
        yield
    except lmdb.Error as exc:
        raise translate(exc, what, space) from exc


def _open(path: str, subdir: bool, readonly: bool, lock: bool, options: dict[str, Any]) -> lmdb.Environment:
    return lmdb.open(
        path,
        subdir=subdir,
        readonly=readonly,
        create=not readonly,
        lock=lock,
        max_readers=MAX_READERS,
        max_dbs=0,
        **options,
    )


def _lock_not_writable(path: str, subdir: bool) -> bool:
    """Whether this user may not open the lock file of the environment at ``path`` for
    writing (nor create it), as LMDB's readers must: a database another user owns, which
    this one may read."""
    lock_file = os.path.join(path, "lock.mdb") if subdir else path + "-lock"
    if os.path.exists(lock_file):
        return not os.access(lock_file, os.W_OK, effective_ids=True)
    return not os.access(os.path.dirname(lock_file) or ".", os.W_OK, effective_ids=True)


class Environments:
    """Process-wide, reference-counted environments: LMDB forbids opening one environment twice
    in a process (its fcntl locks belong to the process), but two drivers on one database in a
    process (a mount and a ``check``, or tests) are legitimate."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[str, list[Any]] = {}  # key -> [env, refcount, readonly, write lock]
        self.warned: set[str] = set()  # folders of databases read without the reader table

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
            with translated(path):
                try:
                    env = _open(path, subdir, readonly, True, options)
                except lmdb.Error:
                    if not (readonly and _lock_not_writable(path, subdir)):
                        raise
                    env = _open(path, subdir, readonly, False, options)
                    folder = path if subdir else os.path.dirname(path)
                    if folder in self.warned:  # the side environment beside it: said once
                        log.debug("%s: read without LMDB's reader table", path)
                    else:
                        self.warned.add(folder)
                        log.warning(
                            "%s: this user may not write its lock file: read without LMDB's reader "
                            "table; a writer at the same time may reuse the pages of a long read",
                            path,
                        )
            self.open[key] = [env, 1, readonly, WriteLock(key)]
            return key, env

    def write_lock(self, key: str) -> WriteLock:
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
                entry[3].writer.close()


class WriteLock:
    """What a write transaction of this process takes on an environment: a reentrant lock
    shared by the process's threads (see :meth:`Environments.write_lock`), and :attr:`writer`,
    LMDB's writer mutex as other programs hold it (``writer_wait``)."""

    def __init__(self, key: str) -> None:
        self._lock = threading.RLock()
        folder, name = os.path.split(key)
        lock_file = os.path.join(folder, "lock.mdb") if name == "data.mdb" else key + "-lock"
        self.writer = LMDBWriterLock(lock_file)

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def held_elsewhere(self) -> bool:
        """Whether a write transaction of another thread of this process, or of another
        live process, holds the environment (not this thread's own)."""
        if self.writer.holder() is not None:
            return True
        if not self._lock.acquire(blocking=False):
            return True
        self._lock.release()
        return False

    def __enter__(self) -> WriteLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


#: The environments of this process.
environments = Environments()


class SideEnvironment:
    """The environment of a driver's side data, opened on first use (created by the first side
    write), and put back after a data commit that failed behind its side commit. ``options``
    are ``lmdb.open``'s (``map_size`` defaults to :data:`SIDE_MAP_SIZE`). Side data is small (a
    few dozen bytes per file), but the parts of large files and the values of long keys
    (``longkeys``) live here too: the map grows on demand (``maps``)."""

    def __init__(self, path: str, readonly: bool, options: dict[str, Any]) -> None:
        self.path = path
        self.readonly = readonly
        self.options = options
        self._key: str | None = None
        self._env: lmdb.Environment | None = None
        self._lock = threading.Lock()

    def env(self, create: bool) -> lmdb.Environment | None:
        """The environment; ``None`` when it does not exist and ``create`` is false (nothing
        was ever written there) or the driver is read-only."""
        if self._env is not None:
            return self._env
        with self._lock:
            if self._env is None:
                if not os.path.exists(self.path) and (not create or self.readonly):
                    return None
                options = {"map_size": SIDE_MAP_SIZE, "meminit": False, **self.options}
                self._key, self._env = environments.acquire(self.path, False, self.readonly, **options)
            return self._env

    def restore(self, before: dict[bytes, bytes | None]) -> None:
        """Put records back as ``before`` has them (None: absent). Best effort: logs one line
        rather than raises when that fails too, so the caller raises the data commit's error."""
        if self._env is None:
            return
        try:
            with self._env.begin(write=True) as txn:
                for raw, value in before.items():
                    if value is None:
                        txn.delete(raw)
                    else:
                        txn.put(raw, value)
        except lmdb.Error as exc:
            log.error("%s: side data of a failed commit left (%d records): %s", self.path, len(before), exc)

    def sync(self) -> None:
        """Force its committed transactions to disk (when open)."""
        if self._env is not None:
            self._env.sync(True)

    def close(self) -> None:
        """Release the environment."""
        if self._key is not None:
            environments.release(self._key)
            self._key, self._env = None, None


class KnownSizes:
    """Sizes of the large values this driver committed, right for the snapshot of its last
    commit, so that a lookup need not touch the value.

    py-lmdb touches every page of a value it returns (to take the page faults without holding
    the GIL), also for ``len()``: the size of a chunk of MiB costs a touch per page, page
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


def bare_size(env: lmdb.Environment, raw: bytes, known: KnownSizes | None, what: str) -> int | None:
    """The size of the value of ``raw`` (a key that fits) in a read transaction of its own,
    from ``known`` when it knows it (data keys). A map another process grew is adopted."""
    for attempt in (1, 2):
        try:
            with gate.held(), env.begin(buffers=True) as txn:
                if known is not None:
                    size = known.get(txn.id(), raw)
                    if size is not None:
                        return size
                with txn.cursor() as cur:
                    return value_size(cur, raw)
        except lmdb.MapResizedError as exc:
            if attempt == 2 or not gate.resize(env, 0):
                raise translate(exc, what, DATA if known is not None else SIDE) from exc
        except lmdb.Error as exc:
            raise translate(exc, what) from exc
    return None  # not reached


class DiskRoom:
    """The disk room a writable driver keeps around its data file: blocks reserved ahead of
    the file's end (``filespace.Preallocator``) and a reserve freed for removals on a full disk
    (``filespace.Reserve``), beside the file (``zarrfs-reserve`` in a folder environment,
    ``<file>.zarrfs-reserve`` beside a single file)."""

    def __init__(self, path: str, subdir: bool) -> None:
        self.prealloc = Preallocator(os.path.join(path, "data.mdb") if subdir else path)
        self.reserve = Reserve(os.path.join(path, RESERVE_IN_FOLDER) if subdir else path + RESERVE_SUFFIX)

    def before_write(self) -> None:
        """Call before a write transaction begins: grow the blocks ahead, make the reserve again."""
        self.prealloc.grow()
        self.reserve.again()

    def free(self) -> bool:
        """Free the reserve; whether there was any."""
        return self.reserve.free()

    def give_back(self, env: lmdb.Environment, write_lock: Any, what: str) -> None:
        """Give back the blocks reserved ahead. Under LMDB's writer lock (a write transaction,
        aborted), which every process takes before it grows the file: the truncation to the
        file's own size cannot cut a write. Not while another program writes (the blocks stay
        reserved: only disk room), so that a close never waits on it."""
        if write_lock.writer.holder() is not None:
            return
        with write_lock, gate.held(), translated(what):
            txn = env.begin(write=True)
            try:
                self.prealloc.release()
            finally:
                txn.abort()

    def close(self) -> None:
        """Close the data file (after the environment was closed)."""
        self.prealloc.close()

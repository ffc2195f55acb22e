"""zarr-python 3 stores over zarrfs' drivers: the same databases in-process, without a mount.

``DatabaseStore("lmdb:///data/x.lmdb")`` is a :class:`zarr.abc.store.Store` over any URL the mount
takes, with the layout of zarr-python 2's ``LMDBStore``/``SQLiteStore``/``RedisStore`` (a key is
stored as it is), so what it writes mounts as it is and what a mount or zarr-python 2 wrote reads
here. Each ``set`` is one transaction that also records the file's attributes (mtime the time of
the set), as a write through a mount does, so a mount sees a changed file. A ``set`` or delete
that replaces a value stored in parts (:mod:`zarrfs.fs.parts`) deletes its parts after the commit,
one per transaction, as a mount does. ``set_if_not_exists`` checks and writes in one transaction;
``delete_dir`` removes a prefix, with the side records of what it removes, in one. Listings stream
from the driver's ordered scans, a read transaction per batch, so a prefix of millions of keys is
never held whole. Driver calls are synchronous and short (an LMDB read is microseconds, a Redis
round trip one socket exchange), so the async methods run them in the event loop's thread rather
than pay a thread hand-off per call; a lock serialises the synchronous ``*_sync`` methods with them.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from zarrfs.backends import open_driver
from zarrfs.backends.base import (
    KEYS,
    SIZES,
    Driver,
    MissingDatabaseError,
    Txn,
    UnavailableError,
    prefix_stop,
)
from zarrfs.backends.registry import normalize_url
from zarrfs.backends.urls import database_path
from zarrfs.fs import parts, records

__all__ = ["DatabaseStore"]

BATCH = 1000  # keys per read transaction while listing
_AFTER_SLASH = chr(ord("/") + 1)  # the first position past every key below "name/"
_UMASK = 0o022


def _new_file(now: int) -> Any:
    """The attributes of a file a ``set`` makes at ``now``: the process's, mode 0644."""
    return records.new_file_attrs(_UMASK, os.getuid(), os.getgid())(now)


class DatabaseStore(Store):
    """A zarr-python 3 store over the zarrfs driver for ``url``.

    ``read_only`` opens the database read-only (writes raise ``ValueError`` as zarr expects).
    ``validate`` is the mount's option of the same name: ``"strict"`` refuses (raises) metadata
    and chunk keys that break the Zarr specs, ``"warn"`` logs them, ``"off"`` (the default)
    stores bytes as given. ``consolidate`` too: ``"auto"`` keeps the consolidated metadata
    documents that exist true in the transaction of each change of a node's metadata, ``"live"``
    also makes the root's, ``"off"`` (the default) leaves them to the client. A missing file
    database is created unless the store is read-only.
    """

    supports_writes = True
    supports_deletes = True
    supports_listing = True
    supports_partial_writes = False

    def __init__(
        self, url: str, *, read_only: bool = False, validate: str = "off", consolidate: str = "off"
    ) -> None:
        super().__init__(read_only=read_only)
        if validate not in ("strict", "warn", "off"):
            raise ValueError(f"validate must be strict, warn or off, got {validate!r}")
        if consolidate not in ("auto", "live", "off"):
            raise ValueError(f"consolidate must be auto, live or off, got {consolidate!r}")
        self.url = url
        self.validate = validate
        self.consolidate = consolidate
        self._driver: Driver | None = None
        self._hooks: Any = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ identity
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DatabaseStore)
            and self.url == other.url
            and self.read_only == other.read_only
            and self.validate == other.validate
            and self.consolidate == other.consolidate
        )

    def __hash__(self) -> int:
        return hash((type(self), self.url, self.read_only))

    def __repr__(self) -> str:
        return f"DatabaseStore({self.url!r}, read_only={self.read_only})"

    def __str__(self) -> str:
        return self.url

    def __getstate__(self) -> dict[str, Any]:
        # An open database handle does not cross processes: the copy opens its own.
        return {
            "url": self.url,
            "read_only": self.read_only,
            "validate": self.validate,
            "consolidate": self.consolidate,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(
            state["url"],
            read_only=state["read_only"],
            validate=state["validate"],
            consolidate=state.get("consolidate", "off"),
        )

    def with_read_only(self, read_only: bool = False) -> DatabaseStore:
        """A new, unopened store on the same database with another ``read_only`` setting."""
        return type(self)(self.url, read_only=read_only, validate=self.validate, consolidate=self.consolidate)

    # ------------------------------------------------------------------ opening
    async def _open(self) -> None:
        if self._is_open:
            raise ValueError("store is already open")
        self._open_sync()

    def _open_sync(self) -> None:
        with self._lock:
            if self._driver is None:
                self._driver = self._open_driver()
                if self.validate != "off" or self.consolidate != "off":
                    from zarrfs.format.hooks import FormatHooks

                    self._hooks = FormatHooks(
                        validate=self.validate, view="raw", consolidate=self.consolidate
                    )
            self._is_open = True

    def _open_driver(self) -> Driver:
        try:
            return open_driver(self.url, readonly=self.read_only)
        except UnavailableError as exc:
            # A read-only store of a database that does not exist is an empty store, as a
            # read-only LocalStore of a missing folder is; nothing is created.
            path = database_path(normalize_url(self.url)[1])
            missing = isinstance(exc, MissingDatabaseError) or (path is not None and not os.path.exists(path))
            if self.read_only and missing:
                return open_driver("memory://", readonly=True)
            raise

    def _db(self) -> Driver:
        if self._driver is None:
            self._open_sync()
        assert self._driver is not None
        return self._driver

    def close(self) -> None:
        """Close the database; the store can be opened again."""
        with self._lock:
            if self._driver is not None:
                self._driver.close()
                self._driver = None
        super().close()

    def _read(self, fn):
        with self._lock:
            return self._db().transact(fn, write=False)

    def _write(self, fn):
        self._check_writable()
        with self._lock:
            return self._db().transact(fn)

    def _write_freeing(self, fn):
        """:meth:`_write` of ``fn(t, freed)``, which appends to ``freed`` the parts its changes
        let go of (``parts.let_go``); they are deleted after the commit."""
        freed: list[Any] = []

        def run(t: Txn) -> Any:
            freed.clear()  # a transaction run again finds them again
            return fn(t, freed)

        result = self._write(run)
        parts.free(self._db(), [p for p in freed if p is not None])
        return result

    # ------------------------------------------------------------------ reads
    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        """The value of ``key`` (or the bytes of ``byte_range`` of it), ``None`` if absent."""
        prototype = prototype or default_buffer_prototype()
        raw = self._read(lambda t: _read_range(t, key, byte_range))
        return None if raw is None else prototype.buffer.from_bytes(raw)

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """The value of ``key`` (or the bytes of ``byte_range`` of it), ``None`` if absent."""
        return self.get_sync(key, prototype=prototype, byte_range=byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """Several ranges, read in one transaction (one consistent version of the database)."""
        wanted = list(key_ranges)
        raws = self._read(lambda t: [_read_range(t, k, r) for k, r in wanted])
        return [None if raw is None else prototype.buffer.from_bytes(raw) for raw in raws]

    async def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value (the empty key never does)."""
        return key != "" and self._read(lambda t: t.size(key)) is not None

    async def getsize(self, key: str) -> int:
        """The size of the value of ``key``; ``FileNotFoundError`` when there is none."""
        size = None if key == "" else self._read(lambda t: parts.size_of(t, key))
        if size is None:
            raise FileNotFoundError(key)
        return size

    async def getsize_prefix(self, prefix: str) -> int:
        """The total size of the values of every key under ``prefix``, from the driver's sizes."""
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return sum(size for _, size in self._batches(prefix, prefix_stop(prefix) if prefix else None, SIZES))

    # ------------------------------------------------------------------ writes
    def set_sync(self, key: str, value: Buffer) -> None:
        """Store ``value`` at ``key`` (one transaction, with the file's attribute record)."""
        data = _as_bytes(value, "set")
        self._write_freeing(lambda t, freed: self._put(t, key, data, freed))

    async def set(self, key: str, value: Buffer) -> None:
        """Store ``value`` at ``key`` (one transaction, with the file's attribute record)."""
        self.set_sync(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        """Store ``value`` unless ``key`` exists, checked and written in one transaction."""
        data = _as_bytes(value, "set_if_not_exists")

        def run(t: Txn) -> None:
            if t.size(key) is None:
                self._put(t, key, data, [])

        self._write(run)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        items = [(k, _as_bytes(v, "set")) for k, v in values]
        self._write_freeing(lambda t, freed: [self._put(t, k, v, freed) for k, v in items])

    def _put(self, t: Txn, key: str, value: bytes, freed: list[Any]) -> None:
        if self._hooks is not None and t.size(key) is None:
            self._hooks.check_name(t, key, stat.S_IFREG)
        freed.append(records.set_value(t, key, value, self._store_hook, _new_file))
        if self._hooks is not None:
            self._hooks.changed(t, key, value)

    def _store_hook(self, t: Txn, key: str, value: bytes) -> bytes:
        return value if self._hooks is None else self._hooks.store(t, key, value)

    def delete_sync(self, key: str) -> None:
        """Remove ``key`` (and its attribute record); a missing key is no error (nor is the
        empty key, which no database here holds: zarr's own stores take it so)."""
        if key == "":
            return

        def run(t: Txn, freed: list[Any]) -> None:
            freed.append(records.delete_file(t, key))
            if self._hooks is not None:
                self._hooks.changed(t, key, None)

        self._write_freeing(run)

    async def delete(self, key: str) -> None:
        """Remove ``key`` (and its attribute record); a missing key is no error."""
        self.delete_sync(key)

    async def delete_dir(self, prefix: str) -> None:
        """Remove every key under ``prefix`` and their side records, in one transaction (then
        the parts of the values a mount stored in parts there)."""
        self.delete_dir_sync(prefix)

    def delete_dir_sync(self, prefix: str) -> None:
        """:meth:`delete_dir`, for callers without an event loop."""
        prefix = prefix.rstrip("/")

        def run(t: Txn, freed: list[Any]) -> None:
            gone = []
            if self._hooks is not None and self.consolidate != "off":
                from zarrfs.format.keys import is_metadata_key

                below = prefix + "/" if prefix else ""
                scan = t.scan(below, prefix_stop(below) if below else None)
                gone = [k for k, _ in scan if is_metadata_key(k)]
            freed.extend(records.delete_below(t, prefix))
            for key in gone:
                self._hooks.changed(t, key, None)

        self._write_freeing(run)

    async def clear(self) -> None:
        """Remove every key of the database (and every side record of its files and folders)."""
        await self.delete_dir("")

    # ------------------------------------------------------------------ listings
    def _batches(self, start: str, stop: str | None, fetch=KEYS) -> Iterator[tuple[str, Any]]:
        """``(key, x)`` for every key in ``[start, stop)``, a read transaction per batch."""
        pos = start
        while True:
            batch = self._read(lambda t, pos=pos: list(t.scan(pos, stop, fetch=fetch, limit=BATCH)))
            yield from batch
            if len(batch) < BATCH:
                return
            pos = batch[-1][0] + "\0"

    async def list(self) -> AsyncIterator[str]:
        """Every key, in key order."""
        for key, _ in self._batches("", None):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Every key that starts with ``prefix``, in key order."""
        for key, _ in self._batches(prefix, prefix_stop(prefix)):
            yield key

    def keys_sync(self, prefix: str = "", fetch: Any = KEYS) -> Iterator[tuple[str, Any]]:
        """``(key, None or size)`` for every key that starts with ``prefix``, in key order
        (``fetch=SIZES``: with its stored size)."""
        return self._batches(prefix, prefix_stop(prefix) if prefix else None, fetch)

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """The names directly under ``prefix``: keys and the first part of deeper keys, each
        once. A subtree is skipped by seeking past it, not read."""
        for name, _ in self.entries_sync(prefix, KEYS):
            yield name

    def entries_sync(self, prefix: str, fetch: Any = SIZES) -> Iterator[tuple[str, Any]]:
        """:meth:`list_dir`'s names, each with ``None`` for a folder or, for a key, what
        ``fetch`` reads of it (its stored size for ``SIZES``)."""
        prefix = prefix.rstrip("/")
        below = prefix + "/" if prefix else ""
        stop = prefix_stop(below) if below else None
        n = len(below)
        pos = below
        # A key "x" and keys below "x/" give one name "x", but other keys ("x-1", "x.0") sort
        # between them: remember such names until the scan has passed "x/".
        files_open: set[str] = set()
        while True:
            batch = self._read(lambda t, pos=pos: list(t.scan(pos, stop, fetch=fetch, limit=BATCH)))
            for key, x in batch:
                if key < pos:
                    continue  # before the seek of an earlier key of this batch
                name, slash, _ = key[n:].partition("/")
                files_open = {f for f in files_open if below + f + _AFTER_SLASH > key}
                if slash:
                    if name not in files_open:
                        yield name, None
                    files_open.discard(name)
                    pos = below + name + _AFTER_SLASH
                else:
                    yield name, x
                    files_open.add(name)
                    pos = key + "\0"
            if len(batch) < BATCH:
                return


def _read_range(t: Txn, key: str, byte_range: ByteRequest | None) -> bytes | None:
    """The bytes of ``byte_range`` of the value of ``key`` (all of it for ``None``); a value a
    mount stored in parts (zarrfs.fs.parts) is read from its parts."""
    if key == "":  # no database here holds it: absent, as in zarr's own stores
        return None
    if byte_range is None:
        return parts.whole(t, key, t.get(key))
    if not isinstance(byte_range, (RangeByteRequest, OffsetByteRequest, SuffixByteRequest)):
        raise TypeError(f"Unexpected byte_range, got {byte_range!r}")  # zarr's wording
    if isinstance(byte_range, RangeByteRequest):
        return parts.read(t, key, byte_range.start, max(0, byte_range.end - byte_range.start))
    size = parts.size_of(t, key)
    if size is None:
        return None
    if isinstance(byte_range, OffsetByteRequest):
        start = byte_range.offset
    else:
        start = max(0, size - byte_range.suffix)
    return parts.read(t, key, start, max(0, size - start))


def _as_bytes(value: Buffer, what: str) -> bytes:
    if not isinstance(value, Buffer):
        raise TypeError(f"DatabaseStore.{what}(): value must be a Buffer, not {type(value).__name__}")
    return value.to_bytes()

"""Redis driver: ``redis://[:password@]host:port/db?prefix=zarr``, ``rediss://...``,
``unix:///path/to/sock?db=0&prefix=zarr``; other query options go to redis-py.

Data keys are plain strings ``"{prefix}:{key}"``, exactly as zarr-python 2's ``RedisStore``
writes them. Everything else lives outside the pattern ``{prefix}:*`` that ``RedisStore`` lists:

* ``zarrfs.index.{prefix}``: a sorted set of the data keys (all scores 0, read with
  ``ZRANGEBYLEX``), so a listing touches only the keys it returns, never the whole keyspace. It
  is updated in the same ``MULTI``/``EXEC`` as the data. The empty member ``""`` (no key is
  empty) marks an index known to be complete; a database written by ``RedisStore`` has no
  index, so when the marker is missing the index is rebuilt with ``SCAN MATCH {prefix}:*``.
  Keeping the marker inside the set means deleting the set also deletes the marker.
  ``RedisStore`` does not maintain the index: keys it deletes leave stale entries (scans
  check existence and drop them; :meth:`RedisDriver.reindex` prunes them); keys it adds while
  the index exists are not listed until :meth:`RedisDriver.reindex`.
* ``zarrfs.side.{prefix}:{key}``: side values, with their own index
  ``zarrfs.sideindex.{prefix}``.

Transactions are optimistic. A write transaction reads from the server, ``WATCH``-ing every key
it reads (and the index when it scans), buffers its writes (its own reads and scans see them),
and commits them in one ``MULTI``/``EXEC``; a watched key changed by someone else aborts the
``EXEC`` and the transaction is retried (:class:`RetryableError`). Because the index is watched
by scans, a write transaction that scans conflicts with any concurrent creation of a new key;
re-setting an existing key does not touch the index. Read-only transactions do not watch:
each read sees the latest committed state (read committed, not a snapshot).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.exceptions as rexc

from ._util import DELETED, as_buffer, decode_key, empty_range, encode_bound, merge_buffered
from .base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    BackendError,
    Driver,
    ReadOnlyError,
    RetryableError,
    StorageFullError,
    Txn,
    UnavailableError,
    encode_key,
    prefix_stop,
)

log = logging.getLogger("zarrfs.backends.redis")

COMPLETE = b""  # index member meaning "this index lists every data key"
BATCH = 1000  # index members read per ZRANGEBYLEX
VALUE_BATCH = 16  # values per MGET: values can be many MiB each
_GLOB_SPECIAL = b"*?[]\\"


def _error(exc: Exception, what: str) -> BackendError:
    """Map a redis-py exception to the driver interface's classes."""
    if isinstance(exc, rexc.OutOfMemoryError) or str(exc).startswith("OOM"):
        return StorageFullError(f"{what}: Redis is out of memory (maxmemory): {exc}")
    if isinstance(exc, (rexc.BusyLoadingError, rexc.TryAgainError, rexc.WatchError)):
        return RetryableError(f"{what}: {exc}")
    if isinstance(exc, rexc.ReadOnlyError):
        return ReadOnlyError(f"{what}: {exc}")
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
        return UnavailableError(f"{what}: {exc}")
    if isinstance(exc, BackendError):
        return exc
    return BackendError(f"{what}: {exc}")


def _glob_escape(raw: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in raw)


class _Conn:
    """A pooled connection held for one transaction, so ``WATCH`` and ``EXEC`` share it; each
    call sends its commands in one write and reads every reply (one round trip)."""

    def __init__(self, driver: RedisDriver) -> None:
        self.driver = driver
        self.pool = driver.pool
        try:
            self.conn = self.pool.get_connection()
        except Exception as exc:
            raise _error(exc, driver.where) from exc
        self.broken = False

    def call(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` pipelined; return their replies (error replies as exceptions)."""
        try:
            self.conn.send_packed_command(self.conn.pack_commands(commands))
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(self.conn.read_response())
                except rexc.ResponseError as exc:
                    replies.append(exc)
            return replies
        except Exception as exc:
            self.broken = True
            raise _error(exc, self.driver.where) from exc

    def checked(self, *commands: tuple[Any, ...]) -> list[Any]:
        """:meth:`call`, raising the first error reply."""
        replies = self.call(*commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise _error(reply, self.driver.where)
        return replies

    def release(self, watching: bool) -> None:
        """Return the connection to the pool, clean: unwatched, or disconnected if broken."""
        if watching and not self.broken:
            try:
                self.call(("UNWATCH",))
            except BackendError:
                pass
        if self.broken:
            self.conn.disconnect()
        self.pool.release(self.conn)


class RedisTxn(Txn):
    """An optimistic transaction; see the module docstring."""

    def __init__(self, driver: RedisDriver, write: bool) -> None:
        self._d = driver
        self._write = write
        self._conn = _Conn(driver)
        self._pending: dict[tuple[str, bytes], Any] = {}
        self._watched: set[bytes] = set()

    # -- reads ------------------------------------------------------------------------------
    def _watch(self, names: list[bytes]) -> list[tuple[Any, ...]]:
        """The WATCH command to send before reading ``names`` (none in read-only txns)."""
        if not self._write:
            return []
        fresh = [n for n in names if n not in self._watched]
        if not fresh:
            return []
        self._watched.update(fresh)
        return [("WATCH", *fresh)]

    def _query(self, names: list[bytes], *commands: tuple[Any, ...]) -> list[Any]:
        watch = self._watch(names)
        return self._conn.checked(*watch, *commands)[len(watch) :]

    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key`` (this transaction's pending write if any) or ``None``."""
        raw = encode_key(key)
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else pending
        name = self._d.name(space, raw)
        return self._query([name], ("GET", name))[0]

    def size(self, key: str, space: str = DATA) -> int | None:
        """Return the value's length with ``STRLEN`` (``EXISTS`` tells empty from absent)."""
        raw = encode_key(key)
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else len(pending)
        name = self._d.name(space, raw)
        exists, size = self._query([name], ("EXISTS", name), ("STRLEN", name))
        return size if exists else None

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """Return a byte range with ``GETRANGE``."""
        raw = encode_key(key)
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else pending[offset : offset + length]
        name = self._d.name(space, raw)
        if length <= 0:
            return b"" if self._query([name], ("EXISTS", name))[0] else None
        exists, data = self._query([name], ("EXISTS", name), ("GETRANGE", name, offset, offset + length - 1))
        return data if exists else None

    def read_many(self, requests: Sequence[tuple[str, str, str]]) -> list[Any]:
        """All the reads in one pipeline (one round trip). A write transaction, which must
        WATCH and see its own writes, answers them one by one."""
        if self._write:
            return super().read_many(requests)
        commands: list[tuple[Any, ...]] = []
        for op, key, space in requests:
            raw = encode_key(key)
            if op == "size":
                name = self._d.name(space, raw)
                commands += [("EXISTS", name), ("STRLEN", name)]
            elif op == "get":
                commands.append(("GET", self._d.name(space, raw)))
            elif op == "prefix":
                if space == DATA and not self._d.indexed:
                    return super().read_many(requests)
                index = self._d.index[space]
                hi = encode_bound(prefix_stop(key))
                high = b"(" + hi if hi is not None else b"+"
                commands.append(("ZRANGEBYLEX", index, b"[" + raw, high, "LIMIT", 0, 1))
            else:
                raise ValueError(f"unknown read {op!r}")
        replies = iter(self._conn.checked(*commands))
        out: list[Any] = []
        for op, _, _ in requests:
            if op == "size":
                exists, size = next(replies), next(replies)
                out.append(size if exists else None)
            elif op == "get":
                out.append(next(replies))
            else:
                out.append(bool(next(replies)))
        return out

    # -- writes (buffered until commit) -----------------------------------------------------
    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """Buffer ``SET``; the value is copied now, since the caller may reuse its buffer."""
        raw = encode_key(key)
        self._d.name(space, raw)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        self._pending[(space, raw)] = bytes(as_buffer(value))

    def delete(self, key: str, space: str = DATA) -> None:
        """Buffer ``DEL``."""
        raw = encode_key(key)
        self._d.name(space, raw)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        self._pending[(space, raw)] = DELETED

    # -- scans --------------------------------------------------------------------------------
    def _members(self, space: str, lo: bytes, hi: bytes | None, first: int) -> Iterator[list[bytes]]:
        """Yield batches of index members in ``[lo, hi)``, in order."""
        index = self._d.index[space]
        if space == DATA and not self._d.indexed:
            # Read-only and no index to read: list the whole keyspace (slow, but correct).
            members = [m for m in self._d.scan_keyspace() if m >= lo and (hi is None or m < hi)]
            members.sort()
            for i in range(0, len(members), BATCH):
                yield members[i : i + BATCH]
            return
        low = b"[" + lo if lo else b"("  # "(" + "" skips the COMPLETE marker
        high = b"(" + hi if hi is not None else b"+"
        n = first
        while True:
            (batch,) = self._query([index], ("ZRANGEBYLEX", index, low, high, "LIMIT", 0, n))
            if batch:
                yield batch
            if len(batch) < n:
                return
            low = b"(" + batch[-1]
            n = BATCH

    def _stored(
        self, space: str, lo: bytes, hi: bytes | None, fetch: str, first: int
    ) -> Iterator[tuple[bytes, Any]]:
        """Index members that still exist (a stale entry, whose key another writer deleted, is
        dropped in the same round trip that fetches sizes or values)."""
        for batch in self._members(space, lo, hi, first):
            names = [self._d.name(space, m) for m in batch]
            if fetch == KEYS:
                found = self._query([], *(("EXISTS", n) for n in names))
                yield from ((m, None) for m, e in zip(batch, found, strict=True) if e)
            elif fetch == SIZES:
                sizes = self._query(names, *(("STRLEN", n) for n in names))
                # STRLEN is 0 for a missing key and for an empty value alike: ask EXISTS for those.
                zero = [i for i, s in enumerate(sizes) if s == 0]
                if zero:
                    exists = self._query([], *(("EXISTS", names[i]) for i in zero))
                    for i, e in zip(zero, exists, strict=True):
                        if not e:
                            sizes[i] = None
                yield from ((m, s) for m, s in zip(batch, sizes, strict=True) if s is not None)
            else:
                for i in range(0, len(names), VALUE_BATCH):
                    part = names[i : i + VALUE_BATCH]
                    (values,) = self._query(part, ("MGET", *part))
                    yield from (
                        (m, v)
                        for m, v in zip(batch[i : i + VALUE_BATCH], values, strict=True)
                        if v is not None
                    )

    def scan(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: str = DATA,
        fetch: str = KEYS,
        limit: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``[start, stop)`` from the index, merged with this transaction's own writes."""
        lo, hi = encode_bound(start), encode_bound(stop)
        if space not in self._d.index:
            raise ValueError(f"unknown key space {space!r}")
        if empty_range(lo, hi, limit):
            return
        pending = sorted(
            (raw, v)
            for (sp, raw), v in self._pending.items()
            if sp == space and raw >= lo and (hi is None or raw < hi)
        )
        mine = [
            (raw, v if v is DELETED else None if fetch == KEYS else len(v) if fetch == SIZES else v)
            for raw, v in pending
        ]
        hidden = sum(1 for _, v in pending if v is DELETED)
        first = BATCH if limit is None else min(BATCH, limit + hidden + 1)
        for raw, x in merge_buffered(self._stored(space, lo, hi, fetch, first), mine, None):
            key = decode_key(raw, self._d.where)
            if key is None:
                continue
            yield key, x
            if limit is not None:
                limit -= 1
                if limit <= 0:
                    return

    # -- commit -------------------------------------------------------------------------------
    def finish(self, ok: bool) -> None:
        """Commit the buffered writes in one ``MULTI``/``EXEC`` (or drop them)."""
        conn = self._conn
        if not ok or not self._pending:
            conn.release(watching=bool(self._watched))
            return
        commands: list[tuple[Any, ...]] = [("MULTI",)]
        for (space, raw), value in self._pending.items():
            name, index = self._d.name(space, raw), self._d.index[space]
            if value is DELETED:
                commands += [("DEL", name), ("ZREM", index, raw)]
            else:
                commands += [("SET", name, value), ("ZADD", index, 0, raw)]
        commands.append(("EXEC",))
        try:
            replies = conn.call(*commands)
            for reply in replies[:-1]:
                if isinstance(reply, Exception):  # refused while queueing, e.g. OOM
                    raise _error(reply, self._d.where)
            result = replies[-1]
            if result is None:
                raise RetryableError(f"{self._d.where}: write conflict (a watched key changed)")
            if isinstance(result, Exception):
                raise _error(result, self._d.where)
            for reply in result:
                if isinstance(reply, Exception):
                    raise _error(reply, self._d.where)
        finally:
            # EXEC (or its failure) has ended the WATCH either way.
            conn.release(watching=False)


class RedisDriver(Driver):
    """Driver for Redis; see the module docstring."""

    schemes = ("redis", "rediss", "unix")
    # Optimistic transactions conflict more often than lock-based ones.
    max_attempts = 25

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        prefixes = [v for k, v in query if k == "prefix"]
        self.prefix = prefixes[-1] if prefixes else "zarr"
        rest = urlencode([(k, v) for k, v in query if k != "prefix"])
        # Not urlunsplit: it drops the "//" of "unix:///path" (empty netloc), which redis-py needs.
        client_url = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")
        safe_netloc = parts.netloc.rpartition("@")[2]
        self.where = f"{parts.scheme}://{safe_netloc}{parts.path} prefix={self.prefix}"
        p = self.prefix.encode("utf-8")
        self.data_prefix = p + b":"
        self.side_prefix = b"zarrfs.side." + p + b":"
        self.index = {DATA: b"zarrfs.index." + p, SIDE: b"zarrfs.sideindex." + p}
        try:
            # Bounded timeouts: a FUSE call must fail (EIO) rather than hang on a dead server.
            tcp = {"socket_keepalive": True} if parts.scheme != "unix" else {}
            self.pool = redis.ConnectionPool.from_url(
                client_url, socket_connect_timeout=10, socket_timeout=120, **tcp
            )
            self.client = redis.Redis(connection_pool=self.pool)
            self.client.ping()
        except Exception as exc:
            raise _error(exc, self.where) from exc
        self.indexed = self._ensure_index()

    def name(self, space: str, raw: bytes) -> bytes:
        """The Redis key that holds ``raw`` in ``space``."""
        if space == DATA:
            return self.data_prefix + raw
        if space == SIDE:
            return self.side_prefix + raw
        raise ValueError(f"unknown key space {space!r}")

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:
            if isinstance(exc, (rexc.RedisError, OSError)):
                raise _error(exc, self.where) from exc
            raise

    # -- the index ----------------------------------------------------------------------------
    def scan_keyspace(self) -> Iterator[bytes]:
        """Yield the data keys (without prefix) found by ``SCAN MATCH {prefix}:*`` (string keys
        only; ``SCAN`` may repeat a key)."""
        match = _glob_escape(self.data_prefix) + b"*"
        cut = len(self.data_prefix)
        with self._translated():
            for name in self.client.scan_iter(match=match, count=10000, _type="string"):
                yield name[cut:]

    def _ensure_index(self) -> bool:
        with self._translated():
            if self.client.zscore(self.index[DATA], COMPLETE) is not None:
                return True
        if self.readonly:
            log.warning("%s: no key index and opened read-only: every listing scans the keyspace", self.where)
            return False
        self.reindex(prune=False)
        return True

    def reindex(self, prune: bool = True) -> int:
        """Add every ``{prefix}:*`` string key to the index (keys another client such as
        ``RedisStore`` wrote), then, with ``prune``, drop entries whose key is gone. Returns the
        number of keys found. Safe while other writers run."""
        index = self.index[DATA]
        found = 0
        batch: list[bytes] = []
        with self._translated():
            for member in self.scan_keyspace():
                batch.append(member)
                if len(batch) >= 10000:
                    self.client.zadd(index, dict.fromkeys(batch, 0))
                    found += len(batch)
                    batch = []
            if batch:
                self.client.zadd(index, dict.fromkeys(batch, 0))
                found += len(batch)
            if prune:
                self._prune(index)
            self.client.zadd(index, {COMPLETE: 0})
        return found

    # Removes an index entry only if its key is absent, atomically: removing it after a separate
    # check could unlist a key another writer created in between.
    _PRUNE = """
    local removed = 0
    for i = 2, #ARGV do
        if redis.call('EXISTS', ARGV[1] .. ARGV[i]) == 0 then
            removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
        end
    end
    return removed
    """

    def _prune(self, index: bytes) -> None:
        script = self.client.register_script(self._PRUNE)
        low = b"("
        while True:
            batch = self.client.zrangebylex(index, low, b"+", start=0, num=BATCH)
            if not batch:
                return
            script(keys=[index], args=[self.data_prefix, *batch])
            low = b"(" + batch[-1]

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        txn = RedisTxn(self, write)
        try:
            yield txn
        except BaseException:
            txn.finish(False)
            raise
        txn.finish(True)

    # One-shot reads: no WATCH needed, MULTI makes EXISTS + STRLEN/GETRANGE one atomic step.
    def get(self, key: str, space: str = DATA) -> bytes | None:
        """One-shot ``GET``."""
        name = self.name(space, encode_key(key))
        with self._translated():
            return self.client.get(name)

    def size(self, key: str, space: str = DATA) -> int | None:
        """One-shot ``EXISTS`` + ``STRLEN`` in one ``MULTI``."""
        name = self.name(space, encode_key(key))
        with self._translated():
            exists, size = self.client.pipeline().exists(name).strlen(name).execute()
        return size if exists else None

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """One-shot ``EXISTS`` + ``GETRANGE`` in one ``MULTI``."""
        name = self.name(space, encode_key(key))
        if length <= 0:
            with self._translated():
                return b"" if self.client.exists(name) else None
        with self._translated():
            exists, data = (
                self.client.pipeline().exists(name).getrange(name, offset, offset + length - 1).execute()
            )
        return data if exists else None

    def statfs(self) -> dict[str, int] | None:
        """``maxmemory`` (or the server's RAM when unlimited) and what ``used_memory`` leaves."""
        with self._translated():
            info = self.client.info("memory")
        total = int(info.get("maxmemory") or 0) or int(info.get("total_system_memory") or 0)
        if not total:
            return None
        return {"total": total, "free": max(0, total - int(info.get("used_memory") or 0))}

    def close(self) -> None:
        """Close the connection pool."""
        self.pool.disconnect()

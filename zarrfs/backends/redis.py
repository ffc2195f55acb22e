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
  check existence and drop them, with one multi-key ``EXISTS`` per batch;
  :meth:`RedisDriver.reindex` prunes them; a ``prefix`` read of :meth:`Txn.read_many`, which
  must stay one round trip, trusts the index); keys it adds while the index exists are not
  listed until :meth:`RedisDriver.reindex`.
* ``zarrfs.side.{prefix}:{key}``: side values, with their own index
  ``zarrfs.sideindex.{prefix}``.

Transactions are optimistic. A write transaction reads from the server, ``WATCH``-ing every key
it reads (and the index when it scans), buffers its writes (its own reads and scans see them),
and commits them in one ``MULTI``/``EXEC``; a watched key changed by someone else aborts the
``EXEC`` and the transaction is retried (:class:`RetryableError`). Because the index is watched
by scans, a write transaction that scans conflicts with any concurrent creation of a new key;
re-setting an existing key does not touch the index. Read-only transactions do not watch:
each read sees the latest committed state (read committed, not a snapshot).

Round trips are what a transaction costs, so each thread keeps one connection across its
transactions (no pool checkout per transaction) and parses replies with hiredis straight from
the socket: a read-only transaction costs one round trip per read or read batch and nothing to
begin or end; a write transaction's ``read_many`` sends its ``WATCH`` in the same pipeline as
the reads, and its commit is one ``MULTI``/``EXEC`` round trip (an ``UNWATCH`` owed by a
transaction that ends without ``EXEC`` rides on the connection's next call). In a read-only
transaction a scan keeps the range of the index it read, so a scan inside it (a listing asking
whether a listed key also has children) is answered as of that read without a round trip, and
paging through a range reads ahead in growing batches.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import select
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.exceptions as rexc

try:  # the C reply parser redis-py also uses; without it replies go through redis-py
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency on CPython
    hiredis = None

from zarrfs.spin import next_window

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
VALUE_BATCH = 16  # values per first MGET: values can be many MiB each
VALUE_BYTES = 4 << 20  # MGET batches grow while the values they return stay below this
BIG_ARG = 1 << 16  # arguments longer than this are sent as they are, not copied into a buffer
IDLE_CHECK = 1.0  # seconds: a connection idle longer is checked for a close by the server
_GLOB_SPECIAL = b"*?[]\\"
SPIN = 100e-6  # seconds a link polls for a reply before it sleeps (see _Link._receive)

# Error replies by their first word (hiredis hands them over as plain ResponseError).
_RETRYABLE_REPLIES = ("LOADING", "TRYAGAIN", "BUSY", "MASTERDOWN")


def _error(exc: Exception, what: str) -> BackendError:
    """Map a redis-py exception (or an error reply) to the driver interface's classes."""
    if isinstance(exc, BackendError):
        return exc
    msg = str(exc)
    if isinstance(exc, rexc.OutOfMemoryError) or msg.startswith("OOM"):
        return StorageFullError(f"{what}: Redis is out of memory (maxmemory): {exc}")
    if isinstance(exc, (rexc.BusyLoadingError, rexc.TryAgainError, rexc.WatchError)) or (
        isinstance(exc, rexc.ResponseError) and msg.startswith(_RETRYABLE_REPLIES)
    ):
        return RetryableError(f"{what}: {exc}")
    if isinstance(exc, rexc.ReadOnlyError) or (
        isinstance(exc, rexc.ResponseError) and msg.startswith("READONLY")
    ):
        return ReadOnlyError(f"{what}: {exc}")
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
        return UnavailableError(f"{what}: {exc}")
    return BackendError(f"{what}: {exc}")


def _glob_escape(raw: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in raw)


# A link kept by a thread must not be used by a process forked from it (the socket is shared).
_fork_generation = 0


def _forked() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _arg(a: Any) -> bytes | memoryview:
    if isinstance(a, (bytes, memoryview)):
        return a
    if isinstance(a, str):
        return a.encode("utf-8")
    if isinstance(a, int):
        return b"%d" % a
    return memoryview(a)


def _pack_big(commands: Sequence[tuple[Any, ...]]) -> list[bytes | memoryview]:
    """The RESP encoding of ``commands`` as few buffers, with long values (chunks of MiB) as
    buffers of their own rather than copied into one."""
    out: list[bytes | memoryview] = []
    small: list[bytes] = []
    for cmd in commands:
        if all(not isinstance(a, (bytes, memoryview)) or len(a) <= BIG_ARG for a in cmd):
            small.append(hiredis.pack_command(cmd))
            continue
        small.append(b"*%d\r\n" % len(cmd))
        for a in cmd:
            a = _arg(a)
            if len(a) > BIG_ARG:
                small.append(b"$%d\r\n" % len(a))
                out.append(b"".join(small))
                out.append(a)
                small = [b"\r\n"]
            else:
                small.append(b"$%d\r\n%s\r\n" % (len(a), a))
    if small:
        out.append(b"".join(small))
    return out


class _Link:
    """One connection held by one thread across its transactions (no pool round trip per
    transaction). Commands of a call are sent in one write and every reply is read (one round
    trip); replies are parsed by hiredis straight from the socket.

    ``unwatch`` defers the ``UNWATCH`` that a write transaction ending without ``EXEC`` owes:
    it goes in front of the next call on this connection instead of costing a round trip."""

    def __init__(self, driver: RedisDriver) -> None:
        self.driver = driver
        self.pool = driver.pool
        try:
            self.conn = self.pool.get_connection()
        except Exception as exc:
            raise _error(exc, driver.where) from exc
        self.generation = _fork_generation
        self.busy = False
        self.extra = False
        self.broken = False
        self.unwatch = False
        self.used = time.monotonic()
        protocol = getattr(self.conn, "protocol", 2)
        self.sock = getattr(self.conn, "_sock", None)
        self.fast = hiredis is not None and self.sock is not None and str(protocol) == "2"
        if self.fast:
            self.reader = hiredis.Reader(replyError=rexc.ResponseError)
            self.buf = bytearray(1 << 18)
            self.spin = SPIN

    def usable(self) -> bool:
        """Whether this link can serve a new transaction (checks an idle socket for a close)."""
        if self.broken or self.generation != _fork_generation:
            return False
        now = time.monotonic()
        if now - self.used > IDLE_CHECK:
            sock = self.sock if self.fast else getattr(self.conn, "_sock", None)
            try:
                if sock is None or select.select([sock], [], [], 0)[0]:
                    return False  # closed by the server (or stray data): reconnect
            except (OSError, ValueError):
                return False
        self.used = now
        return True

    def call(self, commands: Sequence[tuple[Any, ...]], big: bool = False) -> list[Any]:
        """Send ``commands`` pipelined; return their replies (error replies as exceptions).
        ``big``: some arguments may be long values (a commit), sent without copying them."""
        if self.unwatch:
            commands = [("UNWATCH",), *commands]
        try:
            if self.fast:
                replies = self._call_fast(commands, big)
            else:
                replies = self._call_slow(commands)
        except BaseException as exc:
            # Replies may be left unread (even on KeyboardInterrupt): never reuse the socket.
            self.broken = True
            if isinstance(exc, Exception):
                raise _error(exc, self.driver.where) from exc
            raise
        if self.unwatch:
            self.unwatch = False
            del replies[0]
        return replies

    def _call_fast(self, commands: Sequence[tuple[Any, ...]], big: bool) -> list[Any]:
        sock = self.sock
        if big:
            for piece in _pack_big(commands):
                sock.sendall(piece)
        else:
            pack = hiredis.pack_command
            sock.sendall(b"".join([pack(c) for c in commands]))
        n = len(commands)
        replies: list[Any] = []
        reader, buf = self.reader, self.buf
        while len(replies) < n:
            reply = reader.gets()
            if reply is False:
                got = self._receive(sock, buf)
                if not got:
                    raise rexc.ConnectionError("the server closed the connection")
                reader.feed(buf, 0, got)
            else:
                replies.append(reply)
        return replies

    def _receive(self, sock: Any, buf: bytearray) -> int:
        """``recv_into`` that first polls the socket for up to ``spin`` seconds.

        A reply from a server on the same machine comes back within tens of microseconds, but
        a thread that sleeps for it pays about as much again to be woken on another CPU. So the
        link polls for a short while before it sleeps. The window adapts as the request loop's
        does: a reply that came within :data:`SPIN` makes it full again, a slower one (a remote
        server, a large value) halves it, down to never spinning."""
        clock = time.perf_counter
        start = clock()
        if self.spin:
            timeout = sock.gettimeout()
            sock.settimeout(0.0)
            try:
                while True:
                    try:
                        got = sock.recv_into(buf)
                    except (BlockingIOError, ssl.SSLWantReadError):
                        if clock() - start > self.spin:
                            break
                    else:
                        self.spin = SPIN
                        return got
            finally:
                sock.settimeout(timeout)
        got = sock.recv_into(buf)
        self.spin = next_window(self.spin, clock() - start, SPIN)
        return got

    def _call_slow(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        conn = self.conn
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except rexc.ResponseError as exc:
                replies.append(exc)
        return replies

    def checked(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """:meth:`call`, raising the first error reply."""
        replies = self.call(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise _error(reply, self.driver.where)
        return replies

    def close(self) -> None:
        """Disconnect and give the connection back to the pool."""
        self.broken = True
        try:
            self.conn.disconnect()
        finally:
            self.pool.release(self.conn)


def _covers(window: tuple[Any, ...], lo: bytes, hi: bytes | None) -> bool:
    """Whether ``[lo, hi)`` lies inside the index range a window covers."""
    start, included, end, end_included = window[:4]
    if lo < start or (lo == start and not included):
        return False
    if end is None:
        return True
    if hi is None:
        return False
    return hi <= end + b"\0" if end_included else hi <= end


def _continues(window: tuple[Any, ...], lo: bytes) -> bool:
    """Whether a range starting at ``lo`` starts inside a window and goes on past its end."""
    start, included, end = window[:3]
    if lo < start or (lo == start and not included) or end is None:
        return False
    return lo <= end if window[3] else lo < end


def _within(members: list[bytes], lo: bytes, hi: bytes | None) -> Iterator[tuple[bytes, None]]:
    i = bisect.bisect_left(members, lo)
    j = len(members) if hi is None else bisect.bisect_left(members, hi)
    return ((m, None) for m in members[i:j])


class RedisTxn(Txn):
    """An optimistic transaction; see the module docstring. Also its own context manager:
    leaving the block commits, or drops the writes when the block raised."""

    def __init__(self, driver: RedisDriver, write: bool) -> None:
        self._d = driver
        self._write = write
        self._link = driver._acquire()
        self._pending: dict[tuple[str, bytes], Any] = {}
        self._watched: set[bytes] = set()
        # Write transactions: values already read. They are WATCHed, so they stay right until
        # EXEC (or EXEC fails and the transaction runs again): a second read costs nothing.
        self._seen: dict[tuple[str, bytes], bytes | None] = {}
        # Read-only: per space, the last range of the index read by a KEYS scan and the keys
        # in it that exist, which answers a scan inside that range again (the check of a
        # listed key for children of the same name lands there) without a round trip.
        self._windows: dict[str, tuple[Any, ...]] = {}
        self._ahead: dict[str, int] = {}

    def __enter__(self) -> RedisTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exc_type is None)

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
        watch = self._watch(names) if self._write else []
        if watch:
            return self._link.checked([*watch, *commands])[1:]
        return self._link.checked(commands)

    def get(self, key: str, space: str = DATA) -> bytes | None:
        """Return the value of ``key`` (this transaction's pending write if any) or ``None``."""
        raw = encode_key(key)
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else bytes(pending)
        if (space, raw) in self._seen:
            return self._seen[(space, raw)]
        name = self._d.name(space, raw)
        value = self._query([name], ("GET", name))[0]
        if self._write:
            self._seen[(space, raw)] = value
        return value

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
            return None if pending is DELETED else bytes(pending[offset : offset + length])
        name = self._d.name(space, raw)
        if length <= 0:
            return b"" if self._query([name], ("EXISTS", name))[0] else None
        exists, data = self._query([name], ("EXISTS", name), ("GETRANGE", name, offset, offset + length - 1))
        return data if exists else None

    def read_many(self, requests: Sequence[tuple[str, str, str]]) -> list[Any]:
        """All the reads in one pipeline (one round trip), in a write transaction too: the names
        read (the index, for ``prefix``) are WATCHed in the same pipeline, and this
        transaction's pending writes answer or correct what the server says.

        ``prefix`` reads the first index entry in the range, skipping as many more as there are
        pending deletes in it; a pending put in the range answers it without the server."""
        d = self._d
        pending = self._pending
        commands: list[tuple[Any, ...]] = []
        names: list[bytes] = []
        plan: list[tuple[int, Any]] = []  # (0, answer) | (1, reply index) | (2, index, hidden)
        for op, key, space in requests:
            raw = encode_key(key)
            if op == "size" or op == "get":
                name = d.name(space, raw)
                mine = pending.get((space, raw)) if pending else None
                if mine is None and (space, raw) in self._seen:
                    mine = self._seen[(space, raw)]
                    mine = DELETED if mine is None else mine
                if mine is not None:
                    if mine is DELETED:
                        plan.append((0, None))
                    else:
                        plan.append((0, len(mine) if op == "size" else bytes(mine)))
                    continue
                names.append(name)
                if op == "size":
                    plan.append((1, len(commands)))
                    commands += [("EXISTS", name), ("STRLEN", name)]
                else:
                    plan.append((1, len(commands), (space, raw)))
                    commands.append(("GET", name))
            elif op == "prefix":
                index = d.index.get(space)
                if index is None:
                    raise ValueError(f"unknown key space {space!r}")
                if space == DATA and not d.indexed:
                    return super().read_many(requests)
                hidden: set[bytes] = set()
                if pending:
                    put = False
                    for (sp, r), v in pending.items():
                        if sp == space and r.startswith(raw):
                            if v is DELETED:
                                hidden.add(r)
                            else:
                                put = True
                                break
                    if put:
                        plan.append((0, True))
                        continue
                names.append(index)
                hi = encode_bound(prefix_stop(key))
                high = b"(" + hi if hi is not None else b"+"
                plan.append((2, len(commands), hidden))
                commands.append(("ZRANGEBYLEX", index, b"[" + raw, high, "LIMIT", 0, 1 + len(hidden)))
            else:
                raise ValueError(f"unknown read {op!r}")
        replies = self._query(names, *commands) if commands else []
        out: list[Any] = []
        for step in plan:
            kind = step[0]
            if kind == 0:
                out.append(step[1])
                continue
            i = step[1]
            op = commands[i][0]
            if op == "EXISTS":
                out.append(replies[i + 1] if replies[i] else None)
            elif op == "GET":
                out.append(replies[i])
                if self._write:
                    self._seen[step[2]] = replies[i]
            else:
                out.append(any(m not in step[2] for m in replies[i]))
        return out

    # -- writes (buffered until commit) -----------------------------------------------------
    def put(self, key: str, value: Any, space: str = DATA) -> None:
        """Buffer ``SET``. The value is not copied: it stays unchanged until the transaction
        ends (see :meth:`Txn.put`), and a chunk of MiB is sent from the caller's buffer."""
        raw = encode_key(key)
        self._d.name(space, raw)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        value = as_buffer(value)
        self._pending[(space, raw)] = value if len(value) > BIG_ARG else bytes(value)

    def delete(self, key: str, space: str = DATA) -> None:
        """Buffer ``DEL``."""
        raw = encode_key(key)
        self._d.name(space, raw)
        if not self._write:
            raise ReadOnlyError("write in a read-only transaction")
        self._pending[(space, raw)] = DELETED

    # -- scans --------------------------------------------------------------------------------
    def _members(
        self, space: str, lo: bytes, hi: bytes | None, first: int, after: bool = False
    ) -> Iterator[tuple[list[bytes], Any]]:
        """Yield batches of index members in ``[lo, hi)`` (``(lo, hi)`` with ``after``), in
        order, each with the range of the index it covers (``None`` when not known):
        ``(start, start included, end, end included)``, ``end`` None for no bound."""
        index = self._d.index[space]
        if space == DATA and not self._d.indexed:
            # Read-only and no index to read: list the whole keyspace (slow, but correct).
            members = [
                m
                for m in self._d.scan_keyspace()
                if (m > lo if after else m >= lo) and (hi is None or m < hi)
            ]
            members.sort()
            for i in range(0, len(members), BATCH):
                yield members[i : i + BATCH], None
            return
        low = b"(" + lo if after or not lo else b"[" + lo  # "(" + "" skips the COMPLETE marker
        high = b"(" + hi if hi is not None else b"+"
        start, included = lo, not after
        n = first
        while True:
            (batch,) = self._query([index], ("ZRANGEBYLEX", index, low, high, "LIMIT", 0, n))
            if len(batch) < n:
                yield batch, (start, included, hi, False)
                return
            yield batch, (start, included, batch[-1], True)
            low = b"(" + batch[-1]
            start, included = batch[-1], False
            n = BATCH

    def _stored(
        self, space: str, lo: bytes, hi: bytes | None, fetch: str, first: int, after: bool = False
    ) -> Iterator[tuple[bytes, Any]]:
        """Index members that still exist (a stale entry, whose key another writer deleted, is
        dropped: found by one multi-key ``EXISTS`` per batch, or with the sizes or values)."""
        value_batch = VALUE_BATCH
        for batch, covered in self._members(space, lo, hi, first, after):
            if not batch:
                if covered is not None and fetch == KEYS and not self._write:
                    self._windows[space] = (*covered, batch)
                continue
            names = [self._d.name(space, m) for m in batch]
            if fetch == KEYS:
                # One EXISTS counts the batch's keys that exist: all of them, but for stale entries.
                (count,) = self._query([], ("EXISTS", *names))
                if count != len(names):
                    found = self._query([], *(("EXISTS", n) for n in names))
                    batch = [m for m, e in zip(batch, found, strict=True) if e]
                if covered is not None and not self._write:
                    self._windows[space] = (*covered, batch)
                yield from ((m, None) for m in batch)
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
                i = 0
                while i < len(names):
                    part = names[i : i + value_batch]
                    (values,) = self._query(part, ("MGET", *part))
                    yield from (
                        (m, v) for m, v in zip(batch[i : i + len(part)], values, strict=True) if v is not None
                    )
                    i += len(part)
                    # Small values (markers, metadata): fetch more per round trip next time.
                    total = sum(len(v) for v in values if v is not None)
                    if total * 4 < VALUE_BYTES:
                        value_batch = min(BATCH, value_batch * 4)
                    elif total > VALUE_BYTES:
                        value_batch = max(1, value_batch // 4)

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
            (raw, v if v is DELETED else None if fetch == KEYS else len(v) if fetch == SIZES else bytes(v))
            for raw, v in pending
        ]
        hidden = sum(1 for _, v in pending if v is DELETED)
        first = BATCH if limit is None else min(BATCH, limit + hidden + 1)
        window = self._windows.get(space) if fetch == KEYS and not self._write else None
        if window is None:
            stored = self._stored(space, lo, hi, fetch, first)
        elif _covers(window, lo, hi):
            stored = _within(window[4], lo, hi)
        elif _continues(window, lo):
            # Paging through a range (a listing): the rest of the window, then read ahead,
            # more each time, in fewer round trips than the pages.
            start, included, end, end_included, members = window
            ahead = min(BATCH, 2 * self._ahead.get(space, first))
            self._ahead[space] = ahead
            head = _within(members, lo, end + b"\0" if end_included else end)
            stored = itertools.chain(head, self._stored(space, end, hi, fetch, ahead, after=end_included))
        else:
            stored = self._stored(space, lo, hi, fetch, first)
        where = self._d.where
        for raw, x in merge_buffered(stored, mine, None) if mine else stored:
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                key = decode_key(raw, where)
                if key is None:
                    continue
            yield key, x
            if limit is not None:
                limit -= 1
                if limit <= 0:
                    return

    # -- commit -------------------------------------------------------------------------------
    def finish(self, ok: bool) -> None:
        """Commit the buffered writes in one ``MULTI``/``EXEC`` (one round trip), or drop them."""
        link = self._link
        try:
            if not ok or not self._pending:
                if self._watched:
                    link.unwatch = True  # sent in front of the link's next call
                return
            self._commit(link)
        finally:
            self._d._release(link)

    def _commit(self, link: _Link) -> None:
        d = self._d
        commands: list[tuple[Any, ...]] = [("MULTI",)]
        added: dict[bytes, list[Any]] = {}
        removed: dict[bytes, list[bytes]] = {}
        deleted: list[bytes] = []
        big = False  # only then is the encoding worth splitting around values
        for (space, raw), value in self._pending.items():
            name, index = d.name(space, raw), d.index[space]
            if value is DELETED:
                deleted.append(name)
                removed.setdefault(index, []).append(raw)
            else:
                commands.append(("SET", name, value))
                added.setdefault(index, []).extend((0, raw))
                big = big or len(value) > BIG_ARG
        if deleted:
            commands.append(("DEL", *deleted))
        for index, members in removed.items():
            commands.append(("ZREM", index, *members))
        for index, scored in added.items():
            commands.append(("ZADD", index, *scored))
        commands.append(("EXEC",))
        replies = link.call(commands, big=big)
        for reply in replies[:-1]:
            if isinstance(reply, Exception):  # refused while queueing, e.g. OOM
                raise _error(reply, d.where)
        result = replies[-1]
        if result is None:
            raise RetryableError(f"{d.where}: write conflict (a watched key changed)")
        if isinstance(result, Exception):
            raise _error(result, d.where)
        for reply in result:
            if isinstance(reply, Exception):
                raise _error(reply, d.where)


class RedisDriver(Driver):
    """Driver for Redis; see the module docstring."""

    schemes = ("redis", "rediss", "unix")
    remote = True
    batched = True
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
        self._local = threading.local()
        self._closed = False
        try:
            # Bounded timeouts: a FUSE call must fail (EIO) rather than hang on a dead server.
            tcp = {"socket_keepalive": True} if parts.scheme != "unix" else {}
            # RESP2 unless the URL asks otherwise: no push messages among the replies, and the
            # links parse it with hiredis directly (see _Link).
            self.pool = redis.ConnectionPool.from_url(
                client_url, socket_connect_timeout=10, socket_timeout=120, protocol=2, **tcp
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

    # -- connections --------------------------------------------------------------------------
    def _acquire(self) -> _Link:
        """The calling thread's link, or a link of its own for a transaction started while the
        thread's link is in use (a one-shot helper called inside a transaction)."""
        if self._closed:
            raise UnavailableError(f"{self.where}: the driver is closed")
        link = getattr(self._local, "link", None)
        if link is not None and not link.busy and link.usable():
            link.busy = True
            return link
        if link is not None and link.busy:
            extra = _Link(self)
            extra.busy = True
            extra.extra = True
            return extra
        if link is not None:
            self._drop(link)
        link = _Link(self)
        link.busy = True
        self._local.link = link
        return link

    def _release(self, link: _Link) -> None:
        link.busy = False
        if link.extra:
            if link.unwatch and not link.broken:
                try:
                    link.call([])  # sends the owed UNWATCH
                except BackendError:
                    pass
            if link.broken:
                link.conn.disconnect()
            link.pool.release(link.conn)
        elif link.broken:
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        if getattr(self._local, "link", None) is link:
            self._local.link = None
        if link.generation != _fork_generation:
            return  # the parent process's socket: leave it to the parent
        try:
            link.close()
        except Exception:  # noqa: BLE001 - a dead connection may fail to close cleanly
            pass

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
    def _begin(self, write: bool) -> RedisTxn:
        return RedisTxn(self, write)

    def _oneshot(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        link = self._acquire()
        try:
            return link.checked(commands)
        finally:
            self._release(link)

    # One-shot reads: one round trip on the thread's link, no transaction object.
    def get(self, key: str, space: str = DATA) -> bytes | None:
        """One-shot ``GET``."""
        name = self.name(space, encode_key(key))
        return self._oneshot([("GET", name)])[0]

    def size(self, key: str, space: str = DATA) -> int | None:
        """One-shot ``EXISTS`` + ``STRLEN`` in one ``MULTI``."""
        name = self.name(space, encode_key(key))
        exists, size = self._oneshot([("MULTI",), ("EXISTS", name), ("STRLEN", name), ("EXEC",)])[-1]
        return size if exists else None

    def read(self, key: str, offset: int, length: int, space: str = DATA) -> bytes | None:
        """One-shot ``EXISTS`` + ``GETRANGE`` in one ``MULTI``."""
        name = self.name(space, encode_key(key))
        if length <= 0:
            return b"" if self._oneshot([("EXISTS", name)])[0] else None
        exists, data = self._oneshot(
            [("MULTI",), ("EXISTS", name), ("GETRANGE", name, offset, offset + length - 1), ("EXEC",)]
        )[-1]
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
        """Close the connection pool (and with it every thread's link)."""
        self._closed = True
        self.pool.disconnect()

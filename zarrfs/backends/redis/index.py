"""The Redis driver's listing index: a sorted set of the keys per space, its upkeep, and a
transaction's scans that read it (:class:`IndexScans`); see ``zarrfs.backends.redis.driver``."""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import redis

from ..base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    VALUES,
    BackendError,
    Fetch,
    MissingDatabaseError,
    RetryableError,
    Space,
)
from ..buffered import DELETED, merge_buffered
from .link import translated
from .url import KeyNames

log = logging.getLogger("zarrfs.backends.redis")

COMPLETE = b""  # index member meaning "this index lists every data key"
BATCH = 1000  # index members read per ZRANGEBYLEX
SCAN_COUNT = 10000  # keys asked of each SCAN, and added to the index per ZADD
RECHECKS = 5  # index reads again when a batch's keys moved while it was read (renames)
VALUE_BATCH = 16  # values per first MGET: values can be many MiB each
VALUE_BYTES = 4 << 20  # MGET batches grow while the values they return stay below this
_GLOB_SPECIAL = b"*?[]\\"
#: A transaction's ``_query(names, *commands)`` (see :meth:`IndexScans.scan`).
Query = Callable[..., list[Any]]


def _glob_escape(raw: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in raw)


def scan_keyspace(client: redis.Redis, keys: KeyNames, where: str) -> Iterator[bytes]:
    """Yield the data keys (without prefix) found by ``SCAN MATCH {prefix}:*`` (string keys
    only; ``SCAN`` may repeat a key). ``where`` names the database in messages."""
    match = _glob_escape(keys.data_prefix) + b"*"
    cut = len(keys.data_prefix)
    with translated(where):
        for name in client.scan_iter(match=match, count=SCAN_COUNT, _type="string"):
            yield name[cut:]


def has_index(client: redis.Redis, keys: KeyNames, where: str) -> bool:
    """Whether the data index is complete (a build that was cut short leaves it incomplete)."""
    with translated(where):
        return client.zscore(keys.index[DATA], COMPLETE) is not None


def hierarchy_exists(client: redis.Redis, keys: KeyNames, where: str) -> bool:
    """Whether the prefix holds a hierarchy: an index of either space, or a data key (a
    ``RedisStore`` database that has no index yet). A typo of the prefix holds none."""
    with translated(where):
        if client.exists(keys.index[DATA], keys.index[SIDE]):
            return True
        match = _glob_escape(keys.data_prefix) + b"*"
        return next(iter(client.scan_iter(match=match, count=SCAN_COUNT)), None) is not None


def check_exists(client: redis.Redis, keys: KeyNames, where: str, create: bool) -> None:
    """Refuse a prefix that holds no hierarchy unless ``create`` (``-o create``): nothing is
    written for a typo."""
    if not create and not hierarchy_exists(client, keys, where):
        raise MissingDatabaseError(
            f"{where}: no hierarchy with this prefix (no key {keys.prefix}:*): check the prefix, "
            "or mount with -o create to start one"
        )


def ensure_index(client: redis.Redis, keys: KeyNames, where: str, readonly: bool) -> bool:
    """Whether the data index is complete, rebuilding it when it is not (unless ``readonly``)."""
    if has_index(client, keys, where):
        return True
    if readonly:
        log.warning("%s: no key index and opened read-only: every listing scans the keyspace (zarrfs "
                    "reindex URL builds the index once)", where)
        return False
    log.info("%s: no key index: building it from the keyspace (zarrfs reindex shows its progress)", where)
    reindex(client, keys, where, prune=False)
    return True


#: ``report(stage, count, total)``: ``count`` more keys done in ``stage`` ("indexing": keys
#: found by the scan of the keyspace; "pruning": index entries checked, of ``total``).
Report = Callable[[str, int, "int | None"], None]


def reindex(
    client: redis.Redis, keys: KeyNames, where: str, prune: bool = True, report: Report | None = None
) -> int:
    """Add every ``{prefix}:*`` string key to the index (keys another client such as
    ``RedisStore`` wrote), then, with ``prune``, drop entries whose key is gone. Returns the
    number of keys found. Safe while other writers run. Holds a batch of keys at a time, not
    the keyspace (a ``SCAN`` cursor, then ranges of the index), whatever its size."""
    index = keys.index[DATA]
    found = 0
    batch: list[bytes] = []
    with translated(where):
        for member in scan_keyspace(client, keys, where):
            batch.append(member)
            if len(batch) >= SCAN_COUNT:
                client.zadd(index, dict.fromkeys(batch, 0))
                found += len(batch)
                if report is not None:
                    report("indexing", len(batch), None)
                batch = []
        if batch:
            client.zadd(index, dict.fromkeys(batch, 0))
            found += len(batch)
            if report is not None:
                report("indexing", len(batch), None)
        if prune:
            _prune(client, index, keys.data_prefix, report)
        client.zadd(index, {COMPLETE: 0})
    try:  # the running mounts' feeds: list what was indexed now
        client.publish(keys.reindexed, b"1")
    except (redis.RedisError, OSError) as exc:  # an ACL without PUBLISH: the index is right all the same
        log.info("%s: the mounts were not told of the new index (%s): they see it at a remount", where, exc)
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


# A batch of index members and what each key holds, read at one point in time (one round trip,
# and no rename can land between the range's read and the keys'): the whole batch's length and
# last member (where the next batch starts), then each member whose key exists, with its size
# when ARGV[5] is "1" (STRLEN; EXISTS tells an empty value from a missing key) or its value
# when "2" (side records only: small).
_EXISTING = """
local batch = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {#batch, batch[#batch] or false}
local fetch = ARGV[5]
for _, m in ipairs(batch) do
    local name = ARGV[4] .. m
    if fetch == '2' then
        local value = redis.call('GET', name)
        if value then
            out[#out + 1] = m
            out[#out + 1] = value
        end
    elseif redis.call('EXISTS', name) == 1 then
        out[#out + 1] = m
        if fetch == '1' then out[#out + 1] = redis.call('STRLEN', name) end
    end
end
return out
"""
_FETCH_FLAGS = {KEYS: b"0", SIZES: b"1", VALUES: b"2"}
#: Error replies of a server that runs no script for this client (an ACL without
#: ``@scripting``, a proxy without ``EVAL``, a replica that takes no ``EVAL``): its scans read
#: the range, then the keys.
_NO_SCRIPTS = ("NOPERM", "ERR unknown command", "NOSCRIPT", "READONLY")


def _prune(client: redis.Redis, index: bytes, data_prefix: bytes, report: Report | None) -> None:
    script = client.register_script(_PRUNE)
    total = client.zcard(index)
    low = b"("
    while True:
        batch = client.zrangebylex(index, low, b"+", start=0, num=BATCH)
        if not batch:
            return
        script(keys=[index], args=[data_prefix, *batch])
        if report is not None:
            report("pruning", len(batch), total)
        low = b"(" + batch[-1]


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


def _still_moving() -> RetryableError:
    """A batch whose keys kept moving (renames) through every read again of its range: the
    transaction runs again rather than list a moved key under neither of its names."""
    return RetryableError("a batch of keys kept moving while it was listed; read again")


def _within(members: list[bytes], lo: bytes, hi: bytes | None) -> Iterator[tuple[bytes, None]]:
    i = bisect.bisect_left(members, lo)
    j = len(members) if hi is None else bisect.bisect_left(members, hi)
    return ((m, None) for m in members[i:j])


class IndexScans:
    """The scans of one transaction (``RedisTxn``): ranges of the index, the keys in them
    checked for existence (or sized, or fetched), merged with the transaction's pending writes.

    In a read-only transaction it keeps, per space, the last range of the index a KEYS scan read
    and the keys in it that exist (a window), which answers a scan inside that range again (the
    check of a listed key for children of the same name lands there) without a round trip, and
    how far paging through a range reads ahead.

    A batch is read by one script (``_EXISTING``: the range and its keys at one point in time)
    where the server runs it for this client; else by the range, then its keys, read again when
    a rename moved keys in between (``RECHECKS``)."""

    def __init__(
        self,
        keys: KeyNames,
        write: bool,
        keyspace: Callable[[], Iterator[bytes]] | None,
        scripts: list[bool] | None = None,
    ) -> None:
        """``keyspace``: the data keys found by scanning the keyspace, when there is no data
        index to read (read-only); None when there is. ``scripts``: the driver's one-item
        list saying whether its server runs the scans' script (set to False when refused)."""
        self._keys = keys
        self.write = write
        self._keyspace = keyspace
        self._scripts = scripts if scripts is not None else [False]
        self._windows: dict[Space, tuple[Any, ...]] = {}
        self._ahead: dict[Space, int] = {}

    def scan(
        self,
        lo: bytes,
        hi: bytes | None,
        space: Space,
        fetch: Fetch,
        limit: int | None,
        writes: dict[tuple[Space, bytes], Any],
        query: Query,
    ) -> Iterator[tuple[bytes, Any]]:
        """The transaction's ``_scan`` (see ``Txn``): ``writes`` are its own, not yet sent;
        ``query(names, *commands)`` its replies to ``commands``, ``names`` watched first in a
        write transaction. (Given per scan, not kept: the transaction keeps this object.)"""
        pending = sorted(
            (raw, v)
            for (sp, raw), v in writes.items()
            if sp is space and raw >= lo and (hi is None or raw < hi)
        )
        mine = [
            (raw, v if v is DELETED else None if fetch is KEYS else len(v) if fetch is SIZES else bytes(v))
            for raw, v in pending
        ]
        hidden = sum(1 for _, v in pending if v is DELETED)
        first = BATCH if limit is None else min(BATCH, limit + hidden + 1)
        window = self._windows.get(space) if fetch is KEYS and not self.write else None
        if window is None:
            stored = self._stored(query, space, lo, hi, fetch, first)
        elif _covers(window, lo, hi):
            stored = _within(window[4], lo, hi)
        elif _continues(window, lo):
            # Paging through a range (a listing): the rest of the window, then read ahead,
            # more each time, in fewer round trips than the pages.
            start, included, end, end_included, members = window
            ahead = min(BATCH, 2 * self._ahead.get(space, first))
            self._ahead[space] = ahead
            head = _within(members, lo, end + b"\0" if end_included else end)
            rest = self._stored(query, space, end, hi, fetch, ahead, after=end_included)
            stored = itertools.chain(head, rest)
        else:
            stored = self._stored(query, space, lo, hi, fetch, first)
        yield from merge_buffered(stored, mine, None) if mine else stored

    def _members(
        self, query: Query, space: Space, lo: bytes, hi: bytes | None, first: int, after: bool = False
    ) -> Iterator[tuple[list[bytes], Any]]:
        """Yield batches of index members in ``[lo, hi)`` (``(lo, hi)`` with ``after``), in
        order, each with the range of the index it covers (``None`` when not known):
        ``(start, start included, end, end included)``, ``end`` None for no bound."""
        index = self._keys.index[space]
        if space is DATA and self._keyspace is not None:
            # Read-only and no index to read: list the whole keyspace (slow, but correct).
            members = [
                m
                for m in self._keyspace()
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
            (batch,) = query([index], ("ZRANGEBYLEX", index, low, high, "LIMIT", 0, n))
            if len(batch) < n:
                yield batch, (start, included, hi, False)
                return
            yield batch, (start, included, batch[-1], True)
            low = b"(" + batch[-1]
            start, included = batch[-1], False
            n = BATCH

    def _by_script(self, space: Space, fetch: Fetch) -> bool:
        """Whether a scan of ``space`` for ``fetch`` reads by the ``_EXISTING`` script: names;
        in a read-only transaction sizes and the side records' values too (small: markers,
        entries). A write transaction WATCHes the keys whose sizes or values it reads, which a
        script cannot do."""
        if not self._scripts[0] or (space is DATA and self._keyspace is not None):
            return False
        return fetch is KEYS or (not self.write and (fetch is SIZES or space is not DATA))

    def _script(self, space: Space, low: bytes, high: bytes, n: int, fetch: Fetch) -> tuple[Any, ...]:
        """The ``_EXISTING`` call for ``n`` members of ``space``'s index in ``[low, high]``
        (``ZRANGEBYLEX`` bounds)."""
        index = self._keys.index[space]
        return ("EVAL", _EXISTING, 1, index, low, high, n, self._keys.name(space, b""), _FETCH_FLAGS[fetch])

    def first_call(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None) -> Any:
        """The call a read-only transaction's first :meth:`scan` with these arguments sends,
        or None when it sends none of its own (a window answers) or not by script."""
        if self.write or not self._by_script(space, fetch):
            return None
        if fetch is KEYS and space in self._windows:
            return None
        first = BATCH if limit is None else min(BATCH, limit + 1)
        low = b"[" + lo if lo else b"("
        return self._script(space, low, b"(" + hi if hi is not None else b"+", first, fetch)

    def _scripted(
        self, query: Query, space: Space, lo: bytes, hi: bytes | None, fetch: Fetch, first: int, after: bool
    ) -> Iterator[tuple[bytes, Any]]:
        """:meth:`_stored` by the ``_EXISTING`` script: one round trip a batch, the range and
        its keys read at one point in time."""
        index = self._keys.index[space]
        paired = fetch is not KEYS  # members come with their sizes or values
        low = b"(" + lo if after or not lo else b"[" + lo  # "(" + "" skips the COMPLETE marker
        high = b"(" + hi if hi is not None else b"+"
        start, included = lo, not after
        n = first
        while True:
            (reply,) = query([index], self._script(space, low, high, n, fetch))
            count, last, rest = reply[0], reply[1], reply[2:]
            done = count < n
            covered = (start, included, hi, False) if done else (start, included, last, True)
            if paired:
                found = list(zip(rest[0::2], rest[1::2], strict=True))
            else:
                found = [(m, None) for m in rest]
                if not self.write:
                    self._windows[space] = (*covered, [m for m, _ in found])
            yield from found
            if done:
                return
            low = b"(" + last
            start, included = last, False
            n = BATCH

    def _reread(self, query: Query, space: Space, covered: Any) -> list[bytes] | None:
        """The index members of a batch's range ``covered`` (see :meth:`_members`), read again;
        None when the range is not known."""
        if covered is None:
            return None
        start, included, end, end_included = covered
        index = self._keys.index[space]
        low = b"[" + start if included and start else b"(" + start
        high = b"+" if end is None else (b"[" if end_included else b"(") + end
        (members,) = query([index], ("ZRANGEBYLEX", index, low, high))
        return members

    def _stored(
        self,
        query: Query,
        space: Space,
        lo: bytes,
        hi: bytes | None,
        fetch: Fetch,
        first: int,
        after: bool = False,
    ) -> Iterator[tuple[bytes, Any]]:
        """Index members that still exist (a stale entry, whose key another writer deleted, is
        dropped: found by one multi-key ``EXISTS`` per batch, or with the sizes or values;
        names and sizes by one script a batch where the server runs it)."""
        if self._by_script(space, fetch):
            scripted = self._scripted(query, space, lo, hi, fetch, first, after)
            try:
                head = next(scripted, None)
            except BackendError as exc:
                if not any(refusal in str(exc) for refusal in _NO_SCRIPTS):
                    raise
                log.info("no scripts for this client; listings read keys after their ranges: %s", exc)
                self._scripts[0] = False
            else:
                if head is not None:
                    yield head
                    yield from scripted
                return
        value_batch = VALUE_BATCH
        for batch, covered in self._members(query, space, lo, hi, first, after):
            if not batch:
                if covered is not None and fetch is KEYS and not self.write:
                    self._windows[space] = (*covered, batch)
                continue
            names = [self._keys.name(space, m) for m in batch]
            if fetch is KEYS:
                # One EXISTS counts the batch's keys that exist: all of them, but for stale entries.
                (count,) = query([], ("EXISTS", *names))
                for left in range(RECHECKS, -1, -1):
                    if count == len(names):
                        break
                    # A key missing may be a stale entry, or a rename committed between the two
                    # reads (read committed): then the index moved too, and is read again.
                    again = self._reread(query, space, covered)
                    if again is None or again == batch:
                        break
                    if not left:
                        raise _still_moving()
                    batch, names = again, [self._keys.name(space, m) for m in again]
                    (count,) = query([], ("EXISTS", *names)) if names else (0,)
                if count != len(names):
                    found = query([], *(("EXISTS", n) for n in names))
                    batch = [m for m, e in zip(batch, found, strict=True) if e]
                if covered is not None and not self.write:
                    self._windows[space] = (*covered, batch)
                yield from ((m, None) for m in batch)
            elif fetch is SIZES:
                for left in range(RECHECKS, -1, -1):
                    sizes = query(names, *(("STRLEN", n) for n in names))
                    # STRLEN is 0 for a missing key and for an empty value alike: ask EXISTS for those.
                    zero = [i for i, s in enumerate(sizes) if s == 0]
                    if zero:
                        exists = query([], *(("EXISTS", names[i]) for i in zero))
                        for i, e in zip(zero, exists, strict=True):
                            if not e:
                                sizes[i] = None
                    again = self._reread(query, space, covered) if None in sizes else None
                    if again is None or again == batch:
                        break
                    if not left:
                        raise _still_moving()
                    batch, names = again, [self._keys.name(space, m) for m in again]  # keys moved
                yield from ((m, s) for m, s in zip(batch, sizes, strict=True) if s is not None)
            else:
                i, left = 0, RECHECKS
                while i < len(names):
                    part = names[i : i + value_batch]
                    (values,) = query(part, ("MGET", *part))
                    if None in values:
                        again = self._reread(query, space, covered)
                        if again is not None and again != batch:  # keys moved: go on from here
                            if not left:
                                raise _still_moving()
                            left -= 1
                            done = batch[i - 1] if i else None
                            batch = [m for m in again if done is None or m > done]
                            names, i = [self._keys.name(space, m) for m in batch], 0
                            continue
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

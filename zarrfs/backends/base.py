"""The driver interface: the smallest transactional key/value API the filesystem needs.

Its contract, checked by :class:`zarrfs.testing.DriverConformance`: two key spaces
(:class:`Space`), ``DATA`` holding the Zarr keys and values exactly as zarr-python 2's stores do,
``SIDE`` the filesystem's bookkeeping, which those never list or delete (side data is advisory and
never makes a Zarr key appear). Keys are ``str``, stored and ordered as UTF-8 (an empty or
unencodable one is :class:`InvalidKeyError`); values are any buffer (an ``mmap`` is not copied),
read back as ``bytes``. All access goes through a :class:`Txn` of :meth:`Driver.transact` (or the
one-shot helpers): it sees its own writes, commits when the function returns, keeps nothing when
it raises, and reruns the function on retryable failures (bounded, jittered back-off), so it must
have no side effects. ``scan`` yields ``(key, None | size | value)`` in key order; errors are the
classes of ``errors`` (errno in ``zarrfs.fs.errors``). As in JuiceFS's ``tkv``, :class:`Txn`'s
public methods check everything once and call the byte-level ``_get``, ``_put``, ``_delete``,
``_scan`` (optionally ``_size``, ``_read``, ``_has_prefix``, ``_read_many``) a driver implements
with :meth:`Driver._begin`; :meth:`Driver.transact` is the one retry loop.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from .checks import (
    DATA,
    KEYS,
    OWN_SPACES,
    PARTS,
    READS,
    SIDE,
    SIZES,
    SPACES,
    VALUES,
    Fetch,
    Get,
    HasPrefix,
    Read,
    Size,
    Space,
    as_buffer,
    bytes_stop,
    check_fetch,
    check_space,
    encode_bound,
    encode_key,
    legacy_read,
    prefix_stop,
)
from .errors import (
    BackendError,
    DriverNotFoundError,
    GuessedWrongError,
    InterruptedCallError,
    InvalidKeyError,
    KeyTooLongError,
    MissingDatabaseError,
    ReadOnlyError,
    RetryableError,
    StalledError,
    StorageFullError,
    UnavailableError,
    ValueTooLargeError,
)

log = logging.getLogger("zarrfs.backends")

T = TypeVar("T")
#: Bytes a transaction may put and still use a driver's reserve on a full store.
RESERVE_FOR = 64 << 10
#: Seconds a transaction retries (a conflict, a moving slot, a busy database) before it says so, once.
RETRY_TELL = 1.0

#: Seconds a call may wait on a server by default (``-o timeout=``).
DEFAULT_TIMEOUT = 10.0

# The names drivers and callers import from here (defined in .checks and .errors).
__all__ = [
    "DATA",
    "OWN_SPACES",
    "PARTS",
    "DEFAULT_TIMEOUT",
    "KEYS",
    "SIDE",
    "SIZES",
    "VALUES",
    "BackendError",
    "Driver",
    "DriverNotFoundError",
    "Fetch",
    "Get",
    "GuessedWrongError",
    "HasPrefix",
    "InterruptedCallError",
    "InvalidKeyError",
    "KeyTooLongError",
    "MissingDatabaseError",
    "Read",
    "ReadOnlyError",
    "RetryableError",
    "Size",
    "Space",
    "StalledError",
    "StorageFullError",
    "Txn",
    "UnavailableError",
    "ValueTooLargeError",
    "as_buffer",
    "bytes_stop",
    "check_fetch",
    "check_space",
    "encode_bound",
    "encode_key",
    "prefix_stop",
]


# -- transactions ----------------------------------------------------------------------------------


class Txn(ABC):
    """One transaction: reads see the transaction's own writes; see the module docstring.

    The public methods check their arguments and call the driver's byte-level primitives (the
    ``_`` methods), which may then assume a valid ``bytes`` key, a :class:`Space`, a write
    transaction for writes and a non-empty scan range."""

    #: Largest value in bytes the database holds in one record (None: no limit of its own),
    #: and what that limit is, for the message of :class:`ValueTooLargeError`.
    max_value: int | None = None
    value_limit = ""
    #: The key spaces the primitives receive: PARTS folded into SIDE, unless a driver keeps
    #: them apart (``OWN_SPACES``).
    spaces: dict[Any, Space] = SPACES
    most_reads: int | None = None  # reads one _read_many call takes at most (None: any number)
    #: Bytes this write transaction put: a small one (deletes, a truncation, attributes) may
    #: use the room a driver keeps in reserve on a full disk (see :meth:`Driver.transact`).
    put_bytes = 0
    _after: list[Callable[[], Any]] | None = None  # see after_commit
    _notes: dict[str, Any] | None = None  # see notes

    def __init__(self, write: bool, where: str, max_key: int | None = None) -> None:
        #: Whether this transaction may write.
        self.write = write
        #: The database, as messages name it.
        self.where = where
        #: Longest key in UTF-8 bytes the database holds (None: no limit).
        self.max_key = max_key

    def after_commit(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` once this write transaction has committed (a read transaction: now).
        What a caller learns from a run's reads (a cache) may be kept only if the run commits:
        a run may read what changes before its commit, or take answers its commit checks
        (Redis), and a run that fails is run again."""
        if not self.write:
            fn()
            return
        if self._after is None:
            self._after = []
        self._after.append(fn)

    @property
    def notes(self) -> dict[str, Any]:
        """Scratch space of the layers above, for this run of the transaction only (what they
        found in it that a later step of the same run may use)."""
        if self._notes is None:
            self._notes = {}
        return self._notes

    # -- the public API: checks, then a primitive ---------------------------------------------------
    # get and size run on every lookup: their checks are inlined (the same as encode_key and
    # check_space, which they fall back on to raise).
    def get(self, key: str, space: Space = DATA) -> bytes | None:
        """Return the value of ``key``, or ``None`` when it does not exist."""
        sp = self.spaces.get(space) or check_space(space, self.spaces)
        try:
            raw = key.encode("utf-8")
        except UnicodeEncodeError:
            raw = b""
        if not raw or (self.max_key is not None and len(raw) > self.max_key):
            encode_key(key, self.max_key)  # raises
        return self._get(raw, sp)

    def size(self, key: str, space: Space = DATA) -> int | None:
        """Return the length of the value of ``key`` (``None`` if absent), without fetching it
        where the database allows."""
        sp = self.spaces.get(space) or check_space(space, self.spaces)
        try:
            raw = key.encode("utf-8")
        except UnicodeEncodeError:
            raw = b""
        if not raw or (self.max_key is not None and len(raw) > self.max_key):
            encode_key(key, self.max_key)  # raises
        return self._size(raw, sp)

    def read(self, key: str, offset: int, length: int, space: Space = DATA) -> bytes | None:
        """Return ``length`` bytes of the value of ``key`` from ``offset`` (fewer at its end)."""
        raw, sp = encode_key(key, self.max_key), check_space(space, self.spaces)
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        return self._read(raw, offset, max(length, 0), sp)

    def exists(self, key: str, space: Space = DATA) -> bool:
        """Return whether ``key`` exists."""
        return self.size(key, space) is not None

    def put(self, key: str, value: Any, space: Space = DATA) -> None:
        """Set ``key`` to the bytes of ``value`` (any buffer-protocol object). The caller
        leaves ``value`` unchanged until the transaction ends: a driver may send it then."""
        raw, sp = encode_key(key, self.max_key), check_space(space, self.spaces)
        if not self.write:
            raise ReadOnlyError("write in a read-only transaction")
        buf = as_buffer(value)
        size = len(buf)
        limit = self.max_value
        if limit is not None and size > limit:
            # Checked before anything is sent: a server would refuse it, or reset the link.
            raise ValueTooLargeError(
                f"{key}: {size} bytes, above the limit of {limit} bytes ({self.value_limit})"
            )
        self.put_bytes += size
        self._put(raw, buf, sp)

    def delete(self, key: str, space: Space = DATA) -> None:
        """Remove ``key``; removing a missing key is not an error."""
        raw, sp = encode_key(key, self.max_key), check_space(space, self.spaces)
        if not self.write:
            raise ReadOnlyError("write in a read-only transaction")
        self._delete(raw, sp)

    def scan(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: Space = DATA,
        fetch: Fetch = KEYS,
        limit: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(key, x)`` for ``start <= key < stop`` in key order (``stop=None``: no bound);
        ``x`` is ``None``, the size or the value according to ``fetch``; at most ``limit``.
        A stored key that is not UTF-8 (no Zarr key, and no API call could address it) is
        skipped with a warning."""
        sp, mode = check_space(space, self.spaces), check_fetch(fetch)
        lo = encode_bound(start)
        hi = None if stop is None else encode_bound(stop)
        if limit is not None:
            if not isinstance(limit, int):
                raise TypeError(f"limit must be an int, not {type(limit).__name__}")
            if limit <= 0:
                return iter(())
        if hi is not None and hi <= lo:
            return iter(())
        if limit is not None and not self.write:  # nothing writes between pulls: read it at once
            return iter(self._decoded_rows(lo, hi, sp, mode, limit))
        return self._decoded(self._scan(lo, hi, sp, mode, limit), limit)

    def scan_ahead(
        self,
        start: str = "",
        stop: str | None = None,
        *,
        space: Space = DATA,
        fetch: Fetch = KEYS,
        limit: int | None = None,
    ) -> None:
        """A :meth:`scan` this transaction is about to make, with these arguments: a driver
        whose reads cost a round trip may send its first batch with the next reads it sends,
        whatever they are (a listing's scans with its folder's probe). A hint: what the scan
        answers is the same."""
        sp, mode = check_space(space, self.spaces), check_fetch(fetch)
        lo = encode_bound(start)
        hi = None if stop is None else encode_bound(stop)
        if (limit is None or limit > 0) and (hi is None or hi > lo):
            self._scan_ahead(lo, hi, sp, mode, limit)

    def scan_prefix(self, prefix: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """``scan`` of exactly the keys that start with ``prefix``."""
        return self.scan(prefix, prefix_stop(prefix), **kwargs)

    def get_many(self, keys: Sequence[str]) -> list[Any]:
        """The values of the data ``keys`` (None where absent), read together by :meth:`read_many`."""
        return self.read_many([Get(k) for k in keys])

    def read_many(self, requests: Sequence[Read], apart: bool = False) -> list[Any]:
        """Answer several independent reads together: one round trip where the database is
        remote. Each request is a :class:`Size`, :class:`Get` or :class:`HasPrefix`; the
        answers come in the same order (the older ``(op, key, space)`` tuples, with ``op``
        ``"size"``, ``"get"`` or ``"prefix"``, are read as those). ``apart``: each answer need
        agree only with itself, not with the transaction's other reads (a listing's nodes: a
        readdir is atomic with nothing), so a database without a read snapshot need not check
        them against later changes (:meth:`_read_apart`)."""
        # A lookup makes five of these: encode_key and check_space inlined (as in get), each
        # called only to raise.
        max_key, spaces = self.max_key, self.spaces
        plan: list[tuple[type, bytes, Space]] = []
        append = plan.append
        for request in requests:
            kind = type(request)
            if kind not in READS:
                request = legacy_read(request)
                kind = type(request)
            key, space = request
            try:
                raw = key.encode("utf-8")
            except (UnicodeEncodeError, AttributeError):
                raw = b""
            if not raw or (max_key is not None and len(raw) > max_key):
                raw = encode_key(key, max_key)  # raises
            try:
                sp = spaces[space]
            except (KeyError, TypeError):
                sp = check_space(space, spaces)  # raises
            append((kind, raw, sp))
        step = self.most_reads
        if not plan:
            return []
        read = self._read_apart if apart else self._read_many
        if not step or len(plan) <= step:
            return read(plan)
        # A long batch (a deep path's) goes in pieces.
        return [a for i in range(0, len(plan), step) for a in read(plan[i : i + step])]

    def _decoded_rows(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int) -> list:
        """A read transaction's :meth:`scan` with a limit (every listing's, store's and
        probe's), as one list: the driver's rows (:meth:`_scan_rows`) decoded in one
        comprehension, with no generator between the cursor and the caller. A key that is not
        UTF-8 is skipped, and as many rows after the batch are read in its place."""
        out: list[tuple[str, Any]] = []
        while True:
            want = limit - len(out)
            rows = self._scan_rows(lo, hi, space, fetch, want)
            try:
                out += [(raw.decode("utf-8"), x) for raw, x in rows]
            except UnicodeDecodeError:
                out += self._decoded(iter(rows), None)
            if len(rows) < want or len(out) >= limit:
                return out
            lo = bytes(rows[-1][0]) + b"\0"

    def _decoded(self, rows: Iterator[tuple[bytes, Any]], limit: int | None) -> Iterator[tuple[str, Any]]:
        count = 0
        try:
            for raw, x in rows:
                try:
                    key = raw.decode("utf-8")
                except UnicodeDecodeError:
                    log.warning("%s: skipping key %r, which is not valid UTF-8", self.where, raw)
                    continue
                yield key, x
                count += 1
                if limit is not None and count >= limit:
                    return
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()  # now, not when collected: a driver's cursor is released at once

    # -- the primitives a driver implements ----------------------------------------------------------
    @abstractmethod
    def _get(self, raw: bytes, space: Space) -> bytes | None:
        """The value of ``raw`` or ``None``."""

    @abstractmethod
    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        """Set ``raw`` (a write transaction; ``value`` stays unchanged until it ends)."""

    @abstractmethod
    def _delete(self, raw: bytes, space: Space) -> None:
        """Remove ``raw`` if present (a write transaction)."""

    @abstractmethod
    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        """Yield ``(raw key, x)`` for ``lo <= key < hi`` (``hi`` None: no bound, otherwise
        above ``lo``) in byte order, this transaction's own writes included. ``limit`` is how
        many the caller wants at most, for sizing reads ahead; a caller that skips a key that
        is not UTF-8 pulls more, so yield as long as pulled. The caller may write between two
        pulls."""

    # -- optional fast paths -----------------------------------------------------------------------
    def _scan_rows(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int) -> list:
        """Up to ``limit`` rows of :meth:`_scan` as a list, in a read transaction (nothing
        writes meanwhile): a driver whose cursor steps in C reads them in one loop."""
        rows = self._scan(lo, hi, space, fetch, limit)
        try:
            return list(itertools.islice(rows, limit))
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()

    def _scan_ahead(  # noqa: B027 - a hint, nothing by default
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> None:
        """:meth:`_scan` with these arguments comes next (checked by :meth:`scan_ahead`)."""

    def _size(self, raw: bytes, space: Space) -> int | None:
        """The size of ``raw``'s value or ``None``; by default from the value."""
        value = self._get(raw, space)
        return None if value is None else len(value)

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        """``length`` bytes of ``raw``'s value from ``offset`` (``length`` >= 0, ``offset``
        >= 0), or ``None``; by default from the value."""
        value = self._get(raw, space)
        return None if value is None else bytes(value[offset : offset + length])

    def _has_prefix(self, raw: bytes, space: Space) -> bool:
        """Whether a key (one that is UTF-8) starts with ``raw``; by default a scan."""
        rows = self._scan(raw, bytes_stop(raw), space, KEYS, 1)
        try:
            for key, _ in rows:
                try:
                    key.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # not a key to the API: scan skips it, so must this
                return True
            return False
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        """Answer checked requests ``(Size | Get | HasPrefix, raw key, space)`` in order; by
        default one by one. Override where a batch costs about one read."""
        out: list[Any] = []
        for kind, raw, space in plan:
            if kind is Size:
                out.append(self._size(raw, space))
            elif kind is Get:
                out.append(self._get(raw, space))
            else:
                out.append(self._has_prefix(raw, space))
        return out

    def _read_apart(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        """:meth:`_read_many` of reads that need agree only each with itself (``read_many``'s
        ``apart``); the same where every read of a transaction sees one snapshot."""
        return self._read_many(plan)


# -- drivers ---------------------------------------------------------------------------------------


class Holding(Protocol):
    """A driver's keeper of values read in place (:attr:`Driver.holder`, ``heldvalues``)."""

    #: Values smaller than this are copied at once, never held.
    smallest: int

    def hold(
        self, fn: Callable[[Txn, Callable[[str], Any]], tuple[T, Any]], begin: bool = False
    ) -> tuple[T, Any]:
        """Run ``fn(txn, view)`` in a read transaction; ``(result, the value kept)``.
        ``begin``: ``fn`` will most likely read a value, so a transaction that would begin only
        at its second statement (running its first again: SQLite's) may begin before its first."""
        ...


class Driver(ABC):
    """A key/value database seen through the :class:`Txn` API.

    Subclasses implement :meth:`_begin`, returning a :class:`Txn` subclass that implements the
    byte-level primitives. ``retryable`` failures are raised as :class:`RetryableError`;
    drivers translate their database's own errors into the classes of this module.
    """

    # What the driver is and can do, declared here with the defaults of a plain driver, so
    # that callers read them directly (its URL and files are declared in its package's
    # ``about`` module, which the registry reads before this class is imported).

    #: The longest key, in UTF-8 bytes, the database holds (None: no limit): the mount
    #: refuses a longer path (``ENAMETOOLONG``) before it makes it.
    max_key_size: int | None = None
    #: Whether another open may use the database while one writes it (DBM: one writer and no
    #: reader beside it; a second open is refused with :class:`BackendError`).
    shared = True
    #: Values read in place (``heldvalues``): an object whose ``hold(fn)`` runs ``fn(txn,
    #: view)`` in a read transaction it may keep open (see :class:`Holding`); None: values are
    #: copied out, and kept as copies.
    holder: Holding | None = None
    #: Whether :meth:`snapshot` holds a committed state for ``-o snapshot``.
    snapshots = False
    #: Whether the driver keeps a listing index of its own that other clients of the database
    #: do not keep up (Redis's sorted set): its class takes ``build_index=`` (False: leave a
    #: missing index alone) and :meth:`reindex` rebuilds it.
    keeps_index = False
    #: Whether its class takes ``create=``: False (no ``-o create``) refuses a database that is
    #: not there (a server's table or prefix) rather than making it.
    takes_create = False
    #: Whether the database keeps versions a mount commits to by hand (:meth:`commit`).
    versioned = False
    #: Whether reads cost a round trip to a server (callers then batch what they can).
    remote = False
    #: Whether one :meth:`Txn.read_many` costs about one read however many it holds (a round
    #: trip, one SQL statement): then callers ask for what they may need in one batch rather
    #: than in steps that stop early.
    batched = False
    #: Whether a scan's sizes (``SIZES``) read none of the values it passes, so that a listing
    #: may take the sizes of every key a scan passes, deep keys of subfolders too (LMDB: a
    #: size is read from the key's leaf node).
    scan_sizes_free = False
    #: Whether the change feed tells of a commit before the committing client hears it
    #: answered (Redis pushes invalidations first): then what a mount read ahead, dropped when
    #: the feed names it, is as new as a read at open would be, and it reads ahead by default.
    feed_before_reply = False
    #: Files larger than this many bytes are best stored in parts (``PARTS``) on this
    #: database, whatever the mount's ``-o parts_above=`` (None: the mount decides); a Redis
    #: Cluster spreading a hierarchy over its masters parts every chunk.
    parts_above: int | None = None
    #: How often :meth:`transact` runs a function that keeps failing with ``RetryableError``
    #: at least; under contention it goes on retrying for :attr:`retry_for` seconds (None: the
    #: :attr:`timeout`), so a busy machine slows conflicting writers down instead of failing them.
    max_attempts = 10
    retry_for: float | None = None
    #: First back-off in seconds; doubles each attempt, with full jitter.
    backoff = 0.005

    #: Seconds a call may wait on a server before it fails with :class:`StalledError`
    #: (``-o timeout=``): the request loop is one thread, so this bounds how long a stalled
    #: server holds every other request. Drivers of local files have nothing to wait for.
    timeout: float = DEFAULT_TIMEOUT
    #: What a driver waiting on a server polls besides its socket: an object with ``fileno()``
    #: (readable when requests arrive), ``check()`` (raises :class:`InterruptedCallError`
    #: when the request being served was interrupted) and ``serve_waiting()`` (answers the
    #: requests that need no write); see ``zarrfs.fuse.interrupts``.
    watch: Any = None
    #: Transactions begun by :meth:`transact`, reading and writing (``zarrfs status``).
    reads = 0
    writes = 0

    def __init__(self, url: str, readonly: bool = False) -> None:
        self.url = url
        self.readonly = readonly

    def waiting_for_writer(self) -> None:
        """Called between looks while a write waits for a lock another program holds
        (``writer_wait``): the mount answers what needs no write meanwhile."""
        self.serve_meanwhile()

    def serve_meanwhile(self) -> None:
        """Called between the steps of long work outside a transaction (a wait for a lock
        another program holds, the parts of a large file): the mount answers the requests that
        need no write and are not about the file being served (``zarrfs.fuse.interrupts``)."""
        if self.watch is not None:
            self.watch.serve_waiting()

    def pause(self, seconds: float) -> None:
        """Sleep between attempts (with several request threads, others run meanwhile)."""
        if self.watch is not None:
            self.watch.sleep(seconds)
        else:
            time.sleep(seconds)

    def set_timeout(self, seconds: float) -> None:
        """Bound every later wait on the server to ``seconds`` (a remote driver also applies
        it to the connections it holds)."""
        self.timeout = seconds

    @abstractmethod
    def _begin(self, write: bool) -> AbstractContextManager[Txn]:
        """Return a context manager yielding a :class:`Txn` that commits on a normal exit and
        rolls back when the block raises (a :class:`Txn` may be its own)."""

    def transact(self, fn: Callable[[Txn], T], write: bool = True) -> T:
        """Run ``fn(txn)`` in one transaction and return its result; commit on success, roll
        back on error, rerun on :class:`RetryableError` with jittered back-off, at least
        :attr:`max_attempts` times and for up to :attr:`timeout` seconds."""
        if write and self.readonly:
            raise ReadOnlyError(f"{self.url} is opened read-only")
        if write:
            self.writes += 1
            if self.watch is not None:
                self.watch.before_write()  # a request let in beside a commit waits for it to end
        else:
            self.reads += 1
        delay = self.backoff
        attempt = 1
        span = self.timeout if self.retry_for is None else self.retry_for
        give_up = time.monotonic() + span
        txn: Txn | None = None
        freed = told = False
        while True:
            try:
                with self._begin(write) as txn:
                    result = fn(txn)
                after = txn._after
                if after:  # committed: what the run learnt from its reads holds
                    txn._after = None
                    for later in after:
                        later()
                return result
            except GuessedWrongError:
                attempt += 1  # nothing was written: again at once, reading
                if attempt > self.max_attempts:
                    raise
                continue
            except RetryableError as exc:
                now = time.monotonic()
                if attempt >= self.max_attempts and now >= give_up:
                    raise
                if not told and now - (give_up - span) >= RETRY_TELL:  # one line, not one a retry
                    told = True
                    # The error names its database (never the URL here: a server's may hold a password).
                    log.warning("%s; trying again for up to %g s (-o timeout=)", exc, span)
            except StorageFullError as exc:
                if self.make_room(exc):
                    continue  # a map grown, say: at once, and as often as it can grow
                # Cleanup must stay possible on a full store: a small transaction (an unlink,
                # a truncation) may use the room kept in reserve, once.
                if freed or txn is None or txn.put_bytes > RESERVE_FOR or not self.free_reserve():
                    raise
                freed = True
                log.warning("%s: full; the room kept in reserve for removals is used", self.url)
                continue
            self.pause(random.uniform(0, delay))
            delay = min(delay * 2, 0.5)
            attempt += 1

    # One-shot helpers: each is one transaction.
    def get(self, key: str, space: Space = DATA) -> bytes | None:
        """One-shot :meth:`Txn.get`."""
        return self.transact(lambda t: t.get(key, space), write=False)

    def size(self, key: str, space: Space = DATA) -> int | None:
        """One-shot :meth:`Txn.size`."""
        return self.transact(lambda t: t.size(key, space), write=False)

    def read(self, key: str, offset: int, length: int, space: Space = DATA) -> bytes | None:
        """One-shot :meth:`Txn.read`."""
        return self.transact(lambda t: t.read(key, offset, length, space), write=False)

    def put(self, key: str, value: Any, space: Space = DATA) -> None:
        """One-shot :meth:`Txn.put`."""
        self.transact(lambda t: t.put(key, value, space))

    def delete(self, key: str, space: Space = DATA) -> None:
        """One-shot :meth:`Txn.delete`."""
        self.transact(lambda t: t.delete(key, space))

    def scan(self, start: str = "", stop: str | None = None, **kwargs: Any) -> list[tuple[str, Any]]:
        """One-shot :meth:`Txn.scan`, returned as a list (bound it with ``limit``)."""
        return self.transact(lambda t: list(t.scan(start, stop, **kwargs)), write=False)

    def make_room(self, exc: BaseException) -> bool:
        """Make room for a transaction that failed with ``exc`` (a :class:`StorageFullError`)
        where the database can grow, such as LMDB's map; whether it may run again. Never by
        default."""
        return False

    def free_reserve(self) -> bool:
        """Free room kept in reserve so that removals succeed on a full store; whether any
        was freed (then the failed transaction runs again). None by default."""
        return False

    # -- the change feed (optional): what other writers changed ----------------------------------
    #: Seconds between two looks at :meth:`changes` while the daemon is idle; a driver whose
    #: feed wakes the daemon through :meth:`feed_fileno` is looked at when that fd is readable.
    feed_interval = 0.02

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other writers (other mounts, other processes, this process's other drivers)
        committed since the cursor ``since``: ``(cursor, records)``, ``records`` being the
        ``(space, key)`` pairs they changed, or None: something changed, not known what (the
        caller rescans what it caches). ``since=None`` starts: the current cursor and ``[]``.
        This driver's own commits are left out. Drivers without a feed raise
        :class:`NotImplementedError` (the mount then keeps short cache times)."""
        raise NotImplementedError

    def feed_fileno(self) -> int | None:
        """A descriptor that becomes readable when :meth:`changes` has something (a socket the
        database pushes to), or None: the feed is polled every :attr:`feed_interval`."""
        return None

    def sync(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Make every committed transaction durable (``fsync`` of a file calls this).

        Drivers may commit without forcing data to disk (as zarr-python's ``LMDBStore`` does) as
        long as a crash of the process never corrupts the database; this is the barrier."""

    def statfs(self) -> dict[str, int] | None:
        """Return ``{"total": bytes, "free": bytes}`` for the storage behind the database, or
        ``None`` when it cannot be known."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release the database; the driver is unusable afterwards."""

    # -- optional features, each with its declaration above ---------------------------------------
    def snapshot(self, name: str | None) -> Any:
        """Hold the state committed now (``name``: join the state of that name), as a
        ``snapshot.HeldState``; drivers that declare :attr:`snapshots`."""
        raise NotImplementedError(f"{type(self).__name__} holds no state (snapshots = False)")

    def reindex(self, prune: bool = True, report: Any = None) -> int:
        """Rebuild the listing index from the database's keys (``prune``: drop entries of keys
        that are gone; ``report``: told each stage's progress); the number of keys indexed.
        Drivers that declare :attr:`keeps_index`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no index (keeps_index = False)")

    def commit(self, message: str, rebase: bool = False, branch: str | None = None) -> dict[str, Any]:
        """Commit what the mount wrote as a new version (``zarrfs commit``); what was committed.
        Drivers that declare :attr:`versioned`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no versions (versioned = False)")

    def version(self) -> dict[str, Any] | None:
        """The version of the database served (a branch, a held snapshot) for ``zarrfs
        status``; None: the newest, always."""
        return None

    def expires_in(self) -> float | None:
        """Seconds until the driver stops serving (a held snapshot's limit); None: never."""
        return None

    def usage(self) -> dict[str, Any]:
        """What a server's database holds (keys, memory) for ``zarrfs status``; a file
        database's size is read from its files."""
        return {}

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

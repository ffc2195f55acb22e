"""Redis driver: ``redis://[:password@]host:port/db?prefix=zarr``, ``rediss://...``,
``unix:///path/to/sock?db=0&prefix=zarr``, ``valkey://``/``valkeys://``; the TLS options and
``client_name`` go to redis-py (``url.REDIS_PY_OPTIONS``), any other is refused. Redis Cluster:
``redis_cluster``.

Keys (``url.KeyNames``): data ``{prefix}:{key}``, as ``RedisStore`` writes them; side values
``zarrfs.side.{prefix}:{key}``; per space a sorted-set index (``zarrfs.index.{prefix}``,
``zarrfs.sideindex.{prefix}``, scores 0, read with ``ZRANGEBYLEX``) updated in the data's
``MULTI``/``EXEC``, so a listing touches only the keys it returns. The index's empty member marks
it complete; without it (a ``RedisStore`` database) it is rebuilt with ``SCAN`` (``index``). Keys
``RedisStore`` deletes leave stale entries (scans drop them, :meth:`RedisDriver.reindex` prunes
them, a ``read_many`` prefix read trusts them); keys it adds list once ``reindex`` or a writable
mount's change feed (``feed``) indexes them. A write transaction ``WATCH``es what it reads (the
index when it scans), buffers its writes and commits them in one ``MULTI``/``EXEC`` (``commit``);
a conflict is :class:`RetryableError`. Redis has no read snapshot, so a read transaction of
several round trips watches the keys and records it reads too (not the index, nor reads made
``apart``: a listing of many pages may see a folder change, as readdir may, and each listed
name's node is read in one pipeline): its first read goes unwatched (a transaction of one
round trip, nearly every lookup and open, sends no ``WATCH`` and owes no ``UNWATCH``); its
second watches the first's keys with its own and reads the first's again behind that
``WATCH``, and it ends with an empty ``MULTI``/``EXEC``: a key changed between its reads (a
first read answered otherwise the second time, or the check failing) fails it with
:class:`RetryableError` and it runs again, so a lookup of a hard link (three round trips)
never sees half a commit. (redis-server
compares each name a ``WATCH`` adds with every one the connection watches: a transaction that
watched each of a folder's 20,000 names paid seconds of the server's time.) One connection
per thread, replies parsed by hiredis (``link``): a read or batch is one round trip, a commit
one more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..base import (
    DATA,
    BackendError,
    Driver,
    Fetch,
    GuessedWrongError,
    HasPrefix,
    RetryableError,
    Size,
    Space,
    Txn,
    bytes_stop,
)
from ..buffered import DELETED
from ..guesses import Reading, run_again
from .about import ABOUT
from .commit import commit, guessed, guesses_for
from .feed import RedisFeed
from .guesses import MEMBERS, Guesses, Taken
from .index import IndexScans, Report, check_exists, ensure_index, has_index, reindex, scan_keyspace
from .link import (
    BIG_ARG,
    SPIN,
    Link,
    Links,
    bulk_limit,
    open_pool,
    set_pool_timeout,
    translate,
    translated,
)
from .url import KeyNames, check_db, check_query, parse_url

log = logging.getLogger("zarrfs.backends.redis")
__all__ = ["SPIN", "RedisDriver", "RedisTxn"]


class RedisTxn(Txn):
    """An optimistic transaction; see the module docstring. Also its own context manager:
    leaving the block commits, or drops the writes when the block raised."""

    value_limit = "Redis's proto-max-bulk-len"

    def __init__(self, driver: RedisDriver, write: bool) -> None:
        super().__init__(write, driver.where)
        self.max_value = driver.max_value
        self._d = driver
        self._keys = driver.key_names
        self._link = driver._acquire(write)
        self._pending: dict[tuple[Space, bytes], Any] = {}
        self._watched: set[bytes] = set()
        # Write transactions: values already read. They are WATCHed, so they stay right until
        # EXEC (or EXEC fails and the transaction runs again): a second read costs nothing.
        self._seen: dict[tuple[Space, bytes], bytes | None] = {}
        keyspace = None if driver.indexed else driver.scan_keyspace
        self._scans = IndexScans(self._keys, write, keyspace, driver.scripts)
        # Scans announced by scan_ahead: their calls, sent with the next query, and replies.
        self._queued: list[tuple[Any, ...]] = []
        self._early: dict[tuple[Any, ...], Any] = {}
        #: Called once the next query is sent, before its replies are read (``Link.call``).
        self._alongside: Callable[[], Any] | None = None
        # Queries with watched reads sent: a read transaction of several is checked at its end.
        self._round_trips = 0
        self._apart = False  # reading for _read_apart: nothing watched
        # A read transaction's watched queries, ``(names, commands)``; when one fails its
        # check, the next run reads them first in one MULTI/EXEC (see :meth:`_replayed`).
        self._asked: list[tuple[list[bytes], tuple[tuple[Any, ...], ...]]] = []
        self._replay = None if write else driver.replay.take()
        self._answers: dict[tuple[Any, ...], Any] | None = None
        # A read transaction's first watched read, sent unwatched: ``(names, commands,
        # replies)`` until a second one watches its names and checks its replies (:meth:`_ask`).
        self._first: tuple[list[bytes], tuple[tuple[Any, ...], ...], list[Any]] | None = None
        # A write transaction's reads answered from what the mount last saw (``guesses``),
        # checked by its commit; none in a run after a wrong guess.
        guesses = driver.guesses
        self._taken: Taken | None = None
        if write and guesses is not None and not driver.reading.take() and guesses.wanted():
            self._taken = Taken()

    def __enter__(self) -> RedisTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        taken = self._taken
        if taken and isinstance(exc, Exception) and not isinstance(exc, BackendError):
            self.finish(False)  # nothing was sent
            raise run_again(self.where, exc, self._d.reading) from exc
        self.finish(exc_type is None)

    # -- reads ------------------------------------------------------------------------------
    def _watch(self, names: list[bytes]) -> list[tuple[Any, ...]]:
        """The WATCH command to send before reading ``names``: a read transaction leaves out the
        listing index (see the module docstring)."""
        watched = self._watched
        if self.write:
            fresh = [n for n in names if n not in watched]
        else:
            fresh = [n for n in names if n not in watched and n not in self._keys.indexes]
        if not fresh:
            return []
        self._watched.update(fresh)
        return [("WATCH", *fresh)]

    def _query(self, names: list[bytes], *commands: tuple[Any, ...], wide: bool = False) -> list[Any]:
        """Replies to ``commands``, ``names`` watched: a write transaction's from what the mount
        saw when it can (``guesses``), else the server's, kept for later guesses. ``wide``: a
        prefix read may return more members than it asks for (``_read_many``'s, which needs
        one not hidden): it asks for :data:`MEMBERS`, which a removal of the first leaves
        known."""
        if self._apart:
            names = []
        taken = self._taken
        if taken is not None and names and not self._queued:
            answers = taken.answer(self._d.guesses, commands)  # type: ignore[arg-type]
            if answers is not None:
                alongside, self._alongside = self._alongside, None
                if alongside is not None:
                    alongside()
                return answers
        guesses = self._d.guesses
        if guesses is None:
            return self._ask(names, commands)
        if wide:
            commands = tuple(
                (*c[:6], MEMBERS) if c[0] == "ZRANGEBYLEX" and c[6] < MEMBERS else c for c in commands
            )
        replies = self._ask(names, commands)
        guesses.learn(commands, replies)
        return replies

    def _ask(self, names: list[bytes], commands: tuple[tuple[Any, ...], ...]) -> list[Any]:
        """The server's replies to ``commands``, ``names`` watched (see :meth:`_watch`)."""
        if not self.write and names:
            self._asked.append((names, commands))
            if self._replay is not None:
                self._replayed()
            answers = self._answers
            if answers is not None and all(c in answers for c in commands):
                return self._answered(commands)
        alongside, self._alongside = self._alongside, None
        # A read transaction's first watched read watches nothing: alone, it needs no check.
        # Its next one watches the first's names too and reads them again behind the WATCH.
        first = not self.write and names and not self._round_trips
        before = None if first or not names else self._first
        again: list[tuple[Any, ...]] = []
        if first:
            watch = []
        elif before is not None:
            self._first = None
            watch = self._watch([*before[0], *names])
            again = list(before[1])
        else:
            watch = self._watch(names)
        if not watch and not first and self._early and len(commands) == 1 and commands[0] in self._early:
            if alongside is not None:
                alongside()
            reply = self._early.pop(commands[0])  # sent ahead (scan_ahead)
            if isinstance(reply, Exception):
                raise translate(reply, self._d.where)
            return [reply]
        if names:
            self._round_trips += 1
        sent = [*watch, *again, *commands]
        if self._queued:
            queued, self._queued = [q for q in self._queued if q not in commands], []
            replies = self._link.call([*sent, *queued], alongside=alongside)[len(watch) :]
            asked = len(again) + len(commands)
            self._early.update(zip(queued, replies[asked:], strict=True))
            replies = replies[:asked]
            for reply in replies:
                if isinstance(reply, Exception):
                    raise translate(reply, self._d.where)
        else:
            replies = self._link.checked(sent, alongside)[len(watch) :]
        if before is not None:
            if replies[: len(again)] != before[2]:
                raise self._read_again("a key read changed before the next read")
            return replies[len(again) :]
        if first:
            self._first = (names, commands, list(replies))
        return replies

    def _replayed(self) -> None:
        """The run after a failed check: the reads the failed run made are made first, in one
        ``MULTI``/``EXEC`` (one commit's state, whatever commits meanwhile), and their names
        are watched from there; the queries this run repeats are answered from them, so a
        read that writers keep changing under it still ends (it would be checked and fail
        again, run after run, if it read them in several round trips once more)."""
        replay, self._replay = self._replay, None
        commands = list(dict.fromkeys(c for _, cmds in replay for c in cmds))
        names = list(dict.fromkeys(n for ns, _ in replay for n in ns if n not in self._keys.indexes))
        replies = self._link.call([("MULTI",), *commands, ("EXEC",), ("WATCH", *names)])
        self._round_trips += 1
        self._watched.update(names)
        got = replies[len(commands) + 1]
        if isinstance(got, Exception):
            raise translate(got, self._d.where)
        self._answers = dict(zip(commands, got, strict=True))

    def _answered(self, commands: tuple[tuple[Any, ...], ...]) -> list[Any]:
        """Replies to ``commands`` from the reads :meth:`_replayed` made."""
        alongside, self._alongside = self._alongside, None
        if alongside is not None:
            alongside()
        assert self._answers is not None
        replies = [self._answers[c] for c in commands]
        for reply in replies:
            if isinstance(reply, Exception):
                raise translate(reply, self._d.where)
        return replies

    def _scan_ahead(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None) -> None:
        # The scan's first script call goes with the next query (a read-only transaction).
        call = self._scans.first_call(lo, hi, space, fetch, limit)
        if call is not None and call not in self._early:
            self._queued.append(call)

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        # This transaction's pending write, if any, answers.
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else bytes(pending)
        if (space, raw) in self._seen:
            return self._seen[(space, raw)]
        name = self._keys.name(space, raw)
        value = self._query([name], ("GET", name))[0]
        if self.write:
            self._seen[(space, raw)] = value
        return value

    def _size(self, raw: bytes, space: Space) -> int | None:
        # STRLEN; EXISTS tells an empty value from an absent one.
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else len(pending)
        name = self._keys.name(space, raw)
        exists, size = self._query([name], ("EXISTS", name), ("STRLEN", name))
        return size if exists else None

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        pending = self._pending.get((space, raw))
        if pending is not None:
            return None if pending is DELETED else bytes(pending[offset : offset + length])
        name = self._keys.name(space, raw)
        if length == 0:
            return b"" if self._query([name], ("EXISTS", name))[0] else None
        exists, data = self._query([name], ("EXISTS", name), ("GETRANGE", name, offset, offset + length - 1))
        return data if exists else None

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        # All the reads in one pipeline (one round trip), in a write transaction too: the names
        # read (the index, for a prefix) are WATCHed in the same pipeline, and this
        # transaction's pending writes answer or correct what the server says. A prefix read
        # takes the first index entry in the range, skipping as many more as there are pending
        # deletes in it; a pending put in the range answers it without the server.
        keys = self._keys
        pending = self._pending
        commands: list[tuple[Any, ...]] = []
        names: list[bytes] = []
        # per request: (0, answer) | (1, reply index[, seen key]) | (2, reply index, hidden)
        plan_out: list[tuple[Any, ...]] = []
        gets: list[bytes] = []
        for kind, raw, space in plan:
            if kind is not HasPrefix:
                name = keys.name(space, raw)
                mine = pending.get((space, raw)) if pending else None
                if mine is None and (space, raw) in self._seen:
                    mine = self._seen[(space, raw)]
                    mine = DELETED if mine is None else mine
                if mine is not None:
                    if mine is DELETED:
                        plan_out.append((0, None))
                    else:
                        plan_out.append((0, len(mine) if kind is Size else bytes(mine)))
                    continue
                names.append(name)
                if kind is Size:
                    plan_out.append((1, len(commands)))
                    commands += [("EXISTS", name), ("STRLEN", name)]
                else:  # every GET of the plan goes in one MGET, at the end
                    plan_out.append((3, len(gets), (space, raw)))
                    gets.append(name)
                continue
            if space is DATA and not self._d.indexed:
                return super()._read_many(plan)
            hidden: set[bytes] = set()
            if pending:
                put = False
                for (sp, r), v in pending.items():
                    if sp is space and r.startswith(raw):
                        if v is DELETED:
                            hidden.add(r)
                        else:
                            put = True
                            break
                if put:
                    plan_out.append((0, True))
                    continue
            index = keys.index[space]
            names.append(index)
            hi = bytes_stop(raw)
            high = b"(" + hi if hi is not None else b"+"
            plan_out.append((2, len(commands), hidden))
            commands.append(("ZRANGEBYLEX", index, b"[" + raw, high, "LIMIT", 0, 1 + len(hidden)))
        if gets:  # a lone GET stays one: its large value is received straight (link)
            commands.append(("MGET", *gets) if len(gets) > 1 else ("GET", gets[0]))
        replies = self._query(names, *commands, wide=True) if commands else []
        got = (replies[-1] if len(gets) > 1 else replies[-1:]) if gets else []
        out: list[Any] = []
        for step in plan_out:
            if step[0] == 0:
                out.append(step[1])
                continue
            if step[0] == 3:
                out.append(got[step[1]])
                if self.write:
                    self._seen[step[2]] = got[step[1]]
                continue
            i = step[1]
            if commands[i][0] == "EXISTS":
                out.append(replies[i + 1] if replies[i] else None)
            else:
                out.append(any(m not in step[2] for m in replies[i]))
        return out

    def _read_apart(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        if self.write:  # a write transaction's reads are checked by its commit
            return self._read_many(plan)
        self._apart = True
        try:
            return self._read_many(plan)
        finally:
            self._apart = False

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        query = self._query if self.write else self._query_unwatched
        return self._scans.scan(lo, hi, space, fetch, limit, self._pending, query)

    def _query_unwatched(self, names: list[bytes], *commands: tuple[Any, ...]) -> list[Any]:
        """A read transaction's scan query: what a listing reads is not watched."""
        return self._query([], *commands)

    # -- writes (buffered until commit) -----------------------------------------------------
    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        # Not copied when large: it stays unchanged until the transaction ends (see Txn.put),
        # and a chunk of MiB is sent from the caller's buffer.
        self._pending[(space, raw)] = value if len(value) > BIG_ARG else bytes(value)

    def _delete(self, raw: bytes, space: Space) -> None:
        self._pending[(space, raw)] = DELETED

    # -- commit -------------------------------------------------------------------------------
    def finish(self, ok: bool) -> None:
        """Commit the buffered writes in one ``MULTI``/``EXEC`` (one round trip), or drop them;
        with the checks of guessed answers, as one script (even with nothing to write)."""
        link = self._link
        try:
            if ok and self._taken:
                self._commit(link)
                return
            if not ok or not self._pending:
                if ok and not self.write and self._watched and self._round_trips > 1:
                    self._check_unchanged(link)
                elif self._watched:
                    link.unwatch = True  # sent in front of the link's next call
                return
            self._commit(link)
        finally:
            self._d._release(link)

    def _check_unchanged(self, link: Link) -> None:
        """End a read transaction of several round trips: an empty ``MULTI``/``EXEC`` fails
        (nil) when a key it read changed since it watched it, and it runs again."""
        reply = link.call([("MULTI",), ("EXEC",)])[-1]
        if isinstance(reply, Exception):
            raise translate(reply, self.where)
        if reply is None:
            raise self._read_again("a key read changed before the last read")

    def _read_again(self, what: str) -> RetryableError:
        """A read transaction that saw a key change between its round trips: its next run
        reads what this one asked first, in one ``MULTI``/``EXEC`` (:meth:`_replayed`)."""
        self._d.replay.keep(self._asked)
        return RetryableError(f"{self.where}: {what}; read again")

    def _commit(self, link: Link) -> None:
        """Send the buffered writes (see ``commit``), with the checks of guessed answers when
        any was taken: a wrong one is a :class:`GuessedWrongError`, and the next run reads."""
        guesses, taken = self._d.guesses, self._taken
        if guesses is None or not taken:
            commit(link, self._pending, self._keys, self.where, guesses)
            return
        try:
            held = guessed(link, self._pending, self._keys, self.where, guesses, taken)
        except BaseException:
            self._d.reading.keep()
            raise
        if not held:
            guesses.missed(taken)
            self._d.reading.keep()
            raise GuessedWrongError(f"{self.where}: a guessed read was wrong; read again")
        guesses.held()


class Replay(threading.local):
    """Per thread, the reads of the last read transaction that failed its check, for the
    transaction's next run (see :meth:`RedisTxn._replayed`); forgotten when another starts."""

    asked: list | None = None

    def keep(self, asked: list) -> None:
        self.asked = asked

    def take(self) -> list | None:
        asked, self.asked = self.asked, None
        return asked


class RedisDriver(Driver):
    """Driver for Redis; see the module docstring."""

    remote = True
    batched = True
    feed_before_reply = True
    # Optimistic transactions conflict more often than lock-based ones.
    max_attempts = 25
    keeps_index = True  # the sorted set a RedisStore client does not keep up
    takes_create = True
    #: What write transactions may take without reading (``guesses``); None: they read.
    guesses: Guesses | None = None

    def __init__(
        self, url: str, readonly: bool = False, build_index: bool = True, create: bool = True
    ) -> None:
        """``build_index``: rebuild a missing or incomplete key index now, as the first
        writable open of a ``RedisStore`` database does (False: leave it to :meth:`reindex`).
        ``create`` False (no ``-o create``): a prefix that holds no hierarchy is refused."""
        super().__init__(url, readonly)
        parsed = parse_url(url)
        self.prefix = parsed.prefix
        self.where = parsed.where(parsed.prefix)
        self.key_names = KeyNames(parsed.prefix)
        #: Whether the server runs the listing's script (``redis.index``); False once refused.
        self.scripts = [True]
        if any(k in ("spread", "spread_above") for k, _ in parsed.query):
            raise BackendError(f"{self.where}: spread=1 spreads a hierarchy over the masters of a Redis"
                               " Cluster: use a redis+cluster:// URL, or drop spread=1")
        check_query(parsed, ABOUT.options)
        check_db(parsed)
        self.replay = Replay()
        self.reading = Reading()
        self._links = Links(self)
        self.feed: RedisFeed | None = None  # started by the first changes() (a mount's)
        try:
            self.pool, self.client = open_pool(parsed, self.timeout)
        except Exception as exc:
            raise translate(exc, self.where) from exc
        try:
            check_exists(self.client, self.key_names, self.where, create)
        except BaseException:
            self.pool.disconnect()
            raise
        if build_index:
            self.indexed = ensure_index(self.client, self.key_names, self.where, self.readonly)
        else:
            self.indexed = has_index(self.client, self.key_names, self.where)
        self.max_value = bulk_limit(self.client)
        if not self.readonly:
            self.guesses = guesses_for(self.client, self.where)

    def set_timeout(self, seconds: float) -> None:
        """Bound the waits of later calls, and of the connections held now, to ``seconds``."""
        super().set_timeout(seconds)
        set_pool_timeout(self.pool, seconds)

    def _acquire(self, write: bool = True) -> Link:
        """The link for a transaction (see :meth:`Links.acquire`); the writing link is tracked
        into the change feed once one is started (see :meth:`RedisFeed.enlist`)."""
        link = self._links.acquire(write)
        if write and self.feed is not None:
            try:
                self.feed.enlist(link)
            except BaseException:
                self._release(link)
                raise
        return link

    def track_now(self) -> None:
        """Have this thread's link track into the change feed now (the server reports to the
        feed only once a connection tracks into it). A link from before a restart fails: a new
        one is made."""
        for attempt in (1, 2):
            try:
                self._release(self._acquire())
                return
            except BackendError as exc:
                if attempt == 2:
                    raise
                log.debug("%s: %s", self.where, exc)

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other clients changed since the last call (see ``feed``); the first call starts
        the feed (NotImplementedError where the server has no ``CLIENT TRACKING``). The cursor
        only counts calls: the server pushes."""
        if self.feed is None:
            try:
                self.feed = RedisFeed(self)
            except BackendError as exc:
                log.warning("%s: no change feed (CLIENT TRACKING needs Redis 6): %s", self.where, exc)
                raise NotImplementedError from exc
            self.track_now()
        if since is None:
            self.feed.changes()  # nothing from before counts
            return 0, []
        changed = self.feed.changes()
        guesses = self.guesses
        if guesses is not None and changed != []:
            if changed is None:
                guesses.clear()
            else:
                raws = [(space, key.encode("utf-8", "surrogateescape")) for space, key in changed]
                names, index = self.key_names.name, self.key_names.index
                guesses.forget([names(space, raw) for space, raw in raws],
                               [(index[space], raw) for space, raw in raws if space in index])
        return since + 1, changed

    def feed_fileno(self) -> int | None:
        """The feed connection's socket (readable when the server pushed changes)."""
        return None if self.feed is None else self.feed.fileno()

    def _release(self, link: Link) -> None:
        self._links.release(link)

    def _oneshot(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        link = self._acquire()
        try:
            return link.checked(commands)
        finally:
            self._release(link)

    def scan_keyspace(self):
        """The data keys found by ``SCAN MATCH {prefix}:*`` (see ``index``)."""
        return scan_keyspace(self.client, self.key_names, self.where)

    def usage(self) -> dict[str, Any]:
        """The server's keys and memory (an error, one line, when it does not answer)."""
        try:
            memory = self.client.info("memory")
            return {"keys": self.client.dbsize(), "used_memory": memory.get("used_memory")}
        except Exception as exc:  # the server is down: say so, the status still answers
            return {"error": str(exc)}

    def reindex(self, prune: bool = True, report: Report | None = None) -> int:
        """Add every ``{prefix}:*`` string key to the index (keys another client such as
        ``RedisStore`` wrote), then, with ``prune``, drop entries whose key is gone. Returns the
        number of keys found. Safe while other writers run; ``report`` is told the progress
        (see ``index.reindex``)."""
        found = reindex(self.client, self.key_names, self.where, prune, report)
        self.indexed = True
        return found

    def _begin(self, write: bool) -> RedisTxn:
        return RedisTxn(self, write)

    def transact(self, fn: Callable[[Txn], Any], write: bool = True) -> Any:
        """:meth:`Driver.transact`; a read's first run replays no earlier one's reads."""
        self.replay.asked = None
        return super().transact(fn, write)

    def statfs(self) -> dict[str, int] | None:
        """``maxmemory`` (or the server's RAM when unlimited) and what ``used_memory`` leaves."""
        with translated(self.where):
            info = self.client.info("memory")
        total = int(info.get("maxmemory") or 0) or int(info.get("total_system_memory") or 0)
        if not total:
            return None
        return {"total": total, "free": max(0, total - int(info.get("used_memory") or 0))}

    def close(self) -> None:
        """Close the connection pool (and with it every thread's link)."""
        self._links.closed = True
        if self.feed is not None:
            self.feed.close()
        self.pool.disconnect()

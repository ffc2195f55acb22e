"""Redis Cluster driver: ``redis+cluster://[user[:password]@]host:port,host:port/?prefix=zarr``
(``rediss+cluster://`` over TLS, ``valkey+cluster://``); the hosts are where the slot map is read.

A cluster has no transaction across slots, so every key of a hierarchy carries the prefix as its
hash tag: the Redis driver's layout with the prefix in braces (``{<prefix>}:<key>``,
``zarrfs.side.{<prefix>}:<key>``, ``zarrfs.index.{<prefix>}``, ``zarrfs.sideindex.{<prefix>}``).
A prefix that holds a tag already (``{zarr}``, ``run{7}``) is used as it is, so
``RedisStore(prefix="{zarr}")`` shares the keys of ``?prefix=zarr``. Transactions, index and round
trips are the Redis driver's, over per-thread links to the master owning the slot: one hierarchy
is bounded by one master. ``?spread=1`` gives the parts (``PARTS``: every chunk above
``?spread_above=``) hash tags of their own, over every master, while each commit stays one
``MULTI``/``EXEC`` on the home slot (``spread``): parts never change and only a commit names them.
``MOVED``, ``ASK``, ``CLUSTERDOWN`` or ``TRYAGAIN`` reread the slot map and retry (``ASK`` is not
followed: the retry waits for the migration). A lost master fails the call (``UnavailableError``,
EIO) and marks the map stale, so the next transaction goes to the promoted replica.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import unquote

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import URL_QUERY_ARGUMENT_PARSERS

from ..base import (
    DATA,
    KEYS,
    OWN_SPACES,
    PARTS,
    SIZES,
    BackendError,
    Driver,
    Fetch,
    Get,
    RetryableError,
    Size,
    Space,
    UnavailableError,
    bytes_stop,
)
from ..buffered import DELETED
from ..guesses import Reading
from ..redis.commit import guesses_for
from ..redis.driver import RedisDriver, RedisTxn, Replay
from ..redis.index import check_exists, ensure_index, has_index
from ..redis.link import Link, Links, handshake_options, translate
from ..redis.url import TLS_OPTIONS, KeyNames, check_db, check_query, is_tls, parse_url
from .about import ABOUT
from .feed import ClusterFeed
from .spread import SpreadParts

__all__ = ["RedisClusterDriver", "hash_tagged"]

log = logging.getLogger("zarrfs.backends.redis")
T = TypeVar("T")

# Error replies that mean "this slot is not (or not only) here now": route again and retry.
_REROUTE = re.compile(r"(?:^|: )(MOVED|ASK|CLUSTERDOWN|TRYAGAIN)\b")
#: Seconds an open waits on a cluster that is down or moving its slot before it says so (once).
TELL_AFTER = 0.5
_MOVING = (redis.exceptions.ClusterDownError, redis.exceptions.MovedError, redis.exceptions.AskError)


def hash_tag(name: str) -> str | None:
    """The hash tag Redis Cluster hashes ``name`` by: the text between the first ``{`` and the
    first ``}`` after it, when that is not empty; ``None`` when the whole name is hashed."""
    start = name.find("{")
    if start < 0:
        return None
    end = name.find("}", start + 1)
    return name[start + 1 : end] if end > start + 1 else None


def _flag(query: list[tuple[str, str]], name: str, where: str) -> bool:
    """A yes/no URL option (1/0, true/false, yes/no); absent: no."""
    values = [v for k, v in query if k == name]
    if not values:
        return False
    value = values[-1].lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise BackendError(f"{where}: {name}={values[-1]!r}: give 1 or 0")


def _number(query: list[tuple[str, str]], name: str, default: int, where: str) -> int:
    """A whole-number URL option of bytes (``K``, ``M``, ``G`` suffixes allowed)."""
    values = [v for k, v in query if k == name]
    if not values:
        return default
    text = values[-1].strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        number = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        number = -1
    if number < 0:
        raise BackendError(f"{where}: {name}={values[-1]!r}: give a number of bytes, such as 64K")
    return number


def hash_tagged(prefix: str) -> str:
    """The prefix as keys carry it: as given when it holds a hash tag, else in braces. Anything
    appended to it (``:key``) then never changes the tag, whatever the key holds."""
    if hash_tag(prefix) is not None:
        return prefix
    tagged = "{" + prefix + "}"
    if hash_tag(tagged) is None:  # empty, or starting with "}": no tag can be made of it
        raise ValueError(f"prefix {prefix!r} cannot be made a Redis Cluster hash tag")
    return tagged


class RedisClusterTxn(RedisTxn):
    """A :class:`RedisTxn` whose failures caused by the slot map (a moved slot, a dead master)
    mark the driver's route stale; those of a moved slot are retried. On a spread hierarchy
    (``?spread=1``) its ``PARTS`` reads and writes go to the parts' own slots (``spread``):
    part writes before the home commit, part deletes after it."""

    _d: RedisClusterDriver

    def __init__(self, driver: RedisClusterDriver, write: bool) -> None:
        super().__init__(driver, write)
        self._spread = driver.spread
        self._parts: dict[bytes, Any] = {}
        if self._spread is not None:
            self.spaces = OWN_SPACES

    def _query(self, names: list[bytes], *commands: tuple[Any, ...], wide: bool = False) -> list[Any]:
        try:
            return super()._query(names, *commands, wide=wide)
        except BackendError as exc:
            raise self._d.rerouted(exc, self._link) from exc

    def _commit(self, link: Link) -> None:
        try:
            super()._commit(link)
        except BackendError as exc:
            raise self._d.rerouted(exc, link) from exc

    # -- the PARTS space of a spread hierarchy ------------------------------------------------
    def _mine(self, raw: bytes) -> Any:
        return self._parts.get(raw)

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        if space is not PARTS:
            return super()._get(raw, space)
        mine = self._mine(raw)
        if mine is not None:
            return None if mine is DELETED else bytes(mine)
        return self._spread.get(raw)

    def _size(self, raw: bytes, space: Space) -> int | None:
        if space is not PARTS:
            return super()._size(raw, space)
        mine = self._mine(raw)
        if mine is not None:
            return None if mine is DELETED else len(mine)
        return self._spread.size(raw)

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        if space is not PARTS:
            return super()._read(raw, offset, length, space)
        mine = self._mine(raw)
        if mine is not None:
            return None if mine is DELETED else bytes(mine[offset : offset + length])
        return self._spread.read(raw, offset, length)

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        if not any(space is PARTS for _, _, space in plan):
            return super()._read_many(plan)
        home = [step for step in plan if step[2] is not PARTS]
        # The parts' sizes and values not written by this transaction: one pipeline each,
        # sent to every master holding one before any reply is read, while the home slot
        # answers its reads (one round trip for both: an open of a chunk whose parts were
        # seen before reads them beside its probe).
        asked = [(kind, raw) for kind, raw, space in plan if space is PARTS and self._mine(raw) is None]
        sized = [raw for kind, raw in asked if kind is Size]
        got = [raw for kind, raw in asked if kind is Get]
        found: dict[str, dict[bytes, Any]] = {}

        def ask_parts() -> None:
            if not found:
                found["sizes"] = dict(zip(sized, self._spread.sizes(sized), strict=True))
                found["values"] = dict(zip(got, self._spread.gets(got), strict=True))

        answers: Iterator[Any] = iter([])
        if home:
            self._alongside = ask_parts
            try:
                answers = iter(super()._read_many(home))
            finally:
                self._alongside = None
        ask_parts()
        sizes, values = found["sizes"], found["values"]
        out: list[Any] = []
        for kind, raw, space in plan:
            if space is not PARTS:
                out.append(next(answers))
            elif kind is Size:
                out.append(sizes[raw] if raw in sizes else self._size(raw, space))
            elif kind is Get:
                out.append(values[raw] if raw in values else self._get(raw, space))
            else:
                out.append(any(True for _ in self._scan_parts(raw, bytes_stop(raw), KEYS)))
        return out

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        if space is PARTS:
            self._parts[raw] = value
        else:
            super()._put(raw, value, space)

    def _delete(self, raw: bytes, space: Space) -> None:
        if space is PARTS:
            self._parts[raw] = DELETED
        else:
            super()._delete(raw, space)

    def _scan(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None):
        if space is not PARTS:
            return super()._scan(lo, hi, space, fetch, limit)
        return self._scan_parts(lo, hi, fetch)

    def _scan_parts(self, lo: bytes, hi: bytes | None, fetch: Fetch) -> Iterator[tuple[bytes, Any]]:
        mine = {r: v for r, v in self._parts.items() if r >= lo and (hi is None or r < hi)}
        rows = [(raw, x) for raw, x in self._spread.scan(lo, hi, fetch) if raw not in mine]
        for raw, value in mine.items():
            if value is not DELETED:
                rows.append((raw, None if fetch is KEYS else len(value) if fetch is SIZES else bytes(value)))
        rows.sort(key=lambda row: row[0])
        return iter(rows)

    def finish(self, ok: bool) -> None:
        """Part writes first (acknowledged by their masters), then the home commit, then the
        part deletes: a commit never names a part that is not stored."""
        if ok and self._parts:
            try:
                self._spread.apply(self._parts, deletes=False)
            except BaseException:
                super().finish(False)
                raise
        super().finish(ok)
        if ok and self._parts:
            self._spread.apply(self._parts, deletes=True)


class ClusterLinks(Links):
    """The driver's links, always to the master owning the slot: a stale slot map is read
    again first, and a link to an earlier master is dropped. The single-server driver's
    ``_acquire`` then tracks it into the change feed."""

    driver: RedisClusterDriver

    def acquire(self, write: bool = True) -> Link:
        """A link to the slot's master; see :meth:`Links.acquire`."""
        d = self.driver
        if d._stale:
            d.route()
        try:
            link = super().acquire(write)
            if link.pool is not d.pool:  # made before the slot moved: to the old master
                link.broken = True
                self.release(link)
                link = super().acquire(write)
        except UnavailableError:
            d._stale = True  # the master is unreachable: maybe failed over by now
            raise
        return link


class RedisClusterDriver(RedisDriver):
    """Driver for Redis Cluster (and Valkey in cluster mode); see the module docstring."""

    #: The largest value sent: proto-max-bulk-len's default (the masters are not each asked).
    max_value = 512 << 20
    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other clients changed since the last call, as on one server, heard on the
        master that owns the hierarchy's slot (see ``feed``)."""
        if self.feed is None:
            try:
                self.feed = ClusterFeed(self)
            except BackendError as exc:
                log.warning("%s: no change feed (CLIENT TRACKING needs Redis 6): %s", self.where, exc)
                raise NotImplementedError from exc
            self._release(self._acquire())  # the server reports once a connection tracks
        return RedisDriver.changes(self, since)

    def __init__(
        self, url: str, readonly: bool = False, build_index: bool = True, create: bool = True
    ) -> None:
        """``build_index`` and ``create``: as :class:`RedisDriver`'s (``zarrfs reindex``, which
        passes ``build_index``, failed on every cluster: an unexpected keyword argument)."""
        Driver.__init__(self, url, readonly)
        parsed = parse_url(url)
        try:
            prefix = hash_tagged(parsed.prefix)
        except ValueError as exc:
            raise BackendError(f"{parsed.scheme}: {exc}") from None
        self.prefix = prefix
        self.where = parsed.where(prefix)
        self.key_names = KeyNames(prefix)
        self.scripts = [True]  # as RedisDriver's: the listing's script runs on the home master
        self.replay = Replay()  # as RedisDriver's: a read that failed its check, per thread
        self.reading = Reading()  # as RedisDriver's: a write run again after a wrong guess
        check_query(parsed, ABOUT.options)
        check_db(parsed, cluster=True)
        self._options = self._connection_options(parsed.scheme, parsed.userinfo, parsed.query, self.timeout)
        nodes = []
        for host in filter(None, parsed.hosts.split(",")):
            name, _, port = host.rpartition(":")
            nodes.append(ClusterNode(name.strip("[]") or "127.0.0.1", int(port or 6379)))
        if not nodes:
            raise BackendError(f"{self.where}: the URL names no cluster node")
        self._lock = threading.Lock()
        self._stale = False
        self._old_pools: list[redis.ConnectionPool] = []
        self.pool = None  # type: ignore[assignment]
        try:
            self.cluster = RedisCluster(startup_nodes=nodes, **self._options)
            self._route()
        except Exception as exc:
            raise translate(exc, self.where) from exc
        self._links = ClusterLinks(self)
        self.feed: ClusterFeed | None = None  # started by the first changes() (a mount's)
        try:
            self.indexed = self._while_converging(lambda: self._look(create, build_index))
        except BaseException:
            self.close()
            raise
        if not self.readonly:  # the home master's (every key of the hierarchy is in its slot)
            self.guesses = guesses_for(self.client, self.where)
        self.spread: SpreadParts | None = None
        if _flag(parsed.query, "spread", self.where):
            masters = len(self.cluster.get_primaries())
            if masters < 2:
                self.close()
                raise BackendError(
                    f"{self.where}: spread=1 spreads a hierarchy over the cluster's masters, and this"
                    f" cluster has {masters}; add masters or drop spread=1"
                )
            tag = hash_tag(self.prefix) or self.prefix
            self.spread = SpreadParts(self.cluster, tag, self.where, self.timeout, lambda: self.watch)
            self.parts_above = _number(parsed.query, "spread_above", 0, self.where)

    def _look(self, create: bool, build_index: bool) -> bool:
        """The open's first look at the hierarchy: refuse a prefix that holds none (unless
        ``create``); whether its index is complete, building it (``build_index``)."""
        check_exists(self.client, self.key_names, self.where, create)
        if build_index:
            return ensure_index(self.client, self.key_names, self.where, self.readonly)
        return has_index(self.client, self.key_names, self.where)

    def _while_converging(self, call: Callable[[], T]) -> T:
        """``call()``, again after the slot map is read anew while the reply says the slot is
        moving or the cluster is down (``CLUSTERDOWN``: a cluster just made, or failing a
        master over, till every node agrees), for up to the timeout: what a transaction does
        (``rerouted``), for the calls made before the first one."""
        start = time.monotonic()
        deadline, told = start + self.timeout, False
        while True:
            try:
                return call()
            except BackendError as exc:
                # redis-py's client drops the reply's code from the message: its class says it
                moving = isinstance(exc, RetryableError) or isinstance(exc.__cause__, _MOVING)
                now = time.monotonic()
                if not (moving or _REROUTE.search(str(exc))) or now >= deadline:
                    raise
                if not told and now - start >= TELL_AFTER:  # one line, not one a retry
                    told = True
                    log.warning(
                        "%s: the cluster answers that it is down or moving the hierarchy's slot"
                        " (%s); trying again for up to %g s (-o timeout=)", self.where, exc, self.timeout,
                    )
            time.sleep(0.05)
            self._stale = True
            self.route()

    def set_timeout(self, seconds: float) -> None:
        """Bound later waits, and those of the connections held now, to ``seconds``: on the
        home slot's master and, on a spread hierarchy, on every master holding parts."""
        super().set_timeout(seconds)
        if getattr(self, "spread", None) is not None:
            self.spread.set_timeout(seconds)

    @staticmethod
    def _connection_options(
        scheme: str, userinfo: str, query: list[tuple[str, str]], timeout: float
    ) -> dict[str, Any]:
        """Keyword arguments for every connection: credentials, TLS, waits bounded by
        ``timeout`` (a FUSE call must fail rather than hang on a dead master, the open on a
        node that never answers), RESP2 (see ``redis.link.Link``), and no ``CLIENT SETINFO``
        but on TLS (``redis.link.handshake_options``): two round trips more for every
        connection a thread opens."""
        user, _, password = userinfo.partition(":")
        tls = is_tls(scheme)
        options: dict[str, Any] = {
            "socket_connect_timeout": timeout, "socket_timeout": timeout, "socket_keepalive": True,
            "protocol": 2,
            **handshake_options(tls),
        }
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
        for key, value in query:
            if key in ("password", "username"):
                options[key] = value
            elif key in TLS_OPTIONS:  # on a TLS scheme only (check_query)
                parse = URL_QUERY_ARGUMENT_PARSERS.get(key)  # as redis-py reads a rediss:// URL's
                try:
                    options[key] = value if parse is None else parse(value)
                except ValueError:
                    raise BackendError(f"{scheme}://: {key}={value} is not a value it takes") from None
        if tls:
            options["ssl"] = True
        return options

    def _route(self) -> None:
        """Point the driver's pool (and with it every new link) at the master owning the slot
        of the hierarchy's hash tag, reading the cluster's slot map again when it is stale."""
        with self._lock:
            if self.pool is not None and not self._stale:
                return
            if self._stale:
                self.cluster.nodes_manager.initialize()
            slot = self.cluster.keyslot(self.key_names.index[DATA])
            node = self.cluster.nodes_manager.get_node_from_slot(slot)
            old = self.pool
            if old is None or (old.connection_kwargs["host"], old.connection_kwargs["port"]) != (
                node.host,
                node.port,
            ):
                kwargs = dict(self._options)
                if kwargs.pop("ssl", False):
                    kwargs["connection_class"] = redis.SSLConnection
                self.pool = redis.ConnectionPool(host=node.host, port=node.port, **kwargs)
                self.client = redis.Redis(connection_pool=self.pool)
                if old is not None:
                    self._old_pools.append(old)  # links still on it are dropped as they come back
            self.slot, self.node = slot, f"{node.host}:{node.port}"
            self._stale = False

    def rerouted(self, exc: BackendError, link: Link) -> BackendError:
        """What to raise for ``exc``: a moved slot becomes a retry after the slot map is read
        again; a lost connection stays an error but the map is read again next time."""
        if isinstance(exc, UnavailableError):
            self._stale = True
            link.broken = True
            return exc
        m = _REROUTE.search(str(exc))
        if m is None:
            return exc
        self._stale = True
        link.broken = True  # replies of a queued MULTI may be left: never reuse the connection
        return RetryableError(f"{self.where}: {m.group(1)}: slot {self.slot} is moving; retried")

    def route(self) -> None:
        """Point the driver at the slot's master now, reading the slot map again if stale."""
        try:
            self._route()
        except Exception as exc:
            raise translate(exc, self.where) from exc

    def check_route(self) -> None:
        """Ask the master the driver is on for the slot (one ``EXISTS``): a ``MOVED`` reply
        points the driver at the new owner (see ``feed``)."""
        link = self._acquire()
        try:
            link.checked([("EXISTS", self.key_names.index[DATA])])
        except BackendError as exc:
            self.rerouted(exc, link)  # a moved slot or a lost master: the route is stale
        finally:
            self._release(link)
        if self._stale:
            self.route()

    def mark_stale(self) -> None:
        """Have the next transaction read the slot map again (a master may have failed)."""
        self._stale = True

    def _begin(self, write: bool) -> RedisClusterTxn:
        return RedisClusterTxn(self, write)

    def close(self) -> None:
        """Close every connection: the links, the pools of earlier routes, the cluster client."""
        super().close()
        for pool in self._old_pools:
            pool.disconnect()
        self.cluster.close()


"""The Redis driver's change feed: the server's client-side-caching invalidations (Redis 6+).

A mount keeps one connection subscribed to ``__redis__:invalidate``; every link it writes through
tracks into it (``CLIENT TRACKING ON REDIRECT <id> BCAST PREFIX <data> PREFIX <side> NOLOOP``), so
the server pushes the names of keys any client modifies under those prefixes before the writer's
reply (close-to-open across mounts on one machine), ``FLUSHDB``/``FLUSHALL`` as None (everything).
No server setting is needed (keyspace notifications would need ``notify-keyspace-events``); a
server without ``CLIENT TRACKING`` gives no feed. A writable mount puts the data keys it hears of
in the listing index or takes them out (``index``), so other clients' keys list without ``zarrfs
reindex``; a ``zarrfs reindex`` (which indexes keys no writable mount heard of) is heard on a
channel of its own (``KeyNames.reindexed``) and reported as "everything" (None), so a running
mount lists them. A lost feed reports None, and again when back (made again at most every
:data:`RETRY` seconds; one link tracks into it at once, the others at their next transaction;
its descriptor keeps one number, :class:`.feed_fd.FeedFd`). A link tracks only into the feed connection it was
made for (a token, not the client ID, which a restarted server hands out again) and first has the
feed read what the server sent, so a feed cut by a restart is found lost; a link the server
refuses to redirect leaves the feed lost and serves untracked: a write never fails for the feed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import redis

from ..base import DATA, SIDE, BackendError, Space
from ..feed_fd import FeedFd
from .link import Link, translated
from .url import KeyNames

log = logging.getLogger("zarrfs.backends.redis")

CHANNEL = b"__redis__:invalidate"
#: Seconds between two attempts to make a lost feed connection again.
RETRY = 0.5


class FeedOwner(Protocol):
    """What a feed uses of its driver (``RedisDriver``): the pool and client of the server (a
    cluster driver moves them with the slot), the names of the keys, whether the feed keeps
    the index, and a way to have the calling thread's link track into the feed now."""

    where: str
    readonly: bool
    indexed: bool
    key_names: KeyNames
    pool: redis.ConnectionPool
    client: redis.Redis

    def track_now(self) -> None: ...


class RedisFeed:
    """The connection the server pushes invalidations to, and the links tracking into it."""

    def __init__(self, driver: FeedOwner) -> None:
        self.driver = driver
        self.conn: Any = None
        self.cid: int | None = None
        self.token: object = None  # this connection's, in the links tracking into it
        self.lost = False
        self.unknown = False  # lost since the last look: report "something changed"
        self.retry_at = 0.0
        self.names: list[bytes] = []  # heard, not yet reported
        self.everything = False
        self.lock = threading.Lock()  # one reader of the connection at a time
        self.fd = FeedFd()
        self.fd.first(self._connect)

    def _connect(self) -> None:
        d = self.driver
        # A connection of its own, outside the pool: the pool counts every connection it makes
        # against its limit until it is given back, and attempts made while the server is away
        # would use that up ("Too many connections") for good.
        conn = d.pool.connection_class(**d.pool.connection_kwargs)
        try:
            with translated(d.where):
                conn.connect()
                conn.send_command("CLIENT", "ID")
                cid = int(conn.read_response())
                conn.send_command("SUBSCRIBE", CHANNEL, d.key_names.reindexed)
                conn.read_response()
                conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        self.conn, self.cid, self.token = conn, cid, object()
        self.names, self.everything = [], False
        self.fd.point(conn._sock.fileno())

    def fileno(self) -> int | None:
        """One descriptor number for whichever connection the feed has now: readable when the
        server pushed something (or closed it)."""
        return self.fd.fd

    def enlist(self, link: Link) -> None:
        """Have ``link`` (just acquired) track into this feed, unless it does already or the
        feed is lost. A link the server refuses to redirect leaves the feed for lost (see
        :meth:`drop`) and serves untracked; a server that is away raises (the caller gives the
        link back)."""
        if self.lost or link.tracked is self.token:
            return
        self.check()
        if self.lost:
            return
        try:
            self.track(link)
        except BackendError:
            if link.broken:  # the server is away: so is the transaction
                raise
            self.drop()  # it refused the redirect: untracked

    def track(self, link: Link) -> None:
        """Have ``link``'s writes reported to every other client, not to this one. A link that
        tracked into an earlier feed connection (the server did not restart: only the feed's
        connection was lost) stops first: the server refuses the same prefixes twice."""
        keys = self.driver.key_names
        off = [("CLIENT", "TRACKING", "OFF")] if link.tracked is not None else []
        link.checked(
            [
                *off,
                ("CLIENT", "TRACKING", "ON", "REDIRECT", self.cid, "BCAST")
                + ("PREFIX", keys.data_prefix, "PREFIX", keys.side_prefix, "NOLOOP"),
            ]
        )
        link.tracked = self.token

    def _read(self) -> None:
        """Take in what the server pushed (kept until reported); a connection that failed
        (a restart closed it) drops the feed."""
        try:
            conn = self.conn
            while conn.can_read(timeout=0):
                message = conn.read_response()
                if not isinstance(message, list) or len(message) < 3 or message[0] != b"message":
                    continue
                if message[1] != CHANNEL:  # zarrfs reindex changed the index: "everything"
                    self.everything = self.everything or message[1] == self.driver.key_names.reindexed
                    continue
                if message[2] is None:
                    self.everything = True
                else:
                    self.names.extend(message[2])
        except Exception as exc:
            log.warning("%s: change feed lost (%s); reconnecting", self.driver.where, exc)
            self.drop()

    def check(self) -> None:
        """Find out whether the feed still lives before a link tracks into it: what the server
        pushed is read (and kept), a closed connection drops the feed. Skipped while another
        thread reads it (a look at the feed, which reads it anyway)."""
        if not self.lost and self.lock.acquire(blocking=False):
            try:
                self._read()
            finally:
                self.lock.release()

    def changes(self) -> list[tuple[Space, str]] | None:
        """What the server pushed since the last call (None: "everything", or not known)."""
        with self.lock:
            return self._changes()

    def _changes(self) -> list[tuple[Space, str]] | None:
        if self.lost:
            news, self.unknown = self.unknown, False
            now = time.monotonic()
            if now < self.retry_at:
                return None if news else []
            self.retry_at = now + RETRY
            try:
                self._connect()
            except BackendError as exc:  # still away: the requests say so
                log.debug("%s: change feed not back: %s", self.driver.where, exc)
                return None if news else []
            self.lost = False
            log.info("%s: change feed back", self.driver.where)
            try:
                self.driver.track_now()
            except BackendError as exc:
                log.debug("%s: %s", self.driver.where, exc)
            return None
        self._read()
        if self.lost:
            self.unknown = False
            return None
        names, everything = self.names, self.everything
        self.names, self.everything = [], False
        if everything:
            return None
        d = self.driver
        keys = d.key_names
        records: list[tuple[Space, str]] = []
        data: list[bytes] = []
        cut_data, cut_side = len(keys.data_prefix), len(keys.side_prefix)
        for name in names:
            if name.startswith(keys.data_prefix):
                data.append(name[cut_data:])
                records.append((DATA, name[cut_data:].decode("utf-8", "surrogateescape")))
            elif name.startswith(keys.side_prefix):
                records.append((SIDE, name[cut_side:].decode("utf-8", "surrogateescape")))
        if data and not d.readonly and d.indexed:
            self._index(data)
        return records

    def _index(self, raws: list[bytes]) -> None:
        """Make the listing index agree with what exists of ``raws`` now (keys written by
        clients that keep no index)."""
        d = self.driver
        index = d.key_names.index[DATA]
        with translated(d.where):
            pipe = d.client.pipeline(transaction=True)
            for raw in raws:
                pipe.exists(d.key_names.data_prefix + raw)
                pipe.zscore(index, raw)
            answers = pipe.execute()
            pairs = list(zip(raws, answers[::2], answers[1::2], strict=True))
            add = [raw for raw, exists, score in pairs if exists and score is None]
            gone = [raw for raw, exists, score in pairs if not exists and score is not None]
            if add or gone:
                pipe = d.client.pipeline(transaction=False)
                if add:
                    pipe.zadd(index, dict.fromkeys(add, 0))
                if gone:
                    pipe.zrem(index, *gone)
                pipe.execute()

    def drop(self) -> None:
        """Take the feed for lost (made again at a later look; see the module docstring): its
        connection failed, or the server no longer knows its client ID (it restarted), so that
        links cannot track into it."""
        self.fd.park()
        if not self.lost:
            self.lost = self.unknown = True
            self.retry_at = time.monotonic() + RETRY
        self.names, self.everything = [], False
        try:
            self.conn.disconnect()
        except Exception:
            pass

    def close(self) -> None:
        """Close the feed's connection and descriptor."""
        if self.conn is not None:
            try:
                self.conn.disconnect()
            except Exception:
                pass
            self.conn = None
        self.fd.close()


"""The Redis Cluster driver's change feed: the single-server feed (:mod:`.redis.feed`) on the master
that owns the hierarchy's slot, whose invalidations cover every writer of the hierarchy (one hash
tag, one master): no pub/sub or keyspace notifications, which a cluster delivers per node.

* Links track into it only when on that same master (a client ID is one server's). A link made
  after the slot moved (``MOVED``, a failover) drops the feed, made again on the new master at
  the next look ("something changed").
* A lost feed is made again at most every :data:`RETRY` seconds; a failed attempt marks the slot
  map stale, so the next follows the promoted replica.
* Resharding deletes the slot's keys from the old master (heard as changed); a mount making no
  request of its own asks its master for the slot every :data:`CHECK` seconds (one ``EXISTS``)
  and follows a ``MOVED`` ("something changed").
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ..base import BackendError, Space
from ..redis.feed import RETRY, FeedOwner, RedisFeed
from ..redis.link import Link

log = logging.getLogger("zarrfs.backends.redis")

__all__ = ["CHECK", "RETRY", "ClusterFeed"]

#: Seconds between two checks that the feed's master still owns the slot.
CHECK = 1.0


class ClusterFeedOwner(FeedOwner, Protocol):
    """What a cluster feed uses of its driver (``RedisClusterDriver``) besides a feed's: the
    route to the slot's master, which the feed checks and follows."""

    node: str  # the master the driver's pool is on, "host:port"

    def route(self) -> None: ...

    def check_route(self) -> None: ...

    def mark_stale(self) -> None: ...


class ClusterFeed(RedisFeed):
    """:class:`RedisFeed` on the master owning the hierarchy's slot; see the module docstring."""

    driver: ClusterFeedOwner

    def __init__(self, driver: ClusterFeedOwner) -> None:
        self.pool: Any = None
        self.check_at = time.monotonic() + CHECK
        super().__init__(driver)

    def _connect(self) -> None:
        d = self.driver
        try:
            d.route()
            super()._connect()
        except BackendError:
            d.mark_stale()  # maybe failed over: read the slot map again
            raise
        self.pool = d.pool
        log.debug("%s: change feed on %s", d.where, d.node)

    def track(self, link: Link) -> None:
        """Track ``link`` into the feed when both are on the same master; otherwise the feed
        moves (dropped here, made again on the link's master at the next look)."""
        if link.pool is not self.pool:
            self.drop()
            self.retry_at = 0.0  # at the next look
            return
        super().track(link)

    def _changes(self) -> list[tuple[Space, str]] | None:
        """What the master pushed since the last call; see :meth:`RedisFeed.changes`."""
        now = time.monotonic()
        if not self.lost and now >= self.check_at:
            self.check_at = now + CHECK
            try:
                self.driver.check_route()
            except BackendError as exc:
                log.debug("%s: route check: %s", self.driver.where, exc)
            if self.driver.pool is not self.pool:  # the slot moved: follow it at once
                log.info("%s: the slot moved to %s; change feed moved", self.driver.where, self.driver.node)
                self.drop()
                self.retry_at = 0.0  # made again now
        return super()._changes()

    def _index(self, raws: list[bytes]) -> None:
        """See :meth:`RedisFeed._index`; a master that no longer owns the slot (the keys
        heard were moved away) has the feed moved at once."""
        try:
            super()._index(raws)
        except BackendError as exc:
            log.debug("%s: %s", self.driver.where, exc)
            self.driver.mark_stale()
            self.check_at = 0.0

"""The Redis Cluster driver's change feed: the single-server feed, on the master of the slot.

Every key of a hierarchy carries one hash tag (see :mod:`.redis_cluster`), so one master holds
all of them, and its client-side-caching invalidations (``CLIENT TRACKING ... BCAST``, see
:mod:`.redis_feed`) cover every writer of the hierarchy: other mounts, zarr-python's
``RedisStore`` on a cluster client, ``redis-cli -c``. No pub/sub and no keyspace notifications
(which a cluster delivers per node) are needed: :class:`ClusterFeed` is :class:`RedisFeed`
connected to the master that owns the slot, with three additions.

* The links track into it only when they are connections to that same master: a client ID is
  a number of one server, and a redirect to it on another master would name some other
  client. A link made after the slot moved (``MOVED``, a failover) finds the feed on the old
  master: the feed is dropped, and made again at the next look on the new one (reported as
  "something changed").
* A lost feed (its master died) is made again at most every :data:`RETRY` seconds, and marks
  the slot map stale first, so it follows the promoted replica.
* Its descriptor keeps one number across reconnects (:class:`.feed_fd.FeedFd`).

A slot moved away by resharding deletes its keys from the old master: the feed hears them all
as changed. A mount that makes no request of its own would not learn of the move (and not
hear the new master): every :data:`CHECK` seconds the feed asks the master it is on for the
slot (one ``EXISTS``), and a ``MOVED`` reply moves it along (reported as "something
changed").
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .base import BackendError, Space
from .feed_fd import FeedFd
from .redis_feed import RedisFeed

if TYPE_CHECKING:
    from .redis_cluster import RedisClusterDriver
    from .redis_link import Link

log = logging.getLogger("zarrfs.backends.redis")

#: Seconds between two attempts to make a lost feed connection again.
RETRY = 0.5
#: Seconds between two checks that the feed's master still owns the slot.
CHECK = 1.0


class ClusterFeed(RedisFeed):
    """:class:`RedisFeed` on the master owning the hierarchy's slot; see the module docstring."""

    driver: RedisClusterDriver

    def __init__(self, driver: RedisClusterDriver) -> None:
        self.fd = FeedFd()
        self.pool: Any = None
        self.retry_at = 0.0
        self.check_at = time.monotonic() + CHECK
        try:
            super().__init__(driver)
        except BaseException:
            self.fd.close()
            raise

    def _connect(self) -> None:
        d = self.driver
        d.route()
        super()._connect()
        self.pool = d.pool
        self.fd.point(self.conn._sock.fileno())

    def fileno(self) -> int | None:
        """One descriptor number for whichever connection the feed has now."""
        return self.fd.fd

    def track(self, link: Link) -> None:
        """Track ``link`` into the feed when both are on the same master; otherwise the feed
        moves (dropped here, made again on the link's master at the next look)."""
        if link.pool is not self.pool:
            self.drop()
            self.retry_at = 0.0  # at the next look
            return
        super().track(link)

    def changes(self) -> list[tuple[Space, str]] | None:
        """What the master pushed since the last call; see :meth:`RedisFeed.changes`."""
        if self.lost:
            now = time.monotonic()
            if now < self.retry_at:
                return []
            self.retry_at = now + RETRY
            try:
                self._connect()
            except BackendError as exc:
                self.driver.mark_stale()  # maybe failed over: read the slot map again
                log.debug("%s: change feed not back: %s", self.driver.where, exc)
                return []
            self.lost = False
            log.info("%s: change feed back on %s", self.driver.where, self.driver.node)
            try:  # the master reports to the feed once a connection tracks into it
                self.driver._release(self.driver._acquire())
            except BackendError as exc:
                log.debug("%s: %s", self.driver.where, exc)
            return None
        now = time.monotonic()
        if now >= self.check_at:
            self.check_at = now + CHECK
            try:
                self.driver.check_route()
            except BackendError as exc:
                log.debug("%s: route check: %s", self.driver.where, exc)
            if self.driver.pool is not self.pool:  # the slot moved: follow it
                log.info("%s: the slot moved to %s; change feed moved", self.driver.where, self.driver.node)
                self.drop()
                self.retry_at = 0.0
                return self.changes()
        return super().changes()

    def _index(self, raws: list[bytes]) -> None:
        """See :meth:`RedisFeed._index`; a master that no longer owns the slot (the keys
        heard were moved away) has the feed moved at once."""
        try:
            super()._index(raws)
        except BackendError as exc:
            log.debug("%s: %s", self.driver.where, exc)
            self.driver.mark_stale()
            self.check_at = 0.0

    def drop(self) -> None:
        """Take the feed for lost (see :meth:`RedisFeed.drop`)."""
        self.fd.park()
        if not self.lost:
            self.retry_at = time.monotonic() + RETRY
        super().drop()

    def close(self) -> None:
        """Close the feed's connection and descriptor."""
        super().close()
        self.fd.close()

"""A hierarchy spread over every master of a Redis Cluster (``?spread=1``).

Data keys, side records, listing indexes and change feed keep the hierarchy's one hash tag, so
every commit stays one ``MULTI``/``EXEC`` on one slot. What spreads is the ``PARTS`` space
(``zarrfs.backends.checks.Space``): values written once, stored before the commit that names them
(``zarrfs.fs.parts``), each under ``zarrfs.part.<tag>:{<key>}``, a hash tag of its own; part keys
hold random version ids, so they scatter evenly over the slots (and follow slots moved later).
Sound without a transaction across slots: a part is acknowledged before the home commit names it,
and a reader finds parts only through a committed manifest. A crash in between leaves parts no
manifest names (``zarrfs check`` reports them, ``--repair`` deletes them; a mount does not, see
:class:`SpreadParts`); parts a commit lets go of are deleted after it. The parts of one call go in
one cluster pipeline (redis-py's: routed by slot, following ``MOVED``/``ASK``), sent to every
master before any reply is read; every blocking call goes through :meth:`SpreadParts.blocking`,
bounded by ``-o timeout=``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any, TypeVar

from redis.cluster import RedisCluster

from ..base import KEYS, SIZES, Fetch
from ..buffered import DELETED
from ..redis.link import set_pool_timeout, translated

T = TypeVar("T")

#: Characters a hash tag's text may hold that would end or start one in a part's name.
_ESCAPES = {ord("%"): "%25", ord("{"): "%7B", ord("}"): "%7D"}


class SpreadParts:
    """The ``PARTS`` space of one hierarchy on a cluster: where each part lives, and the
    reads, writes and scans of parts (see the module docstring).

    Not parallel yet: one file's parts (``fs.parts.store`` writes each in its own transaction,
    so memory stays one part) and different files' commits (the request loop serves one at a
    time; :meth:`blocking` is where it would let others run).

    Why a mount does not delete orphans itself: ``zarrfs check --repair`` lists the manifests,
    then deletes the parts none names, and a commit landing between the two would lose
    committed parts. Part ids begin with the writer's clock, but a large file's parts take as
    long as they take and machines' clocks differ, so no age alone proves a part abandoned.
    Safe would be a fence on the home slot: the cleaner stores "ids older than X may go"
    before its scan; a commit naming new parts reads the fence in its watched transaction and
    stores them again under a fresh id when its id is older (a fence moved meanwhile fails its
    ``EXEC``). A part older than the fence is then named by a commit the scan sees, or never.
    Not built: one more home read per parted commit (it could ride the probe's batch)."""

    def __init__(
        self, cluster: RedisCluster, tag: str, where: str, timeout: float,
        watch: Callable[[], Any] = lambda: None,
    ) -> None:
        self.cluster = cluster
        self.watch = watch  # the driver's watch now (see blocking)
        self.where = where
        self.base = b"zarrfs.part." + tag.translate(_ESCAPES).encode("utf-8") + b":"
        self.set_timeout(timeout)

    def blocking(self, call: Callable[[], T]) -> T:
        """Run ``call``, a call of the cluster client that waits on masters' sockets: every
        part read, write and scan goes through here, with redis-py's errors translated. The
        one place where a request loop that serves several requests at once would let others
        run while a part call waits (the home slot's waits are ``redis.link.Link._wait``'s):
        the driver's ``watch`` lets go of the filesystem lock meanwhile (``fuse.workers``)."""
        watch = self.watch()
        with translated(self.where), nullcontext() if watch is None else watch.released():
            return call()

    def set_timeout(self, seconds: float) -> None:
        """Bound every wait on a master to ``seconds``: the connections held now, and those
        made later (a master added, a replica promoted)."""
        kwargs = self.cluster.nodes_manager.connection_kwargs
        kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = seconds
        for node in self.cluster.get_nodes():
            if node.redis_connection is not None:
                set_pool_timeout(node.redis_connection.connection_pool, seconds)

    def name(self, raw: bytes) -> bytes:
        """The Redis key of part key ``raw``: hashed by ``raw`` itself."""
        return self.base + b"{" + raw + b"}"

    def key_of(self, name: bytes) -> bytes | None:
        """The part key a Redis key holds, None when it is not one of this hierarchy's."""
        if name.startswith(self.base + b"{") and name.endswith(b"}"):
            return name[len(self.base) + 1 : -1]
        return None

    # -- reads: parts never change, so no WATCH and any replica of the truth will do ---------
    def get(self, raw: bytes) -> bytes | None:
        return self.blocking(lambda: self.cluster.get(self.name(raw)))

    def size(self, raw: bytes) -> int | None:
        return self.sizes([raw])[0]

    def read(self, raw: bytes, offset: int, length: int) -> bytes | None:
        name = self.name(raw)
        if length == 0:
            return b"" if self.blocking(lambda: self.cluster.exists(name)) else None
        got = self.blocking(lambda: self.cluster.getrange(name, offset, offset + length - 1))
        if got == b"" and not self.blocking(lambda: self.cluster.exists(name)):
            return None
        return got

    def sizes(self, raws: list[bytes]) -> list[int | None]:
        """The sizes of several parts in one pipeline (None: absent)."""
        if not raws:
            return []

        def run() -> list[Any]:
            pipe = self.cluster.pipeline(transaction=False)
            for raw in raws:
                pipe.exists(self.name(raw))
                pipe.strlen(self.name(raw))
            return pipe.execute()

        replies = self.blocking(run)
        return [replies[2 * i + 1] if replies[2 * i] else None for i in range(len(raws))]

    def gets(self, raws: list[bytes]) -> list[bytes | None]:
        """The values of several parts in one pipeline."""
        if not raws:
            return []
        if len(raws) == 1:
            return [self.get(raws[0])]

        def run() -> list[Any]:
            pipe = self.cluster.pipeline(transaction=False)
            for raw in raws:
                pipe.get(self.name(raw))
            return pipe.execute()

        return self.blocking(run)

    # -- writes ------------------------------------------------------------------------------
    def apply(self, pending: dict[bytes, Any], deletes: bool) -> None:
        """Send the puts (``deletes`` False) or the deletes (True) of ``pending`` in one
        pipeline; a put is acknowledged by its master before this returns."""
        pipe = self.cluster.pipeline(transaction=False)
        sent = 0
        for raw, value in pending.items():
            if (value is DELETED) != deletes:
                continue
            if deletes:
                pipe.delete(self.name(raw))
            else:
                pipe.set(self.name(raw), value if isinstance(value, bytes) else bytes(value))
            sent += 1
        if sent:
            self.blocking(pipe.execute)

    # -- the scan a check for orphans makes ----------------------------------------------------
    def scan(self, lo: bytes, hi: bytes | None, fetch: Fetch) -> Iterator[tuple[bytes, Any]]:
        """Part keys in ``[lo, hi)`` in key order, from a ``SCAN`` of every master: a whole
        keyspace walk, for ``zarrfs check`` only (the keys found are held to sort them)."""
        pattern = _glob_escape(self.base) + b"{*}"
        found: list[bytes] = []

        def scan_all() -> None:
            for node in self.cluster.get_primaries():
                client = self.cluster.get_redis_connection(node)
                for name in client.scan_iter(match=pattern, count=1000):
                    raw = self.key_of(name)
                    if raw is not None and raw >= lo and (hi is None or raw < hi):
                        found.append(raw)

        self.blocking(scan_all)
        found.sort()
        if fetch is KEYS:
            yield from ((raw, None) for raw in found)
            return
        for i in range(0, len(found), 256):
            batch = found[i : i + 256]
            got = self.sizes(batch) if fetch is SIZES else self.gets(batch)
            for raw, x in zip(batch, got, strict=True):
                if x is not None:
                    yield raw, x


def _glob_escape(raw: bytes) -> bytes:
    """``raw`` with the characters ``SCAN MATCH`` reads as a pattern escaped."""
    out = bytearray()
    for b in raw:
        if b in b"*?[]\\":
            out += b"\\"
        out.append(b)
    return bytes(out)

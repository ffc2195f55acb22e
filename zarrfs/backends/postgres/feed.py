"""The PostgreSQL driver's change feed: ``NOTIFY`` at each commit, one ``LISTEN`` per mount.

A zarrfs write transaction that changed keys calls ``pg_notify`` on ``zarrfs.<table>``
(:func:`channel`) just before it commits; PostgreSQL delivers it only if it commits. Payloads
(:func:`payloads`) are JSON ``{"w": ID, "d": [data keys], "s": [side keys]}``, ``w`` random per
driver (a mount leaves out its own), at most :data:`PAYLOAD` bytes (the server refuses 8000), over
up to :data:`MAX_PAYLOADS` notifications, past that ``{"w": ID, "all": 1}`` (rescan).
:class:`PostgresFeed` is an autocommit connection that ``LISTEN``s on the channel; its socket is
the feed's descriptor (:class:`.feed_fd.FeedFd`), read without blocking; lost, it reports None once
and is made again at most every :data:`RETRY` seconds. Notifications are per database: same-named
tables in two schemas hear each other (spurious drops, never stale names). Other SQL writers are
heard only if they end their transaction with the same announcement, ``SELECT
pg_notify('zarrfs.<table>', '{"w": "sql", "all": 1}')`` or one naming the keys, ``'{"w": "sql",
"d": ["a/.zarray", "a/0.0"]}'``; else a mount serves cached names for up to ``cache_timeout``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ..base import DATA, SIDE, Space, UnavailableError
from ..feed_fd import FeedFd
from .sql import reason

log = logging.getLogger("zarrfs.backends.postgres")

#: Bytes of one notification's payload at most (PostgreSQL refuses 8000 and more).
PAYLOAD = 7900
#: Notifications one commit sends at most; a commit of more keys says "rescan" instead.
MAX_PAYLOADS = 16
#: Seconds between two attempts to make a lost feed connection again.
RETRY = 0.5
#: The statement a write transaction ends with (channel, payloads).
NOTIFY = "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p"


def channel(table: str) -> str:
    """The notification channel of a table's hierarchy."""
    return f"zarrfs.{table}"


def new_writer() -> str:
    """A writer ID for one driver."""
    return uuid.uuid4().hex[:16]


def _head(writer: str) -> str:
    """How every payload of ``writer`` begins."""
    return f'{{"w": {json.dumps(writer)}'


def payloads(writer: str, changed: list[tuple[Space, str]]) -> list[str]:
    """The payloads announcing ``changed`` (in order, repeats dropped): each under
    :data:`PAYLOAD` bytes, at most :data:`MAX_PAYLOADS`, else one "rescan"."""
    head = _head(writer)
    out: list[str] = []
    lists: dict[str, list[str]] = {"d": [], "s": []}
    size = len(head) + 20
    for space, key in dict.fromkeys(changed):
        item = json.dumps(key)  # ASCII: its length is its size in bytes, whatever the encoding
        if size + len(item) + 2 > PAYLOAD:
            if not any(lists.values()) or len(out) + 1 >= MAX_PAYLOADS:
                return [head + ', "all": 1}']
            out.append(_payload(head, lists))
            lists = {"d": [], "s": []}
            size = len(head) + 20
        lists["d" if space is DATA else "s"].append(item)
        size += len(item) + 2
    if any(lists.values()):
        out.append(_payload(head, lists))
    return out


def _payload(head: str, lists: dict[str, list[str]]) -> str:
    parts = [head] + [f'"{name}": [{", ".join(items)}]' for name, items in lists.items() if items]
    return ", ".join(parts) + "}"


def records(payload: str, writer: str) -> list[tuple[Space, str]] | None:
    """The ``(space, key)`` pairs a payload announces; ``[]`` for this driver's own commits,
    None for "rescan" (or a payload that is not understood)."""
    if payload.startswith(_head(writer)):  # most of what a writing mount hears: not parsed
        return []
    try:
        note = json.loads(payload)
        if note["w"] == writer:
            return []
        if note.get("all"):
            return None
        return [(DATA, str(k)) for k in note.get("d", ())] + [(SIDE, str(k)) for k in note.get("s", ())]
    except (ValueError, KeyError, TypeError, AttributeError):
        log.debug("rescan for a notification not understood: %.200r", payload)
        return None


class PostgresFeed:
    """The mount's listening connection; see the module docstring."""

    def __init__(self, table: str, writer: str, where: str, params: Callable[[], dict[str, Any]]) -> None:
        self.writer = writer  # the driver's commits, which the mount knows of
        self.where = where  # the database, for messages
        self.params = params  # the connection parameters, asked at each (re)connection
        self.channel = channel(table)
        self.fd = FeedFd()
        self.conn: Any = None
        self.retry_at = 0.0
        self.fd.first(self._connect)

    def _connect(self) -> None:
        params = {**self.params(), "connect_timeout": 2}
        try:
            conn = psycopg.connect(autocommit=True, **params)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except psycopg.Error as exc:
            raise UnavailableError(f"{self.where}: change feed: {reason(exc)}") from None
        self.conn = conn
        self.fd.point(conn.fileno())

    def fileno(self) -> int | None:
        """The descriptor the loop polls: readable when notifications came."""
        return self.fd.fd

    def changes(self) -> list[tuple[Space, str]] | None:
        """What other writers announced since the last call (None: "rescan")."""
        if self.conn is None:
            now = time.monotonic()
            if now < self.retry_at:
                return []
            try:
                self._connect()
            except UnavailableError as exc:
                self.retry_at = now + RETRY
                log.debug("%s", exc)
                return []
            log.info("%s: change feed back", self.where)
            return None  # what happened while it was away is not known
        pgconn = self.conn.pgconn
        out: list[tuple[Space, str]] = []
        everything = False
        try:
            pgconn.consume_input()  # what arrived; never waits (libpq's socket is non-blocking)
            while (note := pgconn.notifies()) is not None:
                got = records(note.extra.decode("utf-8", "replace"), self.writer)
                if got is None:
                    everything = True
                elif not everything:
                    out.extend(got)
        except psycopg.Error as exc:
            log.warning("%s: change feed lost (%s); reconnecting", self.where, reason(exc))
            self.drop()
            return None
        return None if everything else out

    def drop(self) -> None:
        """Close the connection (made again at a later look)."""
        self.fd.park()
        conn, self.conn = self.conn, None
        self.retry_at = time.monotonic() + RETRY
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def close(self) -> None:
        """Close the connection and the descriptor."""
        self.drop()
        self.fd.close()

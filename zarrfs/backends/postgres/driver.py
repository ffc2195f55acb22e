"""PostgreSQL: ``postgresql://user@host:port/db?table=zarr`` (``postgres://`` too), psycopg 3.

The table has the shape of zarr-python 2's ``SQLiteStore``, ``(k text primary key, v bytea)``,
so a hierarchy is one row per Zarr key; side data lives in a table of its own (``{table}_side``)
that no Zarr client lists. New tables get the ``C`` collation on ``k`` (byte order, the order
every zarrfs driver lists in, served by the primary key's index) and ``EXTERNAL`` storage on
``v`` (Zarr chunks are compressed already; uncompressed TOAST lets ``substring`` fetch just a
byte range). A table made by someone else with another collation is read with ``COLLATE "C"``
in each query: right, but without the index.

One zarrfs transaction is one SQL transaction: reads run ``REPEATABLE READ READ ONLY`` (every
read of a listing sees one snapshot), writes ``SERIALIZABLE``; a serialization failure or
deadlock is :class:`RetryableError`, so the base's retry loop runs the transaction again. A
batch of reads (:meth:`Txn.read_many`) goes out in one pipeline: one round trip however many.

Credentials come from the URL, ``?password_file=PATH``, or libpq's own ``PGPASSWORD`` and
``~/.pgpass``; the password is never part of a message (``where`` is the URL without it).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from ..base import (
    DATA,
    KEYS,
    SIZES,
    BackendError,
    Driver,
    Fetch,
    Get,
    InterruptedCallError,
    MissingDatabaseError,
    ReadOnlyError,
    RetryableError,
    Size,
    Space,
    StalledError,
    StorageFullError,
    Txn,
    UnavailableError,
    prefix_stop,
)
from ..urloptions import check_options
from . import feed
from .connection import WatchedConnection
from .sql import bound as _bound
from .sql import compare as _compare
from .sql import queries as _queries
from .sql import reason as _reason
from .sql import text as _text

BATCH = 512  # rows per round trip of a streaming scan
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,50}$")
_LIBPQ_OPTIONS = {
    "sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
    "application_name", "host",
}
_RETRY = (pgerr.SerializationFailure, pgerr.DeadlockDetected, pgerr.LockNotAvailable)
_FULL = (pgerr.DiskFull, pgerr.OutOfMemory, pgerr.ProgramLimitExceeded)


class PostgresTxn(Txn):
    """One SQL transaction on the driver's connection; see the module docstring."""

    # A bytea field holds at most 1 GiB, its 4-byte header included.
    max_value = (1 << 30) - 5
    value_limit = "PostgreSQL's largest bytea field"

    def __init__(self, driver: PostgresDriver, write: bool) -> None:
        super().__init__(write, driver.where)
        self._conn = driver.conn
        self._q = driver.queries
        #: What this transaction wrote, announced at its commit (see ``feed``).
        self.changed: list[tuple[Space, str]] = []

    def _one(self, name: str, space: Space, *params: Any):
        return self._conn.execute(self._q[name, space], params, binary=True).fetchone()

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        row = self._one("get", space, _text(raw))
        return None if row is None else row[0]

    def _size(self, raw: bytes, space: Space) -> int | None:
        row = self._one("size", space, _text(raw))
        return None if row is None else row[0]

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        row = self._one("read", space, offset + 1, length, _text(raw))
        return None if row is None else row[0]

    def _has_prefix(self, raw: bytes, space: Space) -> bool:
        prefix = _text(raw)
        return self._one("prefix", space, prefix, prefix_stop(prefix)) is not None

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        key = _text(raw)
        self._conn.execute(self._q["put", space], (key, value), binary=True)
        self.changed.append((space, key))

    def _delete(self, raw: bytes, space: Space) -> None:
        key = _text(raw)
        self._conn.execute(self._q["delete", space], (key,))
        self.changed.append((space, key))

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        cursors = []
        with self._conn.pipeline():
            for kind, raw, space in plan:
                cur = self._conn.cursor(binary=True)
                key = _text(raw)
                if kind is Size:
                    cur.execute(self._q["size", space], (key,))
                elif kind is Get:
                    cur.execute(self._q["get", space], (key,))
                else:
                    cur.execute(self._q["prefix", space], (key, prefix_stop(key)))
                cursors.append((kind, cur))
        out: list[Any] = []
        for kind, cur in cursors:
            row = cur.fetchone()
            out.append(row is not None if kind not in (Size, Get) else None if row is None else row[0])
        return out

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        start, strict = _bound(lo)
        stop = None if hi is None else _bound(hi)
        column = {KEYS: "null", SIZES: "octet_length(v)"}.get(fetch, "v")
        table = self._q["table", space]
        collate = self._q["collate"]
        while True:
            where = [_compare(">" if strict else ">=", collate)]
            params: list[Any] = [start]
            if stop is not None:
                where.append(_compare("<=" if stop[1] else "<", collate))
                params.append(stop[0])
            query = sql.SQL("SELECT k, {} FROM {} WHERE {} ORDER BY k{} LIMIT {}").format(
                sql.SQL(column), table, sql.SQL(" AND ").join(where), collate, sql.Literal(BATCH)
            )
            rows = self._conn.execute(query, params, binary=True).fetchall()
            for k, x in rows:
                yield k.encode("utf-8"), x
            if len(rows) < BATCH:
                return
            start, strict = rows[-1][0], True


class PostgresDriver(Driver):
    """Driver for ``postgresql://`` URLs; see the module docstring."""

    schemes = ("postgresql", "postgres")
    remote = True
    batched = True

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        check_options(url, options, {"table", "password_file"} | _LIBPQ_OPTIONS)
        table = options.pop("table", "zarr")
        if not _NAME.match(table):
            raise BackendError(f"table name {table!r} is not a plain SQL identifier")
        password = unquote(parts.password) if parts.password else None
        password_file = options.pop("password_file", None)
        if password_file is not None:
            with open(password_file, encoding="utf-8") as fh:
                password = fh.readline().rstrip("\r\n")
        host = parts.hostname or options.pop("host", None)
        self.where = f"postgresql://{parts.username + '@' if parts.username else ''}{host or ''}" + (
            f":{parts.port}" if parts.port else ""
        ) + f"{parts.path}?table={table}"
        self.params = {
            "host": host,
            "port": parts.port,
            "user": unquote(parts.username) if parts.username else None,
            "password": password,
            "dbname": unquote(parts.path.lstrip("/")) or None,
            **options,
        }
        self.params = {k: v for k, v in self.params.items() if v is not None}
        self.table = table
        self.channel = feed.channel(table)
        self.writer = feed.new_writer()  # names this driver's commits in the feed
        self.feed: feed.PostgresFeed | None = None  # started by the first changes()
        self._lock = threading.RLock()
        self.conn: Any = None
        with self._lock:
            self._connect()

    def _connect(self) -> None:
        try:
            self.conn = WatchedConnection.connect(autocommit=True, **{**self.bounds(), **self.params})
        except pgerr.ConnectionTimeout as exc:  # connect_timeout: a server that does not answer
            raise StalledError(f"{self.where}: {_reason(exc)} (-o timeout=)") from None
        except psycopg.Error as exc:
            raise UnavailableError(f"{self.where}: {_reason(exc)}") from None
        self.conn.driver = self  # its waits honour watch and timeout (connection)
        tables = {DATA: self.table, Space.SIDE: self.table + "_side"}
        if not self.readonly:
            for name in tables.values():
                self.conn.execute(
                    sql.SQL(
                        'CREATE TABLE IF NOT EXISTS {} (k text COLLATE "C" PRIMARY KEY, v bytea);'
                        " ALTER TABLE {} ALTER COLUMN v SET STORAGE EXTERNAL"
                    ).format(sql.Identifier(name), sql.Identifier(name))
                )
        row = self.conn.execute(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = 'k'",
            (self.table,),
        ).fetchone()
        if row is None:
            raise MissingDatabaseError(f"{self.where}: no table {self.table!r} (open it writable to make it)")
        collate = sql.SQL("") if row[0] in ("C", "POSIX") else sql.SQL(' COLLATE "C"')
        self.queries: dict[Any, Any] = {"collate": collate}
        for space, name in tables.items():
            self.queries.update({(what, space): q for what, q in _queries(name, collate).items()})

    def bounds(self) -> dict[str, Any]:
        """libpq settings that bound a wait on the server to about ``timeout`` (``-o
        timeout=``): the connect, a statement the server runs (``statement_timeout``, lock
        waits included), data the server does not acknowledge (``tcp_user_timeout``) and a
        silent connection (keepalives: a partition). A server that is paused but whose kernel
        still answers (``SIGSTOP``) is not noticed by these; the Redis driver's own wait is."""
        seconds = self.timeout
        idle = max(1, int(seconds / 2))
        return {
            "connect_timeout": max(2, int(seconds + 0.999)),  # libpq: whole seconds, 2 at least
            "options": f"-c statement_timeout={int(seconds * 1000)}",
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": max(1, int(seconds / 6)),
            "keepalives_count": 3,
            "tcp_user_timeout": int(seconds * 1000),
        }

    def set_timeout(self, seconds: float) -> None:
        """Bound later waits to ``seconds``: the connection is made again with the new bounds."""
        super().set_timeout(seconds)
        with self._lock:
            self._drop()

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        with self._lock:
            if self.conn is None or self.conn.gone():
                self._drop()
                self._connect()
            level = "SERIALIZABLE" if write else "REPEATABLE READ READ ONLY"
            try:
                with self.conn.transaction():
                    self.conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                    txn = PostgresTxn(self, write)
                    yield txn
                    if txn.changed:  # delivered at the commit, if it commits
                        notes = feed.payloads(self.writer, txn.changed)
                        self.conn.execute(feed.NOTIFY, (self.channel, notes))
            except (InterruptedCallError, StalledError):  # the connection was closed (connection)
                self._drop()
                raise
            except _RETRY as exc:
                raise RetryableError(f"{self.where}: {_reason(exc)}") from None
            except pgerr.QueryCanceled as exc:  # statement_timeout
                raise StalledError(f"{self.where}: {_reason(exc)} (-o timeout=)") from None
            except _FULL as exc:
                raise StorageFullError(f"{self.where}: {_reason(exc)}") from None
            except pgerr.ReadOnlySqlTransaction as exc:
                raise ReadOnlyError(f"{self.where}: {_reason(exc)}") from None
            except psycopg.OperationalError as exc:
                self._drop()
                raise UnavailableError(f"{self.where}: {_reason(exc)}") from None
            except psycopg.Error as exc:
                raise BackendError(f"{self.where}: {_reason(exc)}") from None

    def _drop(self) -> None:
        try:
            if self.conn is not None:
                self.conn.close()
        except psycopg.Error:
            pass
        self.conn = None

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other zarrfs writers committed since the last call (see ``feed``);
        the first call starts the feed. The cursor only counts calls: the server pushes."""
        if self.feed is None:
            self.feed = feed.PostgresFeed(
                self.table, self.writer, self.where, lambda: {**self.bounds(), **self.params}
            )
        if since is None:
            self.feed.changes()  # nothing from before counts
            return 0, []
        return since + 1, self.feed.changes()

    def feed_fileno(self) -> int | None:
        """The listening connection's socket (readable when notifications came)."""
        return None if self.feed is None else self.feed.fileno()

    def close(self) -> None:
        """Close the connections."""
        with self._lock:
            self._drop()
            if self.feed is not None:
                self.feed.close()


__all__ = ["PostgresDriver"]

"""PostgreSQL: ``postgresql://user@host:port/db?table=zarr`` (``postgres://`` too), psycopg 3.

The table has zarr-python 2's ``SQLiteStore`` shape, ``(k text primary key, v bytea)``, a row per
Zarr key; side data is in ``{table}_side``, which no Zarr client lists. New tables get ``COLLATE
"C"`` on ``k`` (byte order, every driver's listing order, served by the primary key) and
``EXTERNAL`` storage on ``v`` (chunks are compressed already; ``substring`` then fetches just a
byte range); another collation is read with ``COLLATE "C"`` per query, without the index. A zarrfs
transaction is one SQL transaction, reads ``REPEATABLE READ READ ONLY`` (a listing sees one
snapshot), writes ``SERIALIZABLE``; a serialization failure or deadlock is :class:`RetryableError`.
A statement whose answer is not needed yet goes in one pipeline with the next that is (``txn``):
``BEGIN`` with the first read, writes and the feed's ``NOTIFY`` with the ``COMMIT``. A write
transaction answers its reads from what the mount last saw (``guesses``) and its commit checks
them on the server first (``pg_temp.zarrfs_guessed``, raising ``ZF001`` when one no longer
holds): one round trip, and a :class:`GuessedWrongError` that runs it again reading when a
check fails. With the feed running, a reading
transaction's ``COMMIT`` goes with the next transaction or after :data:`DEFER` seconds. The
pipelines whose statements are rendered already go through libpq itself (``rawpipe``), not
psycopg's cursors, which cost more CPU than the round trip on a local network. Credentials:
the URL, ``?password_file=PATH``, or libpq's ``PGPASSWORD`` and ``~/.pgpass``; messages never
hold the password (``where`` is the URL without it).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
from psycopg import errors as pgerr
from psycopg import sql
from psycopg.pq import TransactionStatus

from ..base import (
    DATA,
    BackendError,
    Driver,
    InterruptedCallError,
    MissingDatabaseError,
    ReadOnlyError,
    RetryableError,
    Space,
    StalledError,
    StorageFullError,
    Txn,
    UnavailableError,
)
from ..errors import KeyTooLongError, RestartedError
from ..filespace import statvfs
from ..guesses import Reading, run_again
from ..snapshot import HeldState
from ..urloptions import check_options
from . import feed, rawpipe
from .about import ABOUT
from .connection import WatchedConnection
from .guesses import FUNCTION, PostgresGuesses
from .sql import PLANNING
from .sql import queries as _queries
from .sql import reason as _reason
from .txn import PostgresTxn

#: What statfs says is free where the disk of the server is not known: df's "Used" is then the
#: database's size, its "Avail" this.
UNKNOWN_FREE = 1 << 40
# The database's size, and the folder of the table's tablespace: its own, or for the default
# one the data directory (which only a superuser or pg_read_all_settings may read).
_SPACE = (
    "SELECT pg_database_size(current_database()),"
    " coalesce(nullif((SELECT pg_tablespace_location(reltablespace) FROM pg_class"
    " WHERE oid = to_regclass(%s) AND reltablespace <> 0), ''),"
    " CASE WHEN pg_has_role('pg_read_all_settings', 'MEMBER')"
    " THEN current_setting('data_directory') END)"
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,50}$")
log = logging.getLogger("zarrfs.backends.postgres")

DEFER = 0.1  # seconds a reading transaction's COMMIT may wait for the next statement
#: Seconds the change feed's poll waits for a deferred COMMIT before it closes the connection
#: instead: the poll runs alone, so a stuck backend must not hold every request for the timeout.
SETTLE_WAIT = 1.0
_RETRY = (pgerr.SerializationFailure, pgerr.DeadlockDetected, pgerr.LockNotAvailable)
_FULL = (pgerr.DiskFull, pgerr.OutOfMemory, pgerr.ProgramLimitExceeded)


class PostgresDriver(Driver):
    """Driver for ``postgresql://`` URLs; see the module docstring."""

    remote = True
    batched = True
    snapshots = True  # an exported snapshot, which other mounts may join by name
    takes_create = True

    def __init__(self, url: str, readonly: bool = False, create: bool = True) -> None:
        """``create`` False (no ``-o create``): a table that does not exist is refused, not
        made (a typo of ``?table=`` mounted an empty folder, and left two tables behind)."""
        super().__init__(url, readonly)
        self.create = create
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        check_options(url, options, set(ABOUT.options))
        table = options.pop("table", "zarr")
        if not _NAME.fullmatch(table):
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
        # Connections, each with its deferred COMMIT: a transaction takes the one used last
        # that is free (several request threads each run theirs on one, fuse.workers).
        self._local = threading.local()  # the connection the calling thread used last
        self._conns: list[_ThreadConn] = []
        self._idle: list[_ThreadConn] = []
        self._conns_lock = threading.Lock()
        # The tables are made (and their storage set) by the first connection only: ALTER TABLE
        # waits for every transaction on the table, an abandoned one's too (connection).
        self._made = False
        #: What write transactions may take without reading (``guesses``); None: they read.
        self.guesses = None if readonly else PostgresGuesses()
        self.reading = Reading()  # per thread: a write run again after a wrong guess reads
        self._connect()
        self._idle.append(self._mine)  # the first transaction takes it

    @property
    def _mine(self) -> _ThreadConn:
        """The connection record of the calling thread's transaction (or of its last)."""
        mine = getattr(self._local, "conn", None)
        if mine is None:
            mine = self._local.conn = self._take()
        return mine

    def _take(self) -> _ThreadConn:
        """A free connection record, the one used last first (a new one when none is free)."""
        with self._conns_lock:
            if self._idle:
                return self._idle.pop()
            mine = _ThreadConn()
            self._conns.append(mine)
            return mine

    @property
    def conn(self) -> Any:
        """The connection of the calling thread's transaction, or of its last one."""
        return self._mine.conn

    @conn.setter
    def conn(self, value: Any) -> None:
        self._mine.conn = value

    @property
    def _deferred(self) -> float | None:
        """When the calling thread's last reading transaction ended without its COMMIT (sent
        with the next statement, or by _settle), or None."""
        return self._mine.deferred

    @_deferred.setter
    def _deferred(self, value: float | None) -> None:
        self._mine.deferred = value

    def _connect(self) -> None:
        try:
            # No statements prepared by psycopg: one made in a pipeline that then failed is
            # gone on the server while psycopg's cache still names it (rawpipe prepares its own).
            self.conn = WatchedConnection.connect(
                autocommit=True, prepare_threshold=None, **{**self.bounds(), **self.params}
            )
        except pgerr.ConnectionTimeout as exc:  # connect_timeout: a server that does not answer
            raise StalledError(f"{self.where}: {_reason(exc)} (-o timeout=)") from None
        except psycopg.Error as exc:
            raise UnavailableError(f"{self.where}: {_reason(exc)}") from None
        self.conn.driver = self  # its waits honour watch and timeout (connection)
        self.conn.named = rawpipe.Named()
        tables = {DATA: self.table, Space.SIDE: self.table + "_side"}
        if not self.readonly and not self._made:
            for name in tables.values():
                # Made once: an ALTER TABLE waits for every transaction that read the table.
                if self.conn.execute("SELECT to_regclass(%s)", (f'"{name}"',)).fetchone()[0] is not None:
                    continue
                if name == self.table and not self.create:
                    break  # refused below, as when read-only
                self.conn.execute(
                    sql.SQL(
                        'CREATE TABLE IF NOT EXISTS {} (k text COLLATE "C" PRIMARY KEY, v bytea);'
                        " ALTER TABLE {} ALTER COLUMN v SET STORAGE EXTERNAL"
                    ).format(sql.Identifier(name), sql.Identifier(name))
                )
            self._made = True
        if self.guesses is not None and self.guesses.usable:
            try:  # the check of guessed reads (guesses), in this connection's temporary schema
                self.conn.execute(FUNCTION)
            except psycopg.Error as exc:
                self.guesses.usable = False
                why = _reason(exc)
                log.info("%s: write transactions read first (no temporary function: %s)", self.where, why)
        row = self.conn.execute(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = 'k'",
            (self.table,),
        ).fetchone()
        if row is None:
            self.conn.close()
            raise MissingDatabaseError(
                f"{self.where}: no table {self.table!r}: check ?table=, or mount with -o create to make it"
            )
        collate = sql.SQL("") if row[0] in ("C", "POSIX") else sql.SQL(' COLLATE "C"')
        self.queries: dict[Any, Any] = {"collate": collate}
        for space, name in tables.items():
            # Rendered once: composing a statement costs more than sending it.
            for what, q in _queries(name, collate).items():
                self.queries[what, space] = q if what == "table" else q.as_bytes(self.conn)

    def bounds(self) -> dict[str, Any]:
        """libpq settings that bound a wait on the server to about ``timeout`` (``-o
        timeout=``): the connect, a statement the server runs (``statement_timeout``, lock
        waits included), data the server does not acknowledge (``tcp_user_timeout``) and a
        silent connection (keepalives: a partition). A server that is paused but whose kernel
        still answers (``SIGSTOP``) is not noticed by these; the Redis driver's own wait is.
        The same ``options`` carry how statements are planned (``sql.PLANNING``)."""
        seconds = self.timeout
        idle = max(1, int(seconds / 2))
        return {
            "connect_timeout": max(2, int(seconds + 0.999)),  # libpq: whole seconds, 2 at least
            "options": f"-c statement_timeout={int(seconds * 1000)} {PLANNING}",
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": max(1, int(seconds / 6)),
            "keepalives_count": 3,
            "tcp_user_timeout": int(seconds * 1000),
        }

    def set_timeout(self, seconds: float) -> None:
        """Bound later waits to ``seconds``: the connection is made again with the new bounds."""
        super().set_timeout(seconds)
        with self._conns_lock:
            for other in self._conns:
                other.stale = True
        self._drop()

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        mine = self._local.conn = self._take()
        mine.busy = True
        try:
            self._ready()
            level = "SERIALIZABLE" if write else "REPEATABLE READ READ ONLY"
            with self._errors():
                begin = f"BEGIN ISOLATION LEVEL {level}"
                txn = PostgresTxn(
                    self.conn, self.queries, self.where, write, begin, self.guesses, self.reading
                )
                deferred, self._deferred = self._deferred, None
                if deferred is not None:  # the last reading transaction ends first
                    txn.queued.insert(0, ("COMMIT", None))
                try:
                    yield txn
                    if not (txn.begun or txn.changed or txn.taken):
                        self._deferred = deferred  # nothing was sent: still to end
                    elif not write and self.feed is not None:
                        self._deferred = time.monotonic()  # ended with what comes next
                    else:
                        if txn.changed:  # delivered at the commit, if it commits
                            notes = feed.payloads(self.writer, txn.changed)
                            txn.queued.append((feed.NOTIFY, (self.channel, notes)))
                        txn.queued.append(("COMMIT", None))
                        txn.exchange()
                        if write:
                            txn.committed()
                except BaseException as exc:
                    self._roll_back()
                    if txn.taken and isinstance(exc, Exception) and not isinstance(exc, BackendError):
                        raise run_again(self.where, exc, self.reading) from exc
                    raise
        finally:
            mine.busy = False
            with self._conns_lock:
                if mine in self._conns:
                    self._idle.append(mine)

    def _ready(self) -> None:
        if self.conn is None or self._mine.stale or self.conn.gone():
            self._drop()
            self._connect()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The server's errors as the classes of ``errors``."""
        try:
            yield
        except RestartedError:  # raised after a whole exchange: the connection is kept
            raise
        except (InterruptedCallError, StalledError):  # the connection was closed (connection)
            self._drop()
            raise
        except _RETRY as exc:
            raise RetryableError(f"{self.where}: {_reason(exc)}") from None
        except pgerr.QueryCanceled as exc:  # statement_timeout
            raise StalledError(f"{self.where}: {_reason(exc)} (-o timeout=)") from None
        except pgerr.ProgramLimitExceeded as exc:
            if "index row" in str(exc):  # a key the B-tree cannot hold, even compressed
                raise KeyTooLongError(f"{self.where}: {_reason(exc)}") from None
            raise StorageFullError(f"{self.where}: {_reason(exc)}") from None
        except _FULL as exc:
            raise StorageFullError(f"{self.where}: {_reason(exc)}") from None
        except pgerr.ReadOnlySqlTransaction as exc:
            raise ReadOnlyError(f"{self.where}: {_reason(exc)}") from None
        except psycopg.OperationalError as exc:
            self._drop()
            raise UnavailableError(f"{self.where}: {_reason(exc)}") from None
        except psycopg.Error as exc:
            raise BackendError(f"{self.where}: {_reason(exc)}") from None

    def snapshot(self, name: str | None) -> HeldState:
        """Hold the state of now, or the exported snapshot ``name`` (``-o snapshot=NAME``): a
        ``REPEATABLE READ`` transaction kept open (no statement timeout), exported to join."""
        with self._errors():
            self._ready()
            conn = self.conn
            if self._deferred is not None:  # a reading transaction still open: ended first
                self._deferred = None
                conn.execute("COMMIT")
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET statement_timeout = 0")
            try:
                if name:
                    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
                exported = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        cost = "PostgreSQL cannot vacuum rows this transaction may see: dead rows stay in the tables"
        held = PostgresTxn(conn, self.queries, self.where, False, None)
        return HeldState(held, conn.rollback, cost, exported, self._errors)

    def _settle(self) -> None:
        """End the reading transactions whose COMMIT waits for the next one, if they have
        waited :data:`DEFER` seconds (the change feed's polls call this between requests, when
        no request runs; a connection in use is left to its thread)."""
        now = time.monotonic()
        with self._conns_lock:  # taken out of the free ones while they are settled
            due = [c for c in self._idle if c.deferred is not None and now - c.deferred >= DEFER]
            self._idle = [c for c in self._idle if c not in due]
        try:
            self._settle_each(due)
        finally:
            with self._conns_lock:
                self._idle[:0] = [c for c in due if c in self._conns]

    @staticmethod
    def _settle_each(due: list[_ThreadConn]) -> None:
        for mine in due:
            mine.deferred = None
            conn = mine.conn
            try:
                if conn is not None and not conn.closed:
                    conn.limit = SETTLE_WAIT
                    try:
                        conn.execute("COMMIT")
                    finally:
                        conn.limit = None
            except (psycopg.Error, InterruptedCallError, StalledError) as exc:
                why = _reason(exc) if isinstance(exc, psycopg.Error) else exc
                log.warning("a reading transaction's COMMIT failed, its connection is closed: %s", why)
                _close(mine)  # the next transaction makes a new connection

    def _roll_back(self) -> None:
        """End a transaction that failed, if the connection is still in one."""
        conn = self.conn
        if conn is None or conn.closed:
            return
        if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._drop()

    def _drop(self) -> None:
        _close(self._mine)

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other zarrfs writers committed since the last call (see ``feed``);
        the first call starts the feed. The cursor only counts calls: the server pushes."""
        if self.feed is None:
            self.feed = feed.PostgresFeed(
                self.table, self.writer, self.where, lambda: {**self.bounds(), **self.params}
            )
        self._settle()
        changed = self.feed.changes()
        guesses = self.guesses
        if guesses is not None and changed != []:  # what other clients changed is not known
            if changed is None:
                guesses.clear()
            else:
                guesses.forget(changed)
        if since is None:
            return 0, []  # nothing from before counts
        return since + 1, changed

    def feed_fileno(self) -> int | None:
        """The listening connection's socket (readable when notifications came)."""
        return None if self.feed is None else self.feed.fileno()

    def statfs(self) -> dict[str, int] | None:
        """The database's size as what is used; the free space of the disk its table's
        tablespace is on when the server runs on this machine and may say where that is (a
        unix socket or localhost), else :data:`UNKNOWN_FREE` (a server does not tell it)."""
        name = f'"{self.table}"'
        used, folder = self.transact(lambda t: t.exchange(_SPACE, (name,)).fetchone(), write=False)
        host = str(self.params.get("host") or "/")
        if folder and (host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")):
            try:
                disk = statvfs(folder)
            except OSError:
                pass
            else:
                return {"total": max(disk["total"], used), "free": disk["free"]}
        return {"total": used + UNKNOWN_FREE, "free": UNKNOWN_FREE}

    def close(self) -> None:
        """Close the connections."""
        with self._conns_lock:
            conns, self._conns, self._idle = self._conns, [], []
        for mine in conns:
            _close(mine)
        if self.feed is not None:
                self.feed.close()


class _ThreadConn:
    """One thread's connection: its deferred COMMIT, whether a transaction runs on it, and
    whether it was made with bounds that changed since (``set_timeout``)."""

    __slots__ = ("conn", "deferred", "busy", "stale")

    def __init__(self) -> None:
        self.conn: Any = None
        self.deferred: float | None = None
        self.busy = False
        self.stale = False


def _close(mine: _ThreadConn) -> None:
    """Close a thread's connection (its next transaction makes a new one)."""
    try:
        if mine.conn is not None:
            mine.conn.close()
    except psycopg.Error:
        pass
    mine.conn = None
    mine.deferred = None
    mine.stale = False


__all__ = ["PostgresDriver"]

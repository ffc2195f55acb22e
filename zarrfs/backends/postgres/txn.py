"""One SQL transaction of the PostgreSQL driver (``postgres.driver``), and its queue of statements.

A statement whose answer is not needed yet (``BEGIN``, a write) waits in :attr:`PostgresTxn.queued`
and goes out in one pipeline with the next statement whose answer is: see the driver's module
docstring for what that saves. The transaction gets the driver's connection and statements, not
the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from ..base import KEYS, SIZES, Fetch, Get, GuessedWrongError, HasPrefix, Size, Space, Txn, prefix_stop
from ..guesses import Reading
from . import rawpipe
from .connection import WatchedConnection
from .guesses import WRONG, PostgresGuesses, Taken, check, folders_of
from .sql import batch as _batch
from .sql import bound as _bound
from .sql import compare as _compare
from .sql import text as _text

BATCH = 512  # rows per round trip of a streaming scan
BIG_VALUE = 1 << 16  # values above this are sent from the caller's buffer, not copied


class PostgresTxn(Txn):
    """One SQL transaction on the driver's connection; see the module docstring."""

    # A bytea field holds at most 1 GiB, its 4-byte header included.
    max_value = (1 << 30) - 5
    value_limit = "PostgreSQL's largest bytea field"

    def __init__(
        self,
        conn: WatchedConnection,
        queries: dict[Any, Any],
        where: str,
        write: bool,
        begin: str | None,
        guesses: PostgresGuesses | None = None,
        reading: Reading | None = None,
    ) -> None:
        """A transaction on ``conn`` running the statements of ``queries`` (``sql.queries``
        per key space, and ``"collate"``); ``where`` names the database in messages.
        ``guesses``: what the driver saw (``guesses``), which every read teaches and a write
        transaction answers its batches from, unless ``reading`` says this thread's next
        one reads (a run again after a wrong guess)."""
        super().__init__(write, where)
        self.guesses = guesses
        self._reading = reading
        #: The answers a write transaction took from ``guesses``; None: it reads for real.
        self.taken: Taken | None = None
        #: The folders (``(space, raw prefix)``) this transaction wrote below: whether they
        #: hold keys is read, not guessed (the server's answer counts its writes).
        self.wrote_below: set[tuple[Space, bytes]] = set()
        if write and guesses is not None and reading is not None and not reading.take() and guesses.wanted():
            self.taken = Taken()
        self._conn = conn
        self._q = queries
        #: What this transaction wrote, announced at its commit (see ``feed``).
        self.changed: list[tuple[Space, str]] = []
        #: Statements sent with the next one whose answer is needed (see the module docstring).
        #: ``begin`` None: the transaction was begun already (a snapshot's, held).
        self.queued: list[tuple[Any, Any]] = [(begin, None)] if begin else []
        self.begun = not begin  # BEGIN has been sent
        # Write transactions: values read or written so far, by (space, raw key). SERIALIZABLE
        # reads one snapshot, and this transaction's writes are the only change to it, so a
        # second read (a check the format layer makes on a key the commit's probe read) is
        # answered without a round trip, as the Redis driver answers from what it WATCHes.
        self._seen: dict[tuple[Space, bytes], Any] | None = {} if write else None
        # Scans announced by scan_ahead: their first statement, sent with the next exchange,
        # and its rows, by the scan's arguments.
        self._ahead: list[tuple[Any, Any, Any]] = []
        self._early: dict[Any, list[Any]] = {}

    def exchange(self, query: Any = None, params: Any = None):
        """Send the queued statements and ``query`` (if any) in one pipeline; ``query``'s
        rows (``fetchone``, ``fetchall``)."""
        conn = self._conn
        taken = self.taken
        if taken is not None and taken.unchecked:
            self._check_first(taken)
        try:
            return self._exchange(conn, query, params)
        except psycopg.Error as exc:
            if taken is None or exc.sqlstate not in (WRONG, "42883"):
                raise
            # The check found an answer taken that does not hold (or its function is gone:
            # a connection made again, say); nothing this transaction wrote is kept.
            if exc.sqlstate == WRONG:
                self.guesses.missed(taken)  # type: ignore[union-attr]
            else:
                self.guesses.usable = False  # type: ignore[union-attr]
            self._reading.keep()  # type: ignore[union-attr]
            raise GuessedWrongError(f"{self.where}: a guessed read was wrong; read again") from None

    def _check_first(self, taken: Taken) -> None:
        """Queue the check of the answers ``taken`` in front of every queued write (after the
        ``BEGIN``, where it waits to be sent): the writes run only if it holds."""
        statement = check(taken, self._q, self._conn)
        at = 0
        if not self.begun:
            at = next(i + 1 for i, (q, _) in enumerate(self.queued) if str(q).startswith("BEGIN"))
        self.queued.insert(at, statement)
        taken.unchecked = False

    def _exchange(self, conn: WatchedConnection, query: Any, params: Any):
        items = self.queued if query is None else [*self.queued, (query, params)]
        statements = self._through_libpq(items)
        if statements is not None:  # the common road: see rawpipe
            self.queued = []
            self.begun = True
            answer = conn.wait(rawpipe.exchange(conn.pgconn, statements, conn.named))
            self._exchanged()
            return None if query is None else _Rows(answer)
        if not self.queued and not self._ahead:
            if query is None:
                return None
            cur = conn.execute(query, params, binary=True)
            self._exchanged()
            return cur
        queued, self.queued = self.queued, []
        self.begun = True
        cur = None
        with conn.pipeline():
            for q, p in queued:
                conn.execute(q, p, binary=True)
            if query is not None:
                cur = conn.cursor(binary=True)
                cur.execute(query, params)
            ahead = self._send_ahead()
        self._exchanged()
        self._keep_ahead(ahead)
        return cur

    def _through_libpq(self, items: list[tuple[Any, Any]]) -> list[tuple[bytes, Any]] | None:
        """``items`` (statements and their parameters) as :func:`rawpipe.exchange` sends
        them; None when one of them takes psycopg's road (a statement still to be composed,
        a parameter of another kind) or a scan was announced (sent with psycopg's cursors)."""
        if self._ahead or not items:
            return None
        out = []
        for q, p in items:
            query = rawpipe.prepared(q)
            if query is None:
                return None
            converted = rawpipe.params(p)
            if converted is None:
                return None
            out.append((query, converted))
        return out

    def _scan_ahead(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None) -> None:
        # A read-only transaction's scan: its first statement goes with the next exchange.
        key = (space, fetch, lo, hi)
        if self.write or key in self._early or any(k == key for k, _, _ in self._ahead):
            return
        query, params = self._scan_query(space, fetch, _bound(lo), None if hi is None else _bound(hi))
        self._ahead.append((key, query, params))

    def _send_ahead(self) -> list[tuple[Any, Any]]:
        """Execute the scans announced (inside a pipeline): ``(key, cursor)`` each."""
        ahead, self._ahead = self._ahead, []
        sent = []
        for key, query, params in ahead:
            cur = self._conn.cursor(binary=True)
            cur.execute(query, params)
            sent.append((key, cur))
        return sent

    def _keep_ahead(self, sent: list[tuple[Any, Any]]) -> None:
        for key, cur in sent:
            self._early[key] = cur.fetchall()

    def _exchanged(self) -> None:
        """After a whole exchange, the connection ready for the next: a reader a writer made
        stale meanwhile runs again (``RestartedError``), as after a Redis link's call."""
        driver = self._conn.driver
        watch = None if driver is None else driver.watch
        if watch is not None:
            watch.restart()

    def _one(self, name: str, space: Space, *params: Any):
        return self.exchange(self._q[name, space], params).fetchone()

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        seen = self._seen
        if seen is not None and (space, raw) in seen:
            value = seen[space, raw]
            return None if value is None else bytes(value)
        if self.taken is not None or self.guesses is not None:  # guessed, or learnt
            return self._read_many([(Get, raw, space)])[0]
        row = self._one("get", space, _text(raw))
        value = None if row is None else row[0]
        if seen is not None:
            seen[space, raw] = value
        return value

    def _size(self, raw: bytes, space: Space) -> int | None:
        seen = self._seen
        if seen is not None and (space, raw) in seen:
            value = seen[space, raw]
            return None if value is None else len(value)
        if self.taken is not None or self.guesses is not None:
            return self._read_many([(Size, raw, space)])[0]
        row = self._one("size", space, _text(raw))
        return None if row is None else row[0]

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        row = self._one("read", space, offset + 1, length, _text(raw))
        return None if row is None else row[0]

    def _has_prefix(self, raw: bytes, space: Space) -> bool:
        if self.taken is not None or self.guesses is not None:
            return self._read_many([(HasPrefix, raw, space)])[0]
        prefix = _text(raw)
        return self._one("prefix", space, prefix, prefix_stop(prefix)) is not None

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        key = _text(raw)
        # Sent with the commit: copied unless large (the caller keeps a large one unchanged
        # until the transaction ends, see Txn.put), as the Redis driver does.
        value = value if len(value) > BIG_VALUE else bytes(value)
        self.queued.append((self._q["put", space], (key, value)))
        self.changed.append((space, key))
        if self._seen is not None:
            self._seen[space, raw] = value
        if self.taken is not None:
            self.wrote_below.update((space, folder) for folder in folders_of(raw))

    def _delete(self, raw: bytes, space: Space) -> None:
        key = _text(raw)
        self.queued.append((self._q["delete", space], (key,)))
        self.changed.append((space, key))
        if self._seen is not None:
            self._seen[space, raw] = None
        if self.taken is not None:
            self.wrote_below.update((space, folder) for folder in folders_of(raw))

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        # One pipeline (one round trip), and the reads in it one statement (``sql.batch``): a
        # statement costs the client and the server far more than a row, and an open's probe
        # reads seven records of two tables. The size of a key whose value is read comes from
        # the value.
        seen = self._seen
        known = {} if seen is None else {(space, raw): seen[space, raw] for kind, raw, space in plan
                                         if kind is not HasPrefix and (space, raw) in seen}
        asked = [r for r in plan if r[0] is HasPrefix or (r[2], r[1]) not in known]
        if not asked:  # every answer is known (a key asked twice too): nothing is sent
            return [self._known(kind, known[space, raw]) for kind, raw, space in plan]
        taken = self.taken
        if taken is not None:
            guessed = taken.answer(self.guesses, asked, self.wrote_below)  # type: ignore[arg-type]
            if guessed is not None:  # checked by the commit (see guesses)
                answers = iter(guessed)
                out = []
                for kind, raw, space in plan:
                    if kind is not HasPrefix and (space, raw) in known:
                        out.append(self._known(kind, known[space, raw]))
                        continue
                    answer = next(answers)
                    if kind is Get:
                        seen[space, raw] = answer  # type: ignore[index]
                    out.append(answer)
                return out
        groups: dict[tuple[str, Space], list[bytes]] = {}
        for kind, raw, space in asked:
            if kind is HasPrefix:
                groups.setdefault(("prefix", space), []).append(raw)
            else:
                groups.setdefault(("get" if kind is Get else "size", space), []).append(raw)
        got = {space: set(raws) for (kind, space), raws in groups.items() if kind == "get"}
        for (kind, space), raws in list(groups.items()):
            if kind == "size" and space in got:
                rest = [raw for raw in raws if raw not in got[space]]
                if rest:
                    groups[kind, space] = rest
                else:
                    del groups[kind, space]
        shape = tuple(groups)
        statement = self._q.get(("batch", shape))
        if statement is None:  # rendered once per shape, as the other statements are
            tables = [(kind, self._q["table", space]) for kind, space in shape]
            statement = self._q["batch", shape] = _batch(tables, self._q["collate"]).as_bytes(self._conn)
        params: list[Any] = []
        for (kind, _), raws in groups.items():
            keys = [_text(raw) for raw in raws]
            params.append(keys)
            if kind == "prefix":
                params.append([prefix_stop(key) for key in keys])
        rows = self.exchange(statement, params).fetchall()  # with the queued statements and scans ahead
        found: dict[tuple[str, Space, bytes], Any] = {}
        sent = list(groups.items())
        for g, place, value, size in rows:
            (kind, space), raws = sent[g]
            # a get's value, a size, or a prefix holding keys (no value)
            found[kind, space, raws[place - 1]] = size if kind == "size" else value
        if self.guesses is not None:
            self.guesses.learn(asked, found)
        out: list[Any] = []
        for kind, raw, space in plan:
            if kind is HasPrefix:
                out.append(("prefix", space, raw) in found)
            elif (space, raw) in known:
                out.append(self._known(kind, known[space, raw]))
            elif kind is Get:
                value = found.get(("get", space, raw))
                if seen is not None:
                    seen[space, raw] = value
                out.append(value)
            elif raw in got.get(space, ()):
                value = found.get(("get", space, raw))
                out.append(None if value is None else len(value))
            else:
                out.append(found.get(("size", space, raw)))
        return out

    def committed(self) -> None:
        """After the ``COMMIT`` of a write transaction: what it wrote, and the answers it took
        (its check found them true), are what the driver saw last."""
        guesses, taken = self.guesses, self.taken
        if guesses is None:
            return
        if taken:
            guesses.held()
        seen = self._seen or {}
        written = []
        for space, key in self.changed:
            raw = key.encode("utf-8")
            written.append((space, raw, seen.get((space, raw))))
        guesses.wrote(written, taken or None)

    @staticmethod
    def _known(kind: type, value: Any) -> Any:
        """The answer to a Size or Get of a value this transaction read or wrote."""
        return None if value is None else len(value) if kind is Size else bytes(value)

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        start, strict = _bound(lo)
        stop = None if hi is None else _bound(hi)
        key = (space, fetch, lo, hi)
        rows = self._early.pop(key, None)  # sent ahead (scan_ahead)
        if rows is None and self._ahead:  # announced, not sent yet: it goes now, once
            self._ahead = [a for a in self._ahead if a[0] != key]
        while True:
            if rows is None:
                query, params = self._scan_query(space, fetch, (start, strict), stop)
                rows = self.exchange(query, params).fetchall()
            for k, x in rows:
                yield k.encode("utf-8"), x
            if len(rows) < BATCH:
                return
            start, strict = rows[-1][0], True
            rows = None

    def _scan_query(
        self, space: Space, fetch: Fetch, start: tuple[str, bool], stop: Any
    ) -> tuple[Any, list[Any]]:
        """The statement (and parameters) of one batch of a scan from ``start`` (a bound:
        key, and whether it is excluded) to ``stop`` (a bound, or None)."""
        params: list[Any] = [start[0]] if stop is None else [start[0], stop[0]]
        shape = ("scan", space, fetch, start[1], None if stop is None else stop[1])
        query = self._q.get(shape)
        if query is None:  # rendered once per shape, as the other statements are
            column = {KEYS: "null", SIZES: "octet_length(v)"}.get(fetch, "v")
            collate = self._q["collate"]
            where = [_compare(">" if start[1] else ">=", collate)]
            if stop is not None:
                where.append(_compare("<=" if stop[1] else "<", collate))
            table, condition = self._q["table", space], sql.SQL(" AND ").join(where)
            query = sql.SQL("SELECT k, {} FROM {} WHERE {} ORDER BY k{} LIMIT {}").format(
                sql.SQL(column), table, condition, collate, sql.Literal(BATCH)
            )
            query = self._q[shape] = query.as_bytes(self._conn)
        return query, params


class _Rows:
    """The rows of a statement sent through libpq, read as from a cursor."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


__all__ = ["PostgresTxn"]

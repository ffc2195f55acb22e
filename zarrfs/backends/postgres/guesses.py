"""What a PostgreSQL mount last saw of its tables, for write transactions to take their reads'
answers without asking (``backends.guesses`` says why and what a name's fact is; this module
adds prefixes and the check).

A write transaction (``txn.PostgresTxn``) answers a batch of reads (``read_many``) from
:class:`PostgresGuesses` when every read of it can be answered, noting the answers it took
(:class:`Taken`), and sends :func:`check` of them as the first statement of its next exchange,
ahead of its writes and ``COMMIT``: a commit's reads and writes in one round trip. The check
counts the answers that do not hold and raises ``ZF001`` (:data:`WRONG`) through a function of
the connection's own temporary schema (:data:`FUNCTION`): the transaction is aborted, the
pipeline's writes are skipped, and it runs again reading. ``SERIALIZABLE`` does the rest: the
check reads, in the transaction's snapshot, what the reads it replaces would have read.

A name (``(space, raw key)``) without a fact is guessed absent. A prefix's fact (``(space, raw)``
for a raw ending in ``/``: a folder's keys) is True (it holds keys: a read said so), a key this
mount wrote under it (its witness: the prefix holds keys while the witness is there, so other
keys' removal leaves the fact true), or False (none); one never read is guessed empty. Reads
return no witness: a key found under each prefix made the server plan every batch again
(docs/performance.md). Each fact is learnt from the answers of this mount's reads and from its
own commits; the change feed's keys make them not known (:data:`MISS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import sha256
from itertools import islice
from typing import Any

from psycopg import sql

from ..base import Get, HasPrefix, Size, Space
from ..checks import prefix_stop
from ..guesses import MISS, Guesses

#: The SQLSTATE the check raises when a guessed answer does not hold.
WRONG = "ZF001"
#: Made on each writable connection, in its temporary schema (nothing left in the database).
FUNCTION = (
    "CREATE OR REPLACE FUNCTION pg_temp.zarrfs_guessed(wrong bigint) RETURNS bigint"
    " LANGUAGE plpgsql AS $$ BEGIN IF wrong > 0 THEN"
    " RAISE EXCEPTION 'a read this mount guessed changed' USING ERRCODE = '" + WRONG + "';"
    " END IF; RETURN wrong; END $$"
)
#: Prefixes kept at most.
PREFIXES = 4096
_UNSEEN = object()

# Each kind of check, counting the answers of one table that do not hold. Keys go as ``= ANY``
# of an array and each folder's range as its own pair of parameters, not as joins with arrays'
# ``unnest``: less for the server to plan and run at each commit (docs/performance.md). A
# value's or length's pair is ``key, space, fact`` in one text: the fact has no space, so the
# pair names one key.
_CHECKS = {
    # names guessed absent (their keys)
    "absent": "(SELECT count(*) FROM {t} WHERE k = ANY(%s::text[]))",
    # names guessed with this value (their keys, and the pairs of key and SHA-256 in hex)
    "value": (
        "(cardinality(%s::text[]) - (SELECT count(*) FROM {t} WHERE k = ANY(%s::text[])"
        " AND k || ' ' || encode(sha256(v), 'hex') = ANY(%s::text[])))"
    ),
    # names guessed with a value of this length (their keys, and the pairs of key and length)
    "length": (
        "(cardinality(%s::text[]) - (SELECT count(*) FROM {t} WHERE k = ANY(%s::text[])"
        " AND k || ' ' || octet_length(v) = ANY(%s::text[])))"
    ),
    # witnesses of prefixes guessed to hold keys (their keys)
    "present": "(cardinality(%s::text[]) - (SELECT count(*) FROM {t} WHERE k = ANY(%s::text[])))",
    # a prefix guessed empty (its range)
    "empty": "(SELECT count(*) FROM (SELECT FROM {t} WHERE k >= %s{c} AND k < %s{c} LIMIT 1) AS x)",
    # a prefix guessed to hold keys, no witness known (its range)
    "full": "(1 - (SELECT count(*) FROM (SELECT FROM {t} WHERE k >= %s{c} AND k < %s{c} LIMIT 1) AS x))",
}
#: The parameters of each kind: its keys, twice where the statement names them twice.
_KEYS_TWICE = ("value", "length", "present")


def folders_of(raw: bytes) -> Iterable[bytes]:
    """The prefixes of ``raw`` that end in ``/`` (its folders')."""
    at = raw.find(b"/")
    while at >= 0:
        yield raw[: at + 1]
        at = raw.find(b"/", at + 1)


class PostgresGuesses(Guesses):
    """The facts of one driver's names and prefixes (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: ``(space, raw prefix)`` -> True (keys), a key under it (bytes), False (none), or MISS
        self.prefixes: dict[tuple[Space, bytes], Any] = {}

    def missed(self, taken: Taken) -> None:  # type: ignore[override]
        """A commit of guessed reads failed: what it took is not known any more, and the next
        write transactions read for real."""
        super().missed(taken.names)
        with self.lock:
            for key in taken.prefixes:
                self.prefixes[key] = MISS

    def learn(self, plan: list[tuple[type, bytes, Space]], found: dict[Any, Any]) -> None:
        """Keep the answers of a batch of reads: ``found`` by ``(kind name, space, raw)``, a
        value, a size, or (any value) a prefix holding keys (absent: none)."""
        names, prefixes, keep = self.names, self.prefixes, self.keep
        with self.lock:
            for kind, raw, space in plan:
                if kind is HasPrefix:
                    if raw[-1:] == b"/":
                        if ("prefix", space, raw) not in found:
                            prefixes[space, raw] = False
                        elif type(prefixes.get((space, raw))) is not bytes:  # a witness kept
                            prefixes[space, raw] = True
                    continue
                value = found.get(("get", space, raw))
                if kind is Get or value is not None:
                    keep((space, raw), value)
                    continue
                size = found.get(("size", space, raw))
                known = names.get((space, raw))
                if size is None or type(known) is not bytes or len(known) != size:
                    keep((space, raw), size)
            if self.full() or len(prefixes) > PREFIXES:
                self.bound()

    def wrote(self, written: Iterable[tuple[Space, bytes, Any]], taken: Taken | None) -> None:
        """Keep what a commit that held wrote (``(space, raw, value or None)``), after the
        answers it ``taken``, which its check found true."""
        keep, prefixes = self.keep, self.prefixes
        with self.lock:
            if taken is not None:
                for name, fact in taken.names.items():
                    keep(name, fact)
                prefixes.update(taken.prefixes)
            for space, raw, value in written:
                keep((space, raw), value)
                for prefix in folders_of(raw):
                    key = (space, prefix)
                    fact = prefixes.get(key)
                    if value is not None:
                        if type(fact) is not bytes:
                            prefixes[key] = raw
                    elif fact is True or fact == raw:
                        prefixes[key] = MISS  # its witness gone (or none known): others may be left
            self.bound()

    def forget(self, changed: Iterable[tuple[Space, str]]) -> None:
        """Another client changed these keys (the change feed): they are not known any more,
        nor the prefixes above them that were empty, full without a witness, or that they
        witnessed."""
        prefixes = self.prefixes
        with self.lock:
            for space, key in changed:
                raw = key.encode("utf-8")
                self.keep((space, raw), MISS)
                for prefix in folders_of(raw):
                    fact = prefixes.get((space, prefix))
                    if fact is False or fact is True or fact == raw:
                        prefixes[space, prefix] = MISS
            self.bound()

    def clear(self) -> None:
        """Forget everything (the feed lost, or said to read everything again)."""
        super().clear()
        with self.lock:
            self.prefixes.clear()

    def bound(self) -> None:
        """Oldest first out: the names (``backends.guesses``) and to :data:`PREFIXES`
        prefixes (the lock held)."""
        super().bound()
        prefixes = self.prefixes
        if len(prefixes) > PREFIXES:
            for key in list(islice(prefixes, len(prefixes) // 8 + 1)):
                del prefixes[key]


class Taken:
    """The answers one write transaction took without asking, checked by :func:`check`;
    ``unchecked``: some were taken since the last check was sent."""

    __slots__ = ("names", "prefixes", "unchecked")

    def __init__(self) -> None:
        self.names: dict[tuple[Space, bytes], Any] = {}  # bytes | int | None
        self.prefixes: dict[tuple[Space, bytes], Any] = {}  # True, a witness, or False
        self.unchecked = False

    def __bool__(self) -> bool:
        return bool(self.names or self.prefixes)

    def answer(
        self, guesses: PostgresGuesses, plan: list[tuple[type, bytes, Space]], written: Any = ()
    ) -> list[Any] | None:
        """Answers to ``plan`` from this transaction's answers so far and ``guesses``, or None
        when one needs the server (the whole batch is then read): a name the transaction
        wrote is answered by the caller, whether a prefix it ``written`` below holds keys by
        the server."""
        names, prefixes = {}, {}
        known, seen = guesses.names, guesses.prefixes
        out: list[Any] = []
        for kind, raw, space in plan:
            key = (space, raw)
            if kind is HasPrefix:
                if raw[-1:] != b"/" or key in written:
                    return None
                fact = self.prefixes.get(key, _UNSEEN)
                if fact is _UNSEEN:
                    fact = prefixes.get(key, _UNSEEN)
                    if fact is _UNSEEN:
                        fact = prefixes[key] = seen.get(key, False)  # never read: empty
                if fact is MISS:
                    return None
                out.append(fact is not False)
                continue
            fact = self.names.get(key, _UNSEEN)
            if fact is _UNSEEN:
                fact = names.get(key, _UNSEEN)
                if fact is _UNSEEN:
                    fact = names[key] = known.get(key)  # never seen: absent
            if fact is MISS:
                return None
            if kind is Size:
                out.append(fact if fact is None or type(fact) is int else len(fact))
            elif type(fact) is int:
                return None  # its length alone is known
            else:
                out.append(fact)
        if names or prefixes:
            self.names.update(names)
            self.prefixes.update(prefixes)
            self.unchecked = True
        return out


def check(taken: Taken, queries: dict[Any, Any], conn: Any) -> tuple[bytes, list[Any]]:
    """The statement that checks ``taken`` (raising :data:`WRONG` when an answer does not
    hold) and its parameters; rendered once per shape into ``queries`` (the driver's)."""
    keyed: dict[tuple[str, Space], tuple[list[str], list[str]]] = {}
    ranges: list[tuple[str, Space, str]] = []
    for (space, raw), fact in taken.names.items():
        key = raw.decode("utf-8")
        if fact is None:
            kind, pair = "absent", None
        elif type(fact) is int:
            kind, pair = "length", f"{key} {fact}"
        else:
            kind, pair = "value", f"{key} {sha256(fact).hexdigest()}"
        keys, pairs = keyed.setdefault((kind, space), ([], []))
        keys.append(key)
        if pair is not None:
            pairs.append(pair)
    for (space, raw), fact in taken.prefixes.items():
        if fact is False or fact is True:
            ranges.append(("full" if fact else "empty", space, raw.decode("utf-8")))
        else:
            keyed.setdefault(("present", space), ([], []))[0].append(fact.decode("utf-8"))
    shape = (tuple(keyed), tuple((kind, space) for kind, space, _ in ranges))
    statement = queries.get(("check", shape))
    if statement is None:
        parts = [
            sql.SQL(_CHECKS[kind]).format(t=queries["table", space], c=queries["collate"])
            for kind, space in (*shape[0], *shape[1])
        ]
        statement = sql.SQL("SELECT pg_temp.zarrfs_guessed({})").format(sql.SQL(" + ").join(parts))
        statement = queries["check", shape] = statement.as_bytes(conn)
    params: list[Any] = []
    for (kind, _), (keys, pairs) in keyed.items():
        params.append(keys)
        if kind in _KEYS_TWICE:
            params.append(keys)
        if pairs:
            params.append(pairs)
    for _, _, lo in ranges:
        params += [lo, prefix_stop(lo)]
    return statement, params


__all__ = ["FUNCTION", "PREFIXES", "WRONG", "PostgresGuesses", "Taken", "check", "folders_of"]

"""Statements sent in one pipeline through libpq directly (psycopg's ``pq`` layer): the
driver's exchanges whose statements are rendered already and whose parameters are text,
integers, lists of text or bytes: a read's batch after its ``BEGIN`` (and the last reading
transaction's ``COMMIT``), a single read, a scan's batch, and a write's commit (its puts and
deletes, the ``NOTIFY``, ``COMMIT``). Only scans announced ahead (sent with the next exchange
through psycopg's cursors) keep psycopg's road.

psycopg's ``Connection.pipeline`` makes a cursor, parses and adapts the query, and runs a
generator of its own for each statement: about 230-300 µs of the daemon's CPU for a read's
exchange of three statements against 85-95 µs through ``pq`` (docs/performance.md,
"PostgreSQL: a read's exchange through libpq"). Here a statement's ``%s`` placeholders are
numbered once, its parameters sent as text (their type left to the server, as psycopg leaves
a ``str``'s) or as ``bytea`` in binary, and the answer's binary columns read by their type.
The waits go through the connection's own ``wait`` (bounded, interruptible), and a server's
error is psycopg's exception for it, as from a cursor, so the driver maps it as before.

A statement with parameters is prepared on the server once per connection (:class:`Named`) and
then only bound and run: the server parses and plans an unnamed statement at every use, which
for a read's batch costs it more than running it. A name is recorded only once the server
answered its prepare (one sent in a pipeline that failed before it is never made: psycopg's
own cache of names cannot tell, which is why the driver turns it off), and never given twice.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Generator, Sequence
from typing import Any

from psycopg import errors
from psycopg.pq import ExecStatus, Format
from psycopg.waiting import READY_R, Wait

_PLACEHOLDER = re.compile(rb"%(%|s|b|t)")
_INT = {21: struct.Struct(">h").unpack, 23: struct.Struct(">i").unpack, 20: struct.Struct(">q").unpack}
_BYTEA, _BOOL, _VOID = 17, 16, 2278
_TEXTS = (25, 1043)  # text, varchar


#: Queries numbered so far (the driver's statements: a few per table and shape of batch).
_NUMBERED: dict[bytes, bytes] = {}


def prepared(query: Any) -> bytes | None:
    """``query`` (bytes or str, as rendered for psycopg) numbered for libpq, remembered; None
    for a query still to be composed (psycopg's ``sql`` objects take psycopg's road)."""
    if type(query) is str:
        query = query.encode("utf-8")
    elif type(query) is not bytes:
        return None
    got = _NUMBERED.get(query)
    if got is None:
        if len(_NUMBERED) > 1024:
            _NUMBERED.clear()
        got = _NUMBERED[query] = numbered(query)
    return got


def numbered(query: bytes) -> bytes:
    """``query`` with psycopg's positional placeholders (``%s``, ``%b``, ``%t``) as libpq's
    ``$1, $2...`` and ``%%`` as ``%``."""
    n = 0

    def one(match: re.Match) -> bytes:
        nonlocal n
        if match.group(1) == b"%":
            return b"%"
        n += 1
        return b"$%d" % n

    return _PLACEHOLDER.sub(one, query)


def text_array(items: Sequence[str]) -> bytes:
    """``items`` as a PostgreSQL array literal of text (each element quoted, ``"`` and ``\\``
    escaped): the text form of a ``text[]`` parameter."""
    quoted = (s.replace("\\", "\\\\").replace('"', '\\"') for s in items)
    return ('{"' + '","'.join(quoted) + '"}').encode("utf-8") if items else b"{}"


def params(values: Sequence[Any] | None) -> tuple[Any, Any, Any] | None:
    """``values`` as libpq's parameters ``(values, types, formats)``: text as UTF-8 and
    integers as digits (their type left to the server), lists of text as array literals,
    bytes as ``bytea`` in binary; None when a value is of another kind (psycopg's road)."""
    if not values:
        return None, None, None
    out: list[Any] = []
    types: list[int] = []
    formats: list[int] = []
    for v in values:
        kind = type(v)
        if kind is str:
            out.append(v.encode("utf-8"))
        elif kind is bytes or kind is memoryview or kind is bytearray:
            out.append(v)
            types.append(_BYTEA)
            formats.append(1)
            continue
        elif kind is int:
            out.append(b"%d" % v)
        elif kind is list and all(type(x) is str for x in v):
            out.append(text_array(v))
        elif v is None:
            out.append(None)
        else:
            return None
        types.append(0)
        formats.append(0)
    return out, types, formats


class Named:
    """The statements prepared on one connection, by numbered query and parameter types, and
    the last name given (names are never given twice: a prepare whose answer was not read,
    its exchange interrupted, cannot clash with a later one)."""

    __slots__ = ("names", "given")

    #: Statements a connection prepares at most (the driver has a few per table and shape of
    #: batch); later ones are sent unnamed.
    LIMIT = 256

    def __init__(self) -> None:
        self.names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self.given = 0


def exchange(
    pgconn: Any, statements: Sequence[tuple[bytes, Any]], named: Named | None = None
) -> Generator[Wait, int, list[tuple[Any, ...]]]:
    """A generator for the connection's ``wait``: send ``statements`` (each a numbered query
    and its :func:`params`) in one pipeline and read the answers; its value is the last
    statement's rows, binary columns decoded. The first statement that failed raises its
    psycopg error once the pipeline is read to its end. With ``named`` (the connection's), a
    statement with parameters is prepared once and run by its name."""
    # What each command sent answers: None a statement, (key, name) a prepare.
    sent: list[tuple[tuple[bytes, tuple[int, ...]], bytes] | None] = []
    pending: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
    pgconn.enter_pipeline_mode()
    try:
        for query, (values, types, formats) in statements:
            name = None
            if named is not None and values is not None:
                key = (query, tuple(types))
                name = named.names.get(key)
                if name is None and len(named.names) < Named.LIMIT:
                    name = pending.get(key)  # prepared earlier in this pipeline
                    if name is None:
                        named.given += 1
                        name = pending[key] = b"z%d" % named.given
                        pgconn.send_prepare(name, query, types)
                        sent.append((key, name))
            if name is None:
                pgconn.send_query_params(query, values, types, formats, Format.BINARY)
            else:
                pgconn.send_query_prepared(name, values, formats, Format.BINARY)
            sent.append(None)
        pgconn.pipeline_sync()
        while pgconn.flush():  # the socket's buffer is full: wait for room, reading meanwhile
            ready = yield Wait.RW
            if ready & READY_R:
                pgconn.consume_input()
        failed = None
        last = None
        place, final = 0, len(sent) - 1
        while True:
            while pgconn.is_busy():
                yield Wait.R
                pgconn.consume_input()
            res = pgconn.get_result()
            if res is None:  # the end of one command's results
                place += 1
                continue
            status = res.status
            if status == ExecStatus.PIPELINE_SYNC:
                break
            if status == ExecStatus.FATAL_ERROR and failed is None:
                failed = errors.error_from_result(res)
            elif status == ExecStatus.TUPLES_OK and place == final:
                last = res
            elif status == ExecStatus.COMMAND_OK and sent[place] is not None:  # a prepare made
                key, name = sent[place]
                named.names[key] = name
    finally:
        try:
            if pgconn.pipeline_status:
                pgconn.exit_pipeline_mode()
        except Exception:  # noqa: BLE001 - results left unread, or closed: the caller drops it
            pass
    if failed is not None:
        raise failed
    return [] if last is None else rows(last)


def rows(res: Any) -> list[tuple[Any, ...]]:
    """A binary result's rows: integers and text decoded, ``bytea`` as bytes, NULL as None.
    Read a column at a time (a comprehension each), which costs less a row than a loop."""
    n = res.ntuples
    get = res.get_value
    columns = []
    for col in range(res.nfields):
        oid = res.ftype(col)
        raw = [get(r, col) for r in range(n)]
        unpack = _INT.get(oid)
        if unpack is not None:
            raw = [None if b is None else unpack(b)[0] for b in raw]
        elif oid in _TEXTS:
            raw = [None if b is None else b.decode("utf-8") for b in raw]
        elif oid == _BOOL:
            raw = [None if b is None else b != b"\x00" for b in raw]
        elif oid == _VOID:
            raw = [None] * n
        elif oid != _BYTEA:  # bytea: get_value's bytes as they are
            raise TypeError(f"no binary reader for type {oid}")
        columns.append(raw)
    return list(zip(*columns, strict=True))

"""One pipeline of statements sent through libpq directly (psycopg's ``pq`` layer), for the
driver's most common exchange: a reading batch (an open's probe, a lookup's names) after the
statements without parameters queued before it (``COMMIT`` of the last reading transaction,
``BEGIN``).

psycopg's ``Connection.pipeline`` makes a cursor, parses and adapts the query, and runs a
generator of its own for each statement: about 230-300 µs of the daemon's CPU for such an
exchange of three statements against 85-95 µs through ``pq`` (docs/performance.md,
"PostgreSQL: a read's exchange through libpq"). Here the statement's ``%s`` placeholders are
numbered once, its arrays of keys written as text, and the answer's binary columns read by
their type. The waits go through the connection's own ``wait`` (bounded, interruptible), and a
server's error is psycopg's exception for it, as from a cursor.
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
_BYTEA, _TEXT = 17, 25


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


def exchange(
    pgconn: Any, plain: Sequence[bytes], query: bytes, params: Sequence[bytes]
) -> Generator[Wait, int, list[tuple[Any, ...]]]:
    """A generator for the connection's ``wait``: send each statement of ``plain`` (no
    parameters) and then ``query`` with ``params`` (text) in one pipeline and read the
    answers; its value is ``query``'s rows, binary columns decoded. The first statement that
    failed raises its psycopg error once the pipeline is read to its end."""
    pgconn.enter_pipeline_mode()
    try:
        for statement in plain:
            pgconn.send_query_params(statement, None)
        pgconn.send_query_params(query, params, result_format=Format.BINARY)
        pgconn.pipeline_sync()
        while pgconn.flush():  # the socket's buffer is full: wait for room, reading meanwhile
            ready = yield Wait.RW
            if ready & READY_R:
                pgconn.consume_input()
        failed = None
        last = None
        while True:
            while pgconn.is_busy():
                yield Wait.R
                pgconn.consume_input()
            res = pgconn.get_result()
            if res is None:  # the end of one statement's results
                continue
            status = res.status
            if status == ExecStatus.PIPELINE_SYNC:
                break
            if status == ExecStatus.FATAL_ERROR and failed is None:
                failed = errors.error_from_result(res)
            elif status == ExecStatus.TUPLES_OK:
                last = res
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
    """A binary result's rows: integers and text decoded, ``bytea`` as bytes, NULL as None."""
    readers = []
    for col in range(res.nfields):
        oid = res.ftype(col)
        unpack = _INT.get(oid)
        if unpack is not None:
            readers.append(lambda b, unpack=unpack: unpack(b)[0])
        elif oid == _TEXT:
            readers.append(lambda b: b.decode("utf-8"))
        elif oid == _BYTEA:
            readers.append(None)  # get_value's bytes as they are
        else:
            raise TypeError(f"no binary reader for type {oid}")
    get = res.get_value
    out = []
    for r in range(res.ntuples):
        row = []
        for col, read in enumerate(readers):
            value = get(r, col)
            row.append(value if value is None or read is None else read(value))
        out.append(tuple(row))
    return out

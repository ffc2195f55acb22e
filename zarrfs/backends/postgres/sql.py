"""The PostgreSQL driver's statements and small conversions (see :mod:`.postgres`)."""

from __future__ import annotations

from typing import Any

from psycopg import sql


def text(raw: bytes) -> str:
    """A key as PostgreSQL's text (keys are UTF-8)."""
    return raw.decode("utf-8")


def bound(raw: bytes) -> tuple[str, bool]:
    """A scan bound as text PostgreSQL can hold: keys never contain NUL, so a bound ``s\\0...``
    is the same as "just above ``s``". Returns ``(text, strict)``."""
    text = raw.decode("utf-8")
    cut = text.find("\0")
    return (text, False) if cut < 0 else (text[:cut], True)


def queries(table: str, collate: Any) -> dict[str, Any]:
    """The statements of one table, by what they do."""
    t = sql.Identifier(table)
    return {
        "table": t,
        "get": sql.SQL("SELECT v FROM {} WHERE k = %s").format(t),
        "size": sql.SQL("SELECT octet_length(v) FROM {} WHERE k = %s").format(t),
        # Several keys in one statement (a folder's sizes and side records): the rows found.
        "get_any": sql.SQL("SELECT k, v FROM {} WHERE k = ANY(%s)").format(t),
        "size_any": sql.SQL("SELECT k, octet_length(v) FROM {} WHERE k = ANY(%s)").format(t),
        "read": sql.SQL("SELECT substring(v from %s for %s) FROM {} WHERE k = %s").format(t),
        "prefix": sql.SQL("SELECT 1 FROM {} WHERE k >= %s{} AND k < %s{} LIMIT 1").format(
            t, collate, collate
        ),
        # Whether there are keys in each of several ranges, in one statement: the (1-based)
        # places of the ranges that hold some (an index probe each).
        "prefix_any": sql.SQL(
            "SELECT r.i FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS r(lo, hi, i)"
            " WHERE EXISTS (SELECT 1 FROM {} WHERE k >= r.lo{} AND k < r.hi{})"
        ).format(t, collate, collate),
        "put": sql.SQL(
            "INSERT INTO {} (k, v) VALUES (%s, %b) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
        ).format(t),
        "delete": sql.SQL("DELETE FROM {} WHERE k = %s").format(t),
    }


def compare(op: str, collate: Any) -> Any:
    """``k <op> %s``, in byte order."""
    return sql.SQL("k {} %s{}").format(sql.SQL(op), collate)


def reason(exc: BaseException) -> str:
    """The first line of an error's message, for ours."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

"""The PostgreSQL driver's statements and small conversions (see :mod:`.postgres`)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

#: Server settings of each connection the driver makes (with libpq's ``options``). Its
#: statements find rows by the primary key alone (a key, an array of keys, a range of keys), so
#: the plan that walks the key's index is always the right one: the server makes it once a
#: prepared statement (its generic plan) instead of planning again at each run, which for a
#: read's batch or a commit's check cost the server more than running it (docs/performance.md,
#: "PostgreSQL: each statement planned once"). A whole table's scan, a hash or a merge join is
#: never the better plan for them; turned off, a plan made while a table was small still walks
#: the index once the table has grown.
PLANNING = (
    "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_hashjoin=off"
    " -c enable_mergejoin=off"
)


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
        "read": sql.SQL("SELECT substring(v from %s for %s) FROM {} WHERE k = %s").format(t),
        "prefix": sql.SQL("SELECT 1 FROM {} WHERE k >= %s{} AND k < %s{} LIMIT 1").format(
            t, collate, collate
        ),
        "put": sql.SQL(
            "INSERT INTO {} (k, v) VALUES (%s, %b) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
        ).format(t),
        "delete": sql.SQL("DELETE FROM {} WHERE k = %s").format(t),
    }


_KEYS_JOINED = " FROM unnest(%s::text[]) WITH ORDINALITY AS r(k, i) JOIN {} AS t ON t.k = r.k"
#: The columns of one kind of read in :func:`batch`: what it selects, and from what rows.
_BATCH_PARTS = {
    "get": "t.v, NULL::int4" + _KEYS_JOINED,
    "size": "NULL::bytea, octet_length(t.v)" + _KEYS_JOINED,
    # EXISTS, not a key under each: that form is planned again at every run (docs/performance.md)
    "prefix": (
        "NULL::bytea, NULL::int4 FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS r(lo, hi, i)"
        " WHERE EXISTS (SELECT 1 FROM {} WHERE k >= r.lo{} AND k < r.hi{})"
    ),
}


def batch(groups: list[tuple[str, Any]], collate: Any) -> Any:
    """One statement answering several groups of reads, each ``(kind, table)`` with kind
    ``get``, ``size`` or ``prefix`` (its keys as one array parameter; a prefix group's as two,
    the ranges' starts and ends). Rows: ``(group, place, value, size)``, the group's index and
    the key's 1-based place in its array, for the keys found (the ranges holding keys)."""
    selects = []
    for n, (kind, table) in enumerate(groups):
        tail = sql.SQL(_BATCH_PARTS[kind])
        tail = tail.format(table, collate, collate) if kind == "prefix" else tail.format(table)
        selects.append(sql.SQL("SELECT {}::int2, r.i, ").format(sql.Literal(n)) + tail)
    return sql.SQL(" UNION ALL ").join(selects)


def compare(op: str, collate: Any) -> Any:
    """``k <op> %s``, in byte order."""
    return sql.SQL("k {} %s{}").format(sql.SQL(op), collate)


def reason(exc: BaseException) -> str:
    """The first line of an error's message, for ours."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

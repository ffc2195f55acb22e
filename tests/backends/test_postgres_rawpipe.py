"""The PostgreSQL driver's road through libpq (``backends/postgres/rawpipe.py``): statements
numbered as libpq wants them, parameters of each kind the driver sends, answers of each type
it reads, and a server's error raised as psycopg's exception for it once the pipeline is read
to its end, the connection usable afterwards. On the session's real server."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from zarrfs.backends.postgres import rawpipe


def test_placeholders_are_numbered_and_percent_signs_kept():
    assert rawpipe.numbered(b"SELECT %s, %b, %t") == b"SELECT $1, $2, $3"
    got = rawpipe.numbered(b"SELECT '100%%', k FROM t WHERE k = %s")
    assert got == b"SELECT '100%', k FROM t WHERE k = $1"
    assert rawpipe.prepared("COMMIT") == b"COMMIT"
    assert rawpipe.prepared(psycopg.sql.SQL("SELECT 1")) is None  # composed: psycopg's road


def test_parameters_of_another_kind_take_psycopgs_road():
    assert rawpipe.params(None) == (None, None, None)
    assert rawpipe.params([1.5]) is None
    assert rawpipe.params([["a", 1]]) is None
    values, types, formats = rawpipe.params(["k", 7, b"v", ["a", "b"], None])
    assert values == [b"k", b"7", b"v", b'{"a","b"}', None]
    assert types == [0, 0, 17, 0, 0] and formats == [0, 0, 1, 0, 0]


@pytest.fixture
def conn(postgres_server):
    with postgres_server.connect() as c:
        yield c


def send(conn, statements):
    prepared = [(rawpipe.prepared(q), rawpipe.params(p)) for q, p in statements]
    return conn.wait(rawpipe.exchange(conn.pgconn, prepared))


def test_each_kind_of_value_goes_and_comes_back(conn):
    keys = ["plain", 'q"uote', "back\\slash", "{brace}", "com,ma", "NULL", " sp ", "é/日本", ""]
    value = memoryview(bytearray(range(256)) * 300)[1:]
    rows = send(conn, [
        ("BEGIN", None),
        (
            "SELECT a, i, %s::bytea, octet_length(%s::bytea), %s + 1, %s::text IS NULL, true, false"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS r(a, i)",
            [value, value, 41, None, keys],
        ),
    ])
    send(conn, [("COMMIT", None), ("SELECT 1", None)])
    assert [r[0] for r in rows] == keys
    assert [r[1] for r in rows] == list(range(1, len(keys) + 1))
    assert all(r[2] == bytes(value) and r[3] == len(value) for r in rows)
    assert all(r[4:] == (42, True, True, False) for r in rows)
    assert send(conn, [("SELECT %s::text[] = '{}', NULL::bytea", [[]])]) == [(True, None)]
    # The rows are the last statement's, none when it has none (a NOTIFY's before a COMMIT).
    assert send(conn, [("SELECT 1", None), ("BEGIN", None)]) == []
    assert send(conn, [("SELECT 1", None), ("COMMIT", None)]) == []
    assert send(conn, [("SELECT 1", None), ("SELECT 2", None)]) == [(2,)]


def test_a_failed_statement_is_psycopgs_error_and_the_connection_goes_on(conn):
    with pytest.raises(errors.DivisionByZero):
        send(conn, [("BEGIN", None), ("SELECT 1 / %s", [0]), ("SELECT 2", None)])
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    conn.execute("ROLLBACK")
    with pytest.raises(errors.UndefinedTable):  # the first failure is the one raised
        send(conn, [("SELECT * FROM no_such_table", None), ("SELECT 1 / 0", None)])
    assert send(conn, [("SELECT %s || 'b'", ["a"])]) == [("ab",)]
    assert conn.execute("SELECT 3").fetchone() == (3,)  # psycopg's road after it


def prepared_on_server(conn):
    return sorted(r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall())


def test_a_statement_with_parameters_is_prepared_once_and_run_by_its_name(conn):
    named = rawpipe.Named()
    statements = [("SELECT %s || 'b'", ["a"]), ("SELECT %s || 'b'", ["c"]), ("SELECT %s::bytea", [b"v"])]
    prepared = [(rawpipe.prepared(q), rawpipe.params(p)) for q, p in statements]
    assert conn.wait(rawpipe.exchange(conn.pgconn, prepared[:2], named)) == [("cb",)]
    assert conn.wait(rawpipe.exchange(conn.pgconn, prepared[1:], named)) == [(b"v",)]
    assert conn.wait(rawpipe.exchange(conn.pgconn, prepared[:1], named)) == [("ab",)]
    # Made once each, the one asked twice in a pipeline too; the same query with a parameter
    # of another type is another statement.
    assert prepared_on_server(conn) == ["SELECT $1 || 'b'", "SELECT $1::bytea"]
    text = rawpipe.prepared("SELECT %s::bytea"), rawpipe.params(["\\x7a"])
    assert conn.wait(rawpipe.exchange(conn.pgconn, [text], named)) == [(b"z",)]
    assert len(named.names) == 3 and named.given == 3
    # A statement without parameters (BEGIN, COMMIT) is not prepared.
    assert conn.wait(rawpipe.exchange(conn.pgconn, [(b"SELECT 4", (None, None, None))], named)) == [(4,)]
    assert named.given == 3


def test_a_prepare_a_failed_pipeline_skipped_is_not_taken_as_made(conn):
    named = rawpipe.Named()
    late = rawpipe.prepared("SELECT %s || 'x'"), rawpipe.params(["a"])
    failing = rawpipe.prepared("SELECT 1 / %s"), rawpipe.params([0])
    with pytest.raises(errors.DivisionByZero):
        conn.wait(rawpipe.exchange(conn.pgconn, [failing, late], named))
    assert prepared_on_server(conn) == ["SELECT 1 / $1"]  # the first was made before it failed
    # The second never was: asked again, it is prepared now, not run by a name never made.
    assert conn.wait(rawpipe.exchange(conn.pgconn, [late], named)) == [("ax",)]
    assert prepared_on_server(conn) == ["SELECT $1 || 'x'", "SELECT 1 / $1"]
    assert len(set(named.names.values())) == 2 and named.given == 3  # no name given twice

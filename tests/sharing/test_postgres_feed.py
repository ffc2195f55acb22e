"""The PostgreSQL change feed (``zarrfs.backends.postgres.feed``): what a commit announces, what
a listener makes of it, and mounts that stay coherent across a server restart.

Latencies are measured by polling with a deadline, never slept over."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import session_server
from mounting import drained
from servers import _demote, start_postgres, stop_postgres
from test_coherence import read, seen_after

from zarrfs.backends.base import DATA, SIDE, RetryableError
from zarrfs.backends.postgres import feed as postgres_feed
from zarrfs.backends.registry import open_driver

# -- payloads --------------------------------------------------------------------------------------


def test_payloads_name_the_writer_and_the_keys_and_fit_the_limit():
    changed = [(DATA, "a/.zarray"), (SIDE, "a:a/0"), (DATA, "a/0"), (DATA, "a/0"), (DATA, "ü/\n")]
    (note,) = postgres_feed.payloads("w1", changed)
    assert json.loads(note) == {"w": "w1", "d": ["a/.zarray", "a/0", "ü/\n"], "s": ["a:a/0"]}
    assert note.isascii()
    assert postgres_feed.records(note, "w1") == []  # its own
    theirs = [(DATA, "a/.zarray"), (DATA, "a/0"), (DATA, "ü/\n"), (SIDE, "a:a/0")]
    assert postgres_feed.records(note, "w2") == theirs
    many = [(DATA, f"array/{i}.{i}") for i in range(2000)]
    notes = postgres_feed.payloads("w1", many)
    assert 1 < len(notes) <= postgres_feed.MAX_PAYLOADS
    assert all(len(n) < postgres_feed.PAYLOAD for n in notes)
    assert [r for n in notes for r in postgres_feed.records(n, "w2")] == many
    for too_many in ([(DATA, f"array/{i}.{i}") for i in range(20000)], [(DATA, "k" * 9000)]):
        (rescan,) = postgres_feed.payloads("w1", too_many)
        assert postgres_feed.records(rescan, "w2") is None
        assert postgres_feed.records(rescan, "w1") == []
    assert postgres_feed.records("not json", "w1") is None


# -- drivers ---------------------------------------------------------------------------------------


def test_commits_are_announced_to_other_drivers_only_when_they_commit(postgres_server):
    url = postgres_server.url(table="feed_drivers")
    a, b = open_driver(url), open_driver(url)
    try:
        ca, _ = a.changes(None)
        cb, _ = b.changes(None)
        a.put("x/1", b"1")
        b.put("mine", b"2")
        assert drained(b, cb, 1) == [(DATA, "x/1")]  # not "mine": its own
        assert drained(a, ca, 1) == [(DATA, "mine")]

        def fails(t):
            t.put("never", b"1")
            raise ValueError("rolled back")

        with pytest.raises(ValueError):
            a.transact(fails)
        tries = []

        def conflict(t):  # run twice: announced once, by the run that commits
            t.put(f"try/{len(tries)}", b"")
            tries.append(1)
            if len(tries) == 1:
                raise RetryableError("again")

        a.transact(conflict)
        assert drained(b, cb + 1, 1) == [(DATA, "try/1")]
        a.transact(lambda t: [t.put(f"big/{i:05d}", b"") for i in range(30000)])
        assert drained(b, cb + 2, 1) is None  # too many keys for the payloads: rescan
    finally:
        a.close()
        b.close()


def test_a_writer_that_is_not_zarrfs_announces_as_documented(postgres_server):
    url = postgres_server.url(table="feed_sql")
    b = open_driver(url)
    try:
        cb, _ = b.changes(None)
        with postgres_server.connect() as conn:
            conn.execute("INSERT INTO feed_sql VALUES ('a/k', 'v')")
            conn.execute("""SELECT pg_notify('zarrfs.feed_sql', '{"w": "sql", "d": ["a/k"]}')""")
        assert drained(b, cb, 1) == [(DATA, "a/k")]
        with postgres_server.connect() as conn:
            conn.execute("""SELECT pg_notify('zarrfs.feed_sql', '{"w": "sql", "all": 1}')""")
        assert drained(b, cb, 1) is None
    finally:
        b.close()


# -- mounts across a restart -----------------------------------------------------------------------


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test alone (it is restarted)."""
    yield from session_server("zarrfs-pg-restart-", start_postgres, stop_postgres)


def restart(server) -> None:
    """Restart the server (``-m immediate``: every connection is cut) on the same port."""
    res = subprocess.run(
        [server.pg_ctl, "-D", server.datadir, "-m", "immediate", "-w", "-l", f"{server.datadir}.log"]
        + ["restart"],
        capture_output=True,
        text=True,
        preexec_fn=_demote(server.run_as),
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_mounts_stay_coherent_across_a_server_restart(own_postgres, mount_factory):
    url = own_postgres.url(table="restarted")
    a = mount_factory(url, ["create"], name="a")
    b = mount_factory(url, [], name="b")
    (a.path / "f").write_bytes(b"before")
    seen_after(lambda: read(b.path / "f") == b"before", time.monotonic())
    assert not (b.path / "g").exists()  # cached: no such file
    restart(own_postgres)
    # The first request after the restart works (a connection the server closed is replaced).
    # b dropped the kernel's caches when its feed was lost; a name it caches as missing after
    # that appears once the feed is back (a second rescan), long before the kernel's hour.
    (a.path / "g").mkdir()
    t = time.monotonic()
    seen_after(lambda: (b.path / "g").is_dir(), t)
    for i in range(6):
        name = b.path / "g" / f"n{i}"
        assert not name.exists()
        (a.path / "g" / f"n{i}").write_bytes(b"x")
        seen_after(name.exists, time.monotonic())
    assert "change feed lost" in b.log_text() and "change feed back" in b.log_text()

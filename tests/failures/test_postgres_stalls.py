"""A PostgreSQL server that stops answering (``SIGSTOP``): the calls waiting on it fail with
ETIMEDOUT within ``-o timeout=``, a caller that gets a signal meanwhile gets EINTR at once, and
the mount works again without a remount (as ``test_stalls.py`` checks for Redis).

Two stalls: the whole server paused (the postmaster and every backend: a new connection waits
too), and only the backend serving the mount's connection (a stuck session: the next request
is served on a new connection at once). Each test starts a server of its own."""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest
from conftest import session_server
from mounting import eventually, needs_fuse
from servers import start_postgres, stop_postgres
from test_stalls import LONG, TIMEOUT, large_folder, timed_stat, write

pytestmark = needs_fuse


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test alone (it is paused)."""

    def stop(server):
        cont(server_pids(server))
        stop_postgres(server)

    yield from session_server("zarrfs-pg-stall-", start_postgres, stop)


def server_pids(server) -> list[int]:
    """The postmaster and its children."""
    with open(os.path.join(server.datadir, "postmaster.pid")) as fh:
        main = int(fh.readline())
    pids = [main]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rpartition(")")[2].split()[1])
            except OSError:
                continue
            if ppid == main:
                pids.append(int(entry))
    return pids


def pause(server) -> list[int]:
    """Stop the postmaster, then each child still there: a child can exit between being listed
    and being stopped (a closed connection's backend), and none is forked once the postmaster
    is stopped. Returns the processes stopped."""
    main = server_pids(server)[0]
    os.kill(main, signal.SIGSTOP)
    stopped = [main]
    for pid in server_pids(server)[1:]:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        stopped.append(pid)
    return stopped


def cont(pids: list[int]) -> None:
    """Let stopped processes run again (those still there)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def mount_backends(server, table: str) -> list[int]:
    """The backends serving the mount's transactions (not its feed's LISTEN, not ours)."""
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    pids = [pid for pid, query in rows if not query.startswith("LISTEN")]
    assert pids, rows
    return pids


def test_a_paused_server_is_etimedout_within_the_timeout_and_the_mount_recovers(own_postgres, mount_factory):
    m = mount_factory(own_postgres.url(table="stall"), ["create", "cache_timeout=0", f"timeout={TIMEOUT}"])
    write(m.path / "before", b"1")
    large_folder(m)
    pids = pause(own_postgres)
    try:
        # The first waits on its connection; the next one on a new connection's connect.
        # Names this mount never read: what it stored itself ("before") it knows without asking.
        for name in ("big/missing", "big/000"):
            what, seconds = timed_stat(m.path / name, limit=10 * TIMEOUT)
            assert what == str(errno.ETIMEDOUT), (name, what)
            assert seconds < 5 * TIMEOUT, seconds  # one timeout, not a wait retried
    finally:
        cont(pids)
    assert (m.path / "before").read_bytes() == b"1"  # no remount
    write(m.path / "after", b"2")
    assert (m.path / "after").read_bytes() == b"2"
    assert "ETIMEDOUT" in m.log_text()


def test_a_stuck_backend_is_etimedout_and_the_next_request_is_served(own_postgres, mount_factory):
    # Names cached by the kernel: the stat's one request is the lookup of the missing name (a
    # failed lookup revalidating a cached folder would be retried by the kernel at once).
    timeout = 4
    m = mount_factory(own_postgres.url(table="stuck"), ["create", "cache_timeout=60", f"timeout={timeout}"])
    write(m.path / "before", b"1")
    large_folder(m)
    write(m.path / "big" / "warm", b"w")  # ends committed: no COMMIT left for the feed's poll
    stuck = mount_backends(own_postgres, "stuck")
    for pid in stuck:
        os.kill(pid, signal.SIGSTOP)
    try:
        what, seconds = timed_stat(m.path / "big" / "missing", limit=10 * timeout)
        assert what == str(errno.ETIMEDOUT) and seconds < 5 * timeout, (what, seconds)
        start = time.monotonic()
        assert (m.path / "before").read_bytes() == b"1"  # a new connection, still stopped the old
        write(m.path / "after", b"2")
        # On the stuck connection each would have waited the whole timeout (and failed): twice
        # what the stat above took, which is the baseline (a stall waited out on this machine).
        served = time.monotonic() - start
        assert served < seconds / 2, (served, seconds)
    finally:
        cont(stuck)
    assert (m.path / "after").read_bytes() == b"2"


def test_a_call_waiting_on_a_stuck_backend_is_interrupted_with_eintr(own_postgres, mount_factory):
    m = mount_factory(own_postgres.url(table="intr"), ["create", "cache_timeout=60", f"timeout={LONG}"])
    write(m.path / "cached", b"1")
    os.stat(m.path / "cached")
    large_folder(m)
    stopped: list[int] = []
    try:
        for name in ("big/missing-1", "big/missing-2"):
            # On the connection now in use, and committed (a reading transaction's COMMIT, left
            # for the feed's poll, could close the connection before the stat takes it).
            write(m.path / f"{name}-warm", b"w")
            stuck = [pid for pid in mount_backends(own_postgres, "intr") if pid not in stopped]
            for pid in stuck:
                os.kill(pid, signal.SIGSTOP)
            stopped += stuck
            what, seconds = timed_stat(m.path / name, alarm=0.5, limit=LONG / 2)
            assert what == "alarm", (name, what)  # EINTR: the signal handler ran
            assert seconds < LONG / 4, seconds  # at the signal, not at the timeout
            assert os.stat(m.path / "cached").st_size == 1  # served meanwhile
        what, _ = timed_stat(m.path / "big" / "missing-3")
        assert what == str(errno.ENOENT), what  # a new connection
    finally:
        cont(stopped)
    write(m.path / "big" / "missing-3", b"22")
    assert (m.path / "big" / "missing-3").read_bytes() == b"22"
    assert (m.path / "cached").read_bytes() == b"1"


def test_a_stuck_idle_backend_does_not_hold_the_mount(own_postgres, mount_factory):
    """A reading transaction's COMMIT waits for the next statement, or for the change feed's
    poll, which runs alone; on a backend that stopped answering the poll gives it up after
    ``SETTLE_WAIT`` (one log line) and closes the connection: it no longer held every request
    for the timeout (60 s here)."""
    m = mount_factory(own_postgres.url(table="settle"), ["create", "cache_timeout=0", "timeout=60"])
    write(m.path / "f", b"1")
    large_folder(m)
    stopped: list[int] = []
    try:
        for attempt in range(20):  # stopped before the poll sends the COMMIT
            assert not (m.path / "big" / f"missing-{attempt}").exists()  # its COMMIT deferred
            stopped = mount_backends(own_postgres, "settle")
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            if _in_transaction(own_postgres, stopped):
                break
            cont(stopped)
            stopped = []
        assert stopped, "the poll always ended the transaction first"
        eventually(lambda: "COMMIT failed" in m.log_text(), "the deferred COMMIT given up", deadline=30)
        what, seconds = timed_stat(m.path / "big" / "missing")
        assert what == str(errno.ENOENT), what  # on a new connection
    finally:
        cont(stopped)
    assert (m.path / "f").read_bytes() == b"1"


def _in_transaction(server, pids: list[int]) -> bool:
    """Whether one of ``pids`` last reported itself idle in a transaction."""
    with server.connect() as conn:
        rows = conn.execute("SELECT pid, state FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall()
    return any(state == "idle in transaction" for _, state in rows)

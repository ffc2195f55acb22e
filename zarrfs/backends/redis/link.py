"""The Redis driver's connections: the pool opened to a server (bounded timeouts, the server's
largest value), one link per thread, replies parsed by hiredis straight from the socket, and the
translation of Redis errors."""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import select
import ssl
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import redis
import redis.exceptions as rexc

try:  # the C reply parser redis-py also uses; without it replies go through redis-py
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency on CPython
    hiredis = None

from zarrfs.spin import next_window

from ..base import (
    BackendError,
    ReadOnlyError,
    RetryableError,
    StalledError,
    StorageFullError,
    UnavailableError,
)
from .url import is_tls

if TYPE_CHECKING:
    from .url import RedisURL

BIG_ARG = 1 << 14  # arguments longer than this are sent as they are, not copied into a buffer
#: Arguments of the longest command looked through for long values (see _pack_big).
VALUED = 4
# A lone reply this large is read into a buffer of its own: hiredis would copy it twice more.
BIG_REPLY = 1 << 18
IDLE_CHECK = 1.0  # seconds: a connection idle longer is checked for a close by the server
SPIN = 100e-6  # seconds a link polls for a reply before it sleeps (see Link._receive)

# Arguments that turn off redis-py's CLIENT SETINFO handshake (redis-py 8 names it driver_info).
NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if importlib.util.find_spec("redis.driver_info") is not None
    else {"lib_name": None, "lib_version": None}
)


def handshake_options(tls: bool) -> dict[str, Any]:
    """redis-py's connection options for the handshake: none on a plain connection, which
    then sends nothing before its first command; on TLS, ``CLIENT SETINFO`` as redis-py sends
    it. A TLS 1.3 server sends its session tickets after the handshake, and redis-py, taking
    a new connection from its pool, finds them waiting unread and refuses the connection
    ("Connection not ready") unless a reply was read first."""
    return {} if tls else NO_SETINFO


log = logging.getLogger("zarrfs.backends.redis")

# Error replies by their first word (hiredis hands them over as plain ResponseError).
_RETRYABLE_REPLIES = ("LOADING", "TRYAGAIN", "BUSY", "MASTERDOWN")


_WANTS_PASSWORD = (
    "the server wants a password: give it with ?password_file=PATH or $ZARRFS_PASSWORD (see zarrfs --help)"
)


def _credentials_advice(msg: str) -> str | None:
    """What to do about the credentials a server refused (its reply ``msg``), or None when
    ``msg`` is not about them: none given, wrong ones given, or one given to a server without."""
    if "NOAUTH" in msg or "Authentication required" in msg:
        return _WANTS_PASSWORD
    if "WRONGPASS" in msg or "invalid username-password pair" in msg:
        return ("the server refused the user name and password given (in the URL, ?password_file= or "
                "$ZARRFS_PASSWORD): check them")
    if "without any password configured" in msg:
        return ("the server has no password: give none (drop it from the URL, ?password_file= or "
                "$ZARRFS_PASSWORD)")
    return None


def translate(exc: Exception, what: str) -> BackendError:
    """Map a redis-py exception (or an error reply) to the driver interface's classes."""
    if isinstance(exc, BackendError):
        return exc
    msg = str(exc)
    # Over maxmemory at a queued command's turn: OOM; at EXEC (the commands were queued under
    # the limit, and the queue or another client's write took it over): EXECABORT naming OOM.
    if isinstance(exc, rexc.OutOfMemoryError) or msg.startswith("OOM") or (
        msg.startswith("EXECABORT") and "OOM" in msg
    ):
        return StorageFullError(f"{what}: Redis is out of memory (maxmemory): {exc}")
    if isinstance(exc, (rexc.BusyLoadingError, rexc.TryAgainError, rexc.WatchError)) or (
        isinstance(exc, rexc.ResponseError) and msg.startswith(_RETRYABLE_REPLIES)
    ):
        return RetryableError(f"{what}: {exc}")
    if isinstance(exc, rexc.ReadOnlyError) or (
        isinstance(exc, rexc.ResponseError) and msg.startswith("READONLY")
    ):
        return ReadOnlyError(f"{what}: {exc}")
    advice = _credentials_advice(msg)
    if advice is not None or isinstance(exc, rexc.AuthenticationError):
        said = msg.split(". ")[0].rstrip(".") or exc.__class__.__name__
        return UnavailableError(f"{what}: {said}: {advice or _WANTS_PASSWORD}")
    if isinstance(exc, (rexc.TimeoutError, TimeoutError)):  # a socket timeout: a send, a connect
        return StalledError(f"{what}: no answer within the timeout: {exc}")
    if isinstance(exc, (rexc.ConnectionError, OSError)):
        return UnavailableError(f"{what}: {exc}")
    return BackendError(f"{what}: {exc}")


def open_pool(url: RedisURL, timeout: float) -> tuple[redis.ConnectionPool, redis.Redis]:
    """The connection pool for ``url`` and a client on it, whose first ``PING`` has answered.

    Bounded timeouts: a FUSE call must fail (ETIMEDOUT) rather than hang on a paused or
    unreachable server, for ``timeout`` at most (see :func:`set_pool_timeout`). RESP2 unless
    the URL asks otherwise: no push messages among the replies, and the links parse it with
    hiredis directly (see :class:`Link`). No ``CLIENT SETINFO`` but on TLS
    (:func:`handshake_options`): a new connection sends nothing before its first command, so
    that command's wait (which notices interrupts) is the only one."""
    tcp = {"socket_keepalive": True} if url.scheme != "unix" else {}
    pool = redis.ConnectionPool.from_url(
        url.client_url(),
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        protocol=2,
        **tcp,
        **handshake_options(is_tls(url.scheme)),
    )
    client = redis.Redis(connection_pool=pool)
    client.ping()
    return pool, client


def set_pool_timeout(pool: redis.ConnectionPool, seconds: float) -> None:
    """Bound the waits of ``pool``'s later connections, and of those it holds now, to ``seconds``."""
    pool.connection_kwargs.update(socket_timeout=seconds, socket_connect_timeout=seconds)
    # The pool's lists are private: read defensively.
    for conn in [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]:
        conn.socket_timeout = conn.socket_connect_timeout = seconds
        if conn._sock is not None:
            conn._sock.settimeout(seconds)


def bulk_limit(client: redis.Redis) -> int:
    """The largest argument the server takes (``proto-max-bulk-len``; a larger one resets the
    connection): its setting, or the default, 512 MB, where CONFIG is not allowed."""
    try:
        found = client.config_get("proto-max-bulk-len")
        return int(next(iter(found.values())))
    except Exception:
        return 512 << 20


class LinkOwner(Protocol):
    """What a link reads of its driver: the pool it takes its connection from, how messages
    name the database, and the bounds of a wait, which change while it lives (``-o timeout=``,
    the request loop's ``watch``)."""

    pool: redis.ConnectionPool
    where: str
    timeout: float
    watch: Any


# A link kept by a thread must not be used by a process forked from it (the socket is shared).
_fork_generation = 0


def _forked() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _readable(fd: int) -> int | str:
    """Bytes waiting on socket ``fd`` (for an error message: a reply that came but was not
    seen would show here)."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)
    except OSError as exc:
        return f"unknown ({exc.strerror})"


def _big_bulk(buf: bytearray, got: int, at: int = 0) -> tuple[int, int] | None:
    """``(start, size)`` when the bytes of ``buf`` from ``at`` to ``got`` begin a bulk reply
    (``$size``) of at least :data:`BIG_REPLY` bytes whose data starts at ``start``, else None."""
    if got - at < 4 or buf[at] != 0x24:  # "$"
        return None
    end = buf.find(b"\r\n", at + 1, min(got, at + 24))
    if end < 0:
        return None
    try:
        size = int(buf[at + 1 : end])
    except ValueError:
        return None
    return (end + 2, size) if size >= BIG_REPLY else None


_OK = b"+OK\r\n"
#: Commands whose reply is ``+OK`` and that may go in front of a lone read (a read
#: transaction's ``WATCH``, an owed ``UNWATCH``): that read's large value is still received
#: straight into its own buffer.
_LEADING = frozenset({"WATCH", "UNWATCH", b"WATCH", b"UNWATCH"})


def _arg(a: Any) -> bytes | memoryview:
    if isinstance(a, (bytes, memoryview)):
        return a
    if isinstance(a, str):
        return a.encode("utf-8")
    if isinstance(a, int):
        return b"%d" % a
    return memoryview(a)


def _pack_big(commands: Sequence[tuple[Any, ...]]) -> list[bytes | memoryview]:
    """The RESP encoding of ``commands`` as few buffers, with long values (chunks of MiB) as
    buffers of their own rather than copied into one. Only a command of at most
    :data:`VALUED` arguments is looked through for long ones: a value is set by a ``SET`` of
    three, and the long commands of a commit (its ``WATCH``, the checks' ``EVAL`` of a hundred
    arguments, ``ZADD``, ``DEL``) carry names and members; looking through each of their
    arguments cost half the packing (a long value in one would only be copied)."""
    out: list[bytes | memoryview] = []
    small: list[bytes] = []
    for cmd in commands:
        if len(cmd) > VALUED or all(not isinstance(a, (bytes, memoryview)) or len(a) <= BIG_ARG for a in cmd):
            small.append(hiredis.pack_command(cmd))
            continue
        small.append(b"*%d\r\n" % len(cmd))
        for a in cmd:
            a = _arg(a)
            if len(a) > BIG_ARG:
                small.append(b"$%d\r\n" % len(a))
                out.append(b"".join(small))
                out.append(a)
                small = [b"\r\n"]
            else:
                small.append(b"$%d\r\n%s\r\n" % (len(a), a))
    if small:
        out.append(b"".join(small))
    return out


#: Buffers one ``sendmsg`` takes at most (Linux's ``IOV_MAX``).
IOV_MAX = 1024


def _send_pieces(sock: Any, pieces: list[bytes | memoryview]) -> None:
    """Send ``pieces`` in order with as few system calls as the socket takes: one ``sendmsg``
    of them all (a commit of many values, each its own buffer) where it accepts, each one
    ``sendall`` on a TLS socket (no ``sendmsg``). A system call each let go of the GIL, which
    one of 15 other request threads may take before this one has sent its commit."""
    if isinstance(sock, ssl.SSLSocket):
        for piece in pieces:
            sock.sendall(piece)
        return
    views = [memoryview(p).cast("B") for p in pieces]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        if sent:
            views[0] = views[0][sent:]


class Link:
    """One connection held by one thread across its transactions (no pool round trip per
    transaction). Commands of a call are sent in one write and every reply is read (one round
    trip); replies are parsed by hiredis straight from the socket.

    ``unwatch`` defers the ``UNWATCH`` that a write transaction ending without ``EXEC`` owes:
    it goes in front of the next call on this connection instead of costing a round trip."""

    def __init__(self, driver: LinkOwner) -> None:
        self.driver = driver
        self.pool = driver.pool
        try:
            self.conn = self.pool.get_connection()
        except Exception as exc:
            raise translate(exc, driver.where) from exc
        self.generation = _fork_generation
        self.busy = False
        self.extra = False
        self.broken = False
        self.unwatch = False
        #: The token of the change feed connection it tracks into (see ``feed``), or None.
        self.tracked: object = None
        self.used = time.monotonic()
        protocol = getattr(self.conn, "protocol", 2)
        self.sock = getattr(self.conn, "_sock", None)
        self.fast = hiredis is not None and self.sock is not None and str(protocol) == "2"
        if self.fast:
            self.reader = hiredis.Reader(replyError=rexc.ResponseError)
            self.buf = bytearray(1 << 18)
            self.spin = SPIN
            self.sock.settimeout(driver.timeout)  # sends and a TLS record's rest: bounded too
            # Polled for a reply, with the request loop's /dev/fuse once the driver has one
            # (the daemon gives it after the driver opened, see _wait).
            self.poller = select.poll()
            self.poller.register(self.sock, select.POLLIN)
            self.watch: Any = None
            self.watch_fd: int | None = None

    def usable(self, suspect: float = 0.0) -> bool:
        """Whether this link can serve a new transaction (checks an idle socket for a close,
        and any socket last used before ``suspect``, when another link found the server gone)."""
        if self.broken or self.generation != _fork_generation:
            return False
        now = time.monotonic()
        if now - self.used > IDLE_CHECK or self.used < suspect:
            sock = self.sock if self.fast else getattr(self.conn, "_sock", None)
            try:
                if sock is None or select.select([sock], [], [], 0)[0]:
                    return False  # closed by the server (or stray data): reconnect
            except (OSError, ValueError):
                return False
        self.used = now
        return True

    def call(
        self,
        commands: Sequence[tuple[Any, ...]],
        big: bool = False,
        alongside: Callable[[], Any] | None = None,
    ) -> list[Any]:
        """Send ``commands`` pipelined; return their replies (error replies as exceptions).
        ``big``: some arguments may be long values (a commit), sent without copying them.
        ``alongside()`` is called once they are sent, before their replies are read: other
        servers' calls (a spread hierarchy's parts) then share this round trip."""
        if self.unwatch:
            commands = [("UNWATCH",), *commands]
        try:
            if self.fast:
                replies = self._call_fast(commands, big, alongside)
            else:
                replies = self._call_slow(commands, alongside)
        except StalledError as exc:
            self.broken = True
            names = " ".join(str(c[0]) for c in commands[:8])
            raise StalledError(f"{exc}; the call sent {len(commands)} commands: {names}") from exc
        except BaseException as exc:
            # Replies may be left unread (even on KeyboardInterrupt): never reuse the socket.
            self.broken = True
            if isinstance(exc, Exception):
                raise translate(exc, self.driver.where) from exc
            raise
        if self.unwatch:
            self.unwatch = False
            del replies[0]
        watch = self.driver.watch
        if watch is not None:  # a whole exchange: a reader a writer made stale runs again
            watch.restart()
        return replies

    def _call_fast(self, commands: Sequence[tuple[Any, ...]], big: bool, alongside: Any = None) -> list[Any]:
        sock = self.sock
        if big:
            _send_pieces(sock, _pack_big(commands))
        else:
            pack = hiredis.pack_command
            sock.sendall(b"".join([pack(c) for c in commands]))
        if alongside is not None:
            alongside()
        n = len(commands)
        replies: list[Any] = []
        reader, buf = self.reader, self.buf
        lead = n - 1
        if lead == 0 or all(commands[i][0] in _LEADING for i in range(lead)):
            # A lone reply (behind its WATCH) may be a large value: received straight into its
            # own buffer, the +OKs in front checked here.
            got = self._receive(sock, buf)
            at = len(_OK) * lead
            while 0 < got < at + 4:
                more = self._receive(sock, memoryview(buf)[got:])
                if not more:
                    break
                got += more
            if got >= at and buf[:at] == _OK * lead:
                big = _big_bulk(buf, got, at)
                if big is not None:
                    return [b"OK"] * lead + [self._bulk(sock, buf, got, *big)]
            if not got:
                raise rexc.ConnectionError("the server closed the connection")
            reader.feed(buf, 0, got)
        while len(replies) < n:
            reply = reader.gets()
            if reply is False:
                got = self._receive(sock, buf)
                if not got:
                    raise rexc.ConnectionError("the server closed the connection")
                reader.feed(buf, 0, got)
            else:
                replies.append(reply)
        return replies

    def _bulk(self, sock: Any, buf: bytearray, got: int, start: int, size: int) -> bytearray:
        """The value of a bulk reply of ``size`` bytes whose first ``got`` bytes are in
        ``buf`` (its data from ``start``): read into a buffer of its own, copied once."""
        value = bytearray(size + 2)  # and the reply's closing CRLF
        have = min(got - start, size + 2)
        value[:have] = memoryview(buf)[start : start + have]
        view = memoryview(value)
        while have < size + 2:
            more = self._receive(sock, view[have:])
            if not more:
                raise rexc.ConnectionError("the server closed the connection")
            have += more
        view.release()
        if got - start > size + 2 or value[size:] != b"\r\n":
            raise rexc.InvalidResponse("a bulk reply of another length than it said")
        del value[size:]
        return value

    def _receive(self, sock: Any, buf: Any) -> int:
        """``recv_into`` that first polls the socket for up to ``spin`` seconds, then sleeps
        until the reply comes, the driver's ``timeout`` passes (:class:`StalledError`), or the
        request being served is interrupted (the driver's ``watch``, see
        :mod:`zarrfs.fuse.interrupts`, raises :class:`InterruptedCallError`).

        A reply from a server on the same machine comes back quickly, but a thread that sleeps
        for it pays about as much again to be woken on another CPU (docs/performance.md). So
        the link polls for a short while before it sleeps. The window adapts as the request loop's
        does: a reply that came within :data:`SPIN` makes it full again, a slower one (a remote
        server, a large value) halves it, down to never spinning."""
        clock = time.perf_counter
        start = clock()
        if self.spin:
            timeout = sock.gettimeout()
            sock.settimeout(0.0)
            try:
                while True:
                    try:
                        got = sock.recv_into(buf)
                    except (BlockingIOError, ssl.SSLWantReadError):
                        if clock() - start > self.spin:
                            break
                    else:
                        self.spin = SPIN
                        return got
            finally:
                sock.settimeout(timeout)
        got = self._wait(sock, buf, start)
        self.spin = next_window(self.spin, clock() - start, SPIN)
        return got

    def _wait(self, sock: Any, buf: bytearray, start: float) -> int:
        """Sleep until the socket is readable, then read it; the loop's requests that come
        meanwhile are queued by the watch, an INTERRUPT of the request being served ends the
        wait. Never longer than the driver's ``timeout``: a paused or partitioned server holds
        the single request thread, and so the whole mount, for that long at most."""
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return sock.recv_into(buf)  # decrypted bytes already held: poll would not see them
        deadline = start + self.driver.timeout
        sock_fd = sock.fileno()
        watch = self.driver.watch
        watch_fd = None if watch is None else watch.fileno()  # per thread with several
        if watch_fd != self.watch_fd:
            if self.watch_fd is not None:  # the mount ended (or another thread waits)
                self.poller.unregister(self.watch_fd)
            if watch_fd is not None:
                self.poller.register(watch_fd, select.POLLIN)
            self.watch_fd = watch_fd
        self.watch = watch
        polls, seen = 0, None  # for the message below: how the wait went
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                if any(fd == sock_fd for fd, _events in self.poller.poll(0)):
                    # The reply came: the wait itself was held past the deadline (a poll
                    # woken for something else, then the lock taken back late).
                    log.warning(
                        "%s: a reply found %.1f s past the wait's deadline: %d polls, the last saw %s"
                        " (socket %d)",
                        self.driver.where, -left, polls, seen, sock_fd,
                    )
                    return sock.recv_into(buf)
                raise StalledError(
                    f"{self.driver.where}: no reply within {self.driver.timeout:g} s (-o timeout=);"
                    f" {_readable(sock_fd)} bytes readable on the socket now; {polls} polls, the last"
                    f" saw {seen} (socket {sock_fd}, watch {watch_fd})"
                )
            watch, ms = self.watch, left * 1000 + 1
            seen = self.poller.poll(ms) if watch is None else watch.poll(self.poller, ms)
            polls += 1
            for fd, _events in seen:
                if fd == sock_fd:
                    return sock.recv_into(buf)
                if self.watch is not None:
                    self.watch.check()  # raises when this request was interrupted

    def _call_slow(self, commands: Sequence[tuple[Any, ...]], alongside: Any = None) -> list[Any]:
        conn = self.conn
        conn.send_packed_command(conn.pack_commands(commands))
        if alongside is not None:
            alongside()
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except rexc.ResponseError as exc:
                replies.append(exc)
        return replies

    def checked(
        self, commands: Sequence[tuple[Any, ...]], alongside: Callable[[], Any] | None = None
    ) -> list[Any]:
        """:meth:`call`, raising the first error reply."""
        replies = self.call(commands, alongside=alongside)
        for reply in replies:
            if isinstance(reply, Exception):
                raise translate(reply, self.driver.where)
        return replies

    def close(self) -> None:
        """Disconnect and give the connection back to the pool."""
        self.broken = True
        try:
            self.conn.disconnect()
        finally:
            self.pool.release(self.conn)


class Links:
    """A driver's links: one per thread for reading, kept across its transactions, and one
    for writing, shared by the threads (writers run one at a time, ``fuse.admission``): the
    one connection that tracks into the change feed (``feed``), so that with ``NOLOOP`` the
    server reports no write of this mount back to it however many threads read."""

    def __init__(self, driver: LinkOwner) -> None:
        self.driver = driver
        self.closed = False
        self._local = threading.local()
        self._writing = _Slot()
        # Taking the writing link is checked and marked under a lock: writers run one at a
        # time, but a feed's route check (``check_route``) or a one-shot helper may ask for
        # it from another thread, and two that both found it free would share its socket
        # (one reading the other's reply; the other waiting out the timeout).
        self._taking = threading.Lock()
        # When a link last broke: the other links' sockets are looked at before their next use
        # (the server may have restarted: the reading and the writing link are both stale).
        self._suspect = 0.0

    def acquire(self, write: bool = True) -> Link:
        """The link for a transaction (``write``: the writing link, else the calling thread's),
        or a link of its own for one started while that link is in use (a one-shot helper
        called inside a transaction)."""
        if self.closed:
            raise UnavailableError(f"{self.driver.where}: the driver is closed")
        if write:
            with self._taking:
                return self._take(self._writing)
        return self._take(self._local)

    def _take(self, slot: Any) -> Link:
        """The link kept in ``slot`` marked busy, a new one kept there, or an extra one."""
        link = getattr(slot, "link", None)
        if link is not None and not link.busy and link.usable(self._suspect):
            link.busy = True
            return link
        if link is not None and link.busy:
            extra = self._connect()
            extra.busy = True
            extra.extra = True
            return extra
        if link is not None:
            self.drop(link)
        link = self._connect()
        link.busy = True
        slot.link = link
        return link

    def _connect(self) -> Link:
        """A new link; failing to connect makes the links held suspect, as a break does (the
        server may have gone since they were last used: a restart closed their sockets)."""
        try:
            return Link(self.driver)
        except UnavailableError:
            self._suspect = time.monotonic()
            raise

    def release(self, link: Link) -> None:
        """Give ``link`` back after a transaction (an extra link goes back to the pool)."""
        link.busy = False
        if link.extra:
            if link.unwatch and not link.broken:
                try:
                    link.call([])  # sends the owed UNWATCH
                except BackendError:
                    pass
            if link.broken:
                link.conn.disconnect()
            link.pool.release(link.conn)
        elif link.broken:
            self.drop(link)

    def drop(self, link: Link) -> None:
        """Close a broken link and forget it."""
        self._suspect = time.monotonic()
        for slot in (self._local, self._writing):
            if getattr(slot, "link", None) is link:
                slot.link = None
        if link.generation != _fork_generation:
            return  # the parent process's socket: leave it to the parent
        try:
            link.close()
        except Exception:  # noqa: BLE001 - a dead connection may fail to close cleanly
            pass


class _Slot:
    """Where the writing link is kept."""

    link: Link | None = None


@contextmanager
def translated(where: str) -> Iterator[None]:
    """Turn redis-py exceptions (and socket errors) into the driver interface's classes."""
    try:
        yield
    except BackendError:
        raise
    except Exception as exc:
        if isinstance(exc, (rexc.RedisError, OSError)):
            raise translate(exc, where) from exc
        raise

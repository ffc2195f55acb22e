"""A TCP proxy on 127.0.0.1 that delays every segment, counts round trips and can stall: a server
"across a network" for the tests and ``scripts/bench_network.py``. It runs in a process of its
own (standard library only) and takes JSON on its stdin; see :class:`DelayProxy`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

#: A PostgreSQL reading transaction's ``COMMIT`` sent alone (extended or simple protocol): with
#: the change feed it goes with the next transaction, or alone once its connection was idle
#: 0.1 s (each request thread has its own). No call waits for the latter, and a busy machine
#: spaces the calls out enough to make one after each: counts of calls leave them out
#: (:meth:`DelayProxy.idle`).
POSTGRES_IDLE_COMMITS = (b"P\x00\x00\x00\x0e\x00COMMIT\x00", b"Q\x00\x00\x00\x0bCOMMIT\x00")


class DelayProxy:
    """The parent's handle on a proxy process; see docs/architecture.md. Use as a context
    manager, or call :meth:`close`."""

    def __init__(self, rtt_ms: float = 0.0, lifetime: float = 900.0, max_connections: int = 512,
                 max_buffered: int = 16 << 20) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(rtt_ms), str(lifetime), str(max_connections),
             str(max_buffered)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._ask("ping")

    def _ask(self, *command):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the delaying proxy has stopped")
        return json.loads(line)

    def route(self, port: int, host: str = "127.0.0.1", listen: int = 0) -> int:
        """Forward a new listening port (``listen``, or a free one) of 127.0.0.1 to ``host:port``;
        return the listening port."""
        return self._ask("route", host, port, listen)

    def set_rtt(self, rtt_ms: float) -> None:
        """Delay segments from now on by ``rtt_ms / 2`` in each direction."""
        self._ask("rtt", rtt_ms)

    def round_trips(self) -> int:
        """Round trips (request bursts) forwarded since the start or the last :meth:`reset`."""
        return self._ask("count")

    def reset(self) -> None:
        """Start counting round trips from zero."""
        self._ask("reset")

    def idle(self, *marks: bytes) -> None:
        """From now on, leave out of :meth:`round_trips` a burst that is small (64 bytes at
        most), starts with one of ``marks`` and holds no ``BEGIN``: work no call waits for,
        which a busy machine makes more of (a burst is told apart once its reply comes)."""
        self._ask("idle", [m.decode("latin-1") for m in marks])

    def waves(self) -> int:
        """Round trips begun while no other connection waited for a reply, since the start or
        the last :meth:`reset`: requests sent to several servers at once count once."""
        return self._ask("waves")

    def overlap(self) -> int:
        """The most connections that waited for a reply at once since the start or the last
        :meth:`reset` (a connection waits from its request's first byte to its reply's)."""
        return self._ask("overlap")

    def hold(self, match: bytes | None = None) -> None:
        """Stop forwarding requests: all of them (``match`` None), or those whose data contains
        ``match`` and whatever follows them on their connection."""
        self._ask("hold", None if match is None else match.decode("latin-1"))

    def held(self) -> int:
        """How many connections have data held now."""
        return self._ask("held")

    def release(self) -> None:
        """Forward what was held, and everything from now on."""
        self._ask("release")

    def measure(self, port: int, rounds: int = 20) -> float:
        """The median round trip, in milliseconds, of a one-byte echo through the proxy to
        ``port`` (sends a Redis ``PING``: any server that answers a line will do)."""
        times = []
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(rounds):
                t0 = time.perf_counter()
                s.sendall(b"PING\r\n")
                s.recv(64)
                times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        return times[len(times) // 2]

    def close(self) -> None:
        """Stop the proxy (its connections are closed)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # EOF: the proxy stops
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------- the proxy process


class _Proxy:
    def __init__(self, rtt_ms: float, max_connections: int, max_buffered: int) -> None:
        self.set_rtt(rtt_ms)
        self.max_connections = max_connections
        self.max_buffered = max_buffered
        self.bursts = 0
        self.waves = 0  # bursts begun while no connection waited
        self.idle_bursts = 0  # bursts matching ``idle_marks``, left out of the count
        self.idle_marks: tuple[bytes, ...] = ()
        self.waiting = self.most_waiting = 0  # connections waiting for a reply; the most at once
        self.connections: set[_Connection] = set()
        self.servers: list[asyncio.AbstractServer] = []
        self.hold_all = False
        self.hold_match: bytes | None = None
        self.released = asyncio.Event()
        self.released.set()

    async def route(self, host: str, port: int, listen: int) -> int:
        async def accept(reader, writer):
            if len(self.connections) >= self.max_connections:
                writer.close()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            for w in (writer, up_writer):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, reader, writer, up_reader, up_writer)
            self.connections.add(conn)
            try:
                await conn.run()
            except asyncio.CancelledError:
                pass
            finally:
                self.connections.discard(conn)

        server = await asyncio.start_server(accept, "127.0.0.1", listen)
        self.servers.append(server)
        return server.sockets[0].getsockname()[1]

    def set_rtt(self, rtt_ms: float) -> None:
        up = int(rtt_ms / 2)
        self.delays = ((rtt_ms - up) / 1000, up / 1000)  # (replies, requests)

    def hold(self, match: str | None) -> None:
        self.released.clear()
        if match is None:
            self.hold_all = True
        else:
            self.hold_match = match.encode("latin-1")

    def release(self) -> None:
        self.hold_all = False
        self.hold_match = None
        for conn in self.connections:
            conn.holding = False
        self.released.set()


class _Connection:
    """One client connection and its server connection: two delayed pumps."""

    def __init__(self, proxy: _Proxy, reader, writer, up_reader, up_writer) -> None:
        self.proxy = proxy
        self.client_sent_last = False  # the last data on this connection went to the server
        self.holding = False  # held data is queued towards the server
        self.burst = b""  # the first bytes of the burst being sent (up to 65)
        self.pumps = (
            _Pump(self, reader, up_writer, to_server=True),
            _Pump(self, up_reader, writer, to_server=False),
        )

    async def run(self) -> None:
        tasks = [asyncio.ensure_future(p.run()) for p in self.pumps]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for p in self.pumps:
            p.writer.close()
        if self.client_sent_last:  # closed while waiting
            self.client_sent_last = False
            self.proxy.waiting -= 1

    def arrived(self, data: bytes, to_server: bool) -> None:
        proxy = self.proxy
        if to_server:
            if not self.client_sent_last:
                proxy.bursts += 1
                if not proxy.waiting:
                    proxy.waves += 1
                proxy.waiting += 1
                proxy.most_waiting = max(proxy.most_waiting, proxy.waiting)
                self.burst = b""
            if len(self.burst) <= 64:
                self.burst += data[: 65 - len(self.burst)]
            self.client_sent_last = True
            if proxy.hold_all or (proxy.hold_match is not None and proxy.hold_match in data):
                self.holding = True
        else:
            if self.client_sent_last:
                proxy.waiting -= 1
                burst, marks = self.burst, proxy.idle_marks
                if marks and len(burst) <= 64 and burst.startswith(marks) and b"BEGIN" not in burst:
                    proxy.idle_bursts += 1
            self.client_sent_last = False


class _Pump:
    def __init__(self, conn: _Connection, reader, writer, to_server: bool) -> None:
        self.conn = conn
        self.reader = reader
        self.writer = writer
        self.to_server = to_server
        self.queue: asyncio.Queue = asyncio.Queue()
        self.buffered = 0
        self.drained = asyncio.Event()

    async def run(self) -> None:
        sender = asyncio.ensure_future(self._send())
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                self.conn.arrived(data, self.to_server)
                self.buffered += len(data)
                due = loop.time() + self.conn.proxy.delays[self.to_server]
                self.queue.put_nowait((due, data, self.conn.holding))
                while self.buffered > self.conn.proxy.max_buffered:
                    self.drained.clear()
                    await self.drained.wait()
            self.queue.put_nowait((0.0, b"", False))
            await sender
        finally:
            sender.cancel()

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        proxy = self.conn.proxy
        while True:
            due, data, held = await self.queue.get()
            if not data:
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if held:
                await proxy.released.wait()
            self.writer.write(data)
            await self.writer.drain()
            self.buffered -= len(data)
            self.drained.set()


async def _main(rtt_ms: float, lifetime: float, max_connections: int, max_buffered: int) -> None:
    loop = asyncio.get_running_loop()
    proxy = _Proxy(rtt_ms, max_connections, max_buffered)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    deadline = loop.time() + lifetime

    def answer(value) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    while True:
        try:
            line = await asyncio.wait_for(reader.readline(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            break  # lived long enough
        if not line:
            break  # the parent is gone
        command, *args = json.loads(line)
        if command == "ping":
            answer(True)
        elif command == "route":
            answer(await proxy.route(*args))
        elif command == "rtt":
            proxy.set_rtt(args[0])
            answer(True)
        elif command == "count":
            answer(proxy.bursts - proxy.idle_bursts)
        elif command == "idle":
            proxy.idle_marks = tuple(m.encode("latin-1") for m in args[0])
            answer(True)
        elif command == "waves":
            answer(proxy.waves)
        elif command == "overlap":
            answer(proxy.most_waiting)
        elif command == "reset":
            proxy.bursts = proxy.idle_bursts = proxy.waves = 0
            proxy.most_waiting = proxy.waiting
            answer(True)
        elif command == "hold":
            proxy.hold(args[0])
            answer(True)
        elif command == "held":
            answer(sum(1 for c in proxy.connections if c.holding))
        elif command == "release":
            proxy.release()
            answer(True)
        else:
            answer(None)
    for server in proxy.servers:
        server.close()
    for conn in list(proxy.connections):
        for p in conn.pumps:
            p.writer.close()


if __name__ == "__main__":
    asyncio.run(_main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))

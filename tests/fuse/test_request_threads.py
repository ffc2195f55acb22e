"""Request threads (``fuse.workers``) on a socket pair standing for ``/dev/fuse`` (one request a
message, as the device gives them): one thread reads and serves at a time, and a thread about
to wait (its server's answer, its turn) lets another read the next request meanwhile."""

from __future__ import annotations

import os
import socket
import struct
import threading

from zarrfs.fuse import abi as k
from zarrfs.fuse.workers import Workers

WAIT = 30  # seconds: a condition waited for, not a bound on speed
_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding


def _request(unique: int, node: int) -> bytes:
    return _HEADER.pack(_HEADER.size, k.GETATTR, unique, node, 0, 0, 0, 0) + bytes(16)


class _Device:
    """A socket pair: the workers read one end, the test writes requests into the other."""

    def __init__(self, handle, threads: int = 16) -> None:
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.fd = theirs.detach()
        self.workers = Workers(self.fd, handle, lambda data, node: node, 1 << 16, count=threads)
        self.threads = [threading.Thread(target=self.workers._serve, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def send(self, unique: int, node: int) -> None:
        self.ours.send(_request(unique, node))

    def close(self) -> None:
        self.ours.close()  # the threads read end of file, and end
        for t in self.threads:
            t.join(WAIT)
        os.close(self.fd)
        assert not any(t.is_alive() for t in self.threads)


def test_requests_that_never_wait_are_all_served_by_the_thread_that_read_them():
    """Before, every thread read the device at once, and requests queued together were served
    by as many threads, each handing the GIL and the filesystem lock to the next at every
    system call (docs/performance.md, "Request threads: one reads at a time")."""
    served: list[int] = []
    done = threading.Event()
    count = 400

    def handle(data: memoryview) -> None:
        served.append(threading.get_ident())
        if len(served) == count:
            done.set()

    device = _Device(handle)
    try:
        for i in range(count):
            device.send(2 * (i + 1), 1 + i % 7)
        assert done.wait(WAIT)
        assert len(set(served)) == 1
    finally:
        device.close()


def test_a_request_waiting_on_its_server_lets_another_thread_read_and_serve_the_next():
    """The first request waits (with the filesystem lock let go, as a driver waits for its
    server) until the second has been served: only another thread can read the second."""
    second = threading.Event()
    first_saw: list[bool] = []
    served: dict[int, int] = {}
    done = threading.Event()

    def handle(data: memoryview) -> None:
        node = _HEADER.unpack_from(data)[3]
        served[node] = threading.get_ident()
        if node == 1:
            with device.workers.waits.released():
                first_saw.append(second.wait(WAIT))
            done.set()
        else:
            second.set()

    device = _Device(handle)
    try:
        device.send(2, 1)
        device.send(4, 2)
        assert done.wait(WAIT)
        assert first_saw == [True]
        assert served[1] != served[2]
    finally:
        device.close()

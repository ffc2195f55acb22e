"""Requests that arrive while the request thread waits on a server, and FUSE_INTERRUPT: an
interrupt of the request served ends it with ``EINTR``, others are queued, and a long wait
answers the queued requests that need no write (docs/architecture.md, "Design notes by module")."""

from __future__ import annotations

import errno
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from zarrfs.fs.api import InterruptedCallError
from zarrfs.fuse import abi as k

_OPCODE_UNIQUE = struct.Struct("<IIQ")  # len, opcode, unique: the start of every request
_NODE = struct.Struct("<16xQ")  # the node a request is about


class Watch:
    """What arrived on ``fd`` while a request was being served (docs/architecture.md)."""

    def __init__(self, fd: int, buffer_size: int) -> None:
        self.fd = fd
        self.buffer_size = buffer_size
        self.unique = 0  # the request being served (set by the dispatcher)
        self.node = 0  # the node it is about
        self.pending: deque[bytes] = deque()
        self._buf: bytearray | None = None  # a request buffer of its own, made when first needed
        # Set by the session: the dispatch of a request, and whether one needs no write.
        self.serve: Callable[[memoryview], None] | None = None
        self.may_serve: Callable[[bytes], bool] | None = None
        self._serving = False

    def fileno(self) -> int:
        """The descriptor to poll: ``/dev/fuse``."""
        return self.fd

    def check(self) -> None:
        """Read every request that is waiting; raise :class:`InterruptedCallError` when one is
        an INTERRUPT of the request being served (or when the mount is gone)."""
        if self._buf is None:
            self._buf = bytearray(self.buffer_size)
        buf = self._buf
        interrupted = gone = False
        while True:
            try:
                n = os.readv(self.fd, [buf])
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # a request interrupted before it was read
                    continue
                gone = True  # ENODEV: unmounted; the loop sees it too and ends
                break
            if n == 0:
                gone = True
                break
            if n < k.IN_HEADER_SIZE:
                continue  # the loop would refuse it too; nothing to answer to
            _len, opcode, _unique = _OPCODE_UNIQUE.unpack_from(buf)
            if opcode == k.INTERRUPT and n >= k.IN_HEADER_SIZE + k.INTERRUPT_IN.size:
                (target,) = k.INTERRUPT_IN.unpack_from(buf, k.IN_HEADER_SIZE)
                if target == self.unique:
                    interrupted = True
                else:
                    self._cancel_pending(target)
            else:
                self.pending.append(bytes(memoryview(buf)[:n]))
        if interrupted:
            raise InterruptedCallError("interrupted by the caller (FUSE_INTERRUPT)")
        if gone:
            raise InterruptedCallError("the mount is gone")

    def poll(self, poller, timeout_ms: float) -> list[tuple[int, int]]:
        """A driver's wait: ``poller.poll`` (with several request threads the watch also lets
        other requests run meanwhile, ``fuse.workers.Waits``)."""
        return poller.poll(timeout_ms)

    def sleep(self, seconds: float) -> None:
        """A driver's pause between attempts."""
        time.sleep(seconds)

    def restart(self) -> None:
        """After a driver's exchange: with one thread no reader is ever run again."""

    def released(self) -> AbstractContextManager[None]:
        """Around a wait in a client's own code: nothing to let go of with one thread."""
        return nullcontext()

    def before_write(self) -> None:
        """A write transaction begins (one request at a time here: nothing to wait for)."""

    def serve_waiting(self) -> None:
        """While the request being served waits (for a lock another program holds, between the
        parts of a large file): read what arrived (as :meth:`check`) and answer the requests
        that need no write and are about another node than the one being served (a reader's
        close of that file could let go of the buffer its commit is reading)."""
        if self.serve is None or self.may_serve is None or self._serving:
            return
        self.check()
        if not self.pending:
            return
        outer, node = self.unique, self.node
        self._serving = True
        try:
            for data in [d for d in self.pending if _NODE.unpack_from(d)[0] != node and self.may_serve(d)]:
                self.pending.remove(data)
                self.serve(memoryview(data))
        finally:
            self._serving = False
            self.unique, self.node = outer, node

    def _cancel_pending(self, target: int) -> None:
        """Answer the queued request ``target`` with EINTR and drop it (not served yet)."""
        for i, data in enumerate(self.pending):
            if _OPCODE_UNIQUE.unpack_from(data)[2] == target:
                del self.pending[i]
                try:
                    os.write(self.fd, k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, -errno.EINTR, target))
                except OSError:
                    pass  # gone meanwhile
                return

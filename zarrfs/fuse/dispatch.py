"""The dispatch of FUSE requests: the opcode table, the checks before a handler runs, the
error replies and the counters.

Every request the kernel sends passes here (:meth:`Dispatcher.handle`), so this is the hot path
of every call: the opcode indexes lists built once (handler, shortest valid length, whether it
is answered), the header is unpacked into a :class:`~zarrfs.fuse.abi.Header` without a Python
call, and the counters are list slots. A request shorter than its header and input struct,
longer than what was read, or whose names are not NUL-terminated in it, is refused with EINVAL
and one log line; the session goes on. :class:`zarrfs.fuse.session.Session` adds the handlers;
replies are written by :class:`~zarrfs.fuse.replies.Replies`.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from zarrfs.fs.api import RestartedError, is_quiet, log_level, to_errno
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header
from zarrfs.fuse.interrupts import Watch
from zarrfs.fuse.replies import Replies

log = logging.getLogger("zarrfs.fuse.dispatch")

Handler = Callable[[Header, memoryview], None]

_TABLE = k.TABLE_SIZE  # the slot of every opcode beyond the table
# The header is unpacked into a plain tuple and given its field names without a Python call
# (Header._make is one): this runs for every request.
_unpack_header = k.IN_HEADER.unpack_from
_new_header = tuple.__new__
_clock = time.perf_counter_ns


class Dispatcher:
    """Hands each request read from ``fd`` to its handler in ``handlers`` (opcode -> handler,
    one for each opcode of :data:`~zarrfs.fuse.abi.OPCODES`); others get ENOSYS. A handler
    answers, or raises: the exception becomes the error reply."""

    def __init__(self, fd: int, handlers: Mapping[int, Handler], buffer_size: int = 2 << 20) -> None:
        self.fd = fd
        self.replies = Replies(fd)
        # How the handlers answer, bound once here: every request sends one.
        self._send = self.replies.send
        self._reply_ok = self.replies.ok
        self._reply_data = self.replies.data
        # Requests and interrupts that arrive while a handler waits on a server (see
        # zarrfs.fuse.interrupts): the loop serves its queue, the driver polls it.
        self.watch = Watch(fd, buffer_size)
        # Lists indexed by opcode (slot _TABLE for any larger one): the dispatch indexes them.
        self._handlers: list[Handler] = [self._unknown] * (_TABLE + 1)
        self._min_len = [k.IN_HEADER_SIZE] * (_TABLE + 1)
        self._answered = [True] * (_TABLE + 1)
        self._names = [k.UNSERVED_NAMES.get(code, f"opcode_{code}") for code in range(_TABLE)] + ["unknown"]
        for code, handler in handlers.items():
            op = k.OPCODES[code]
            self._handlers[code] = handler
            self._min_len[code] = k.min_length(op)
            self._answered[code] = op.answered
            self._names[code] = op.name
        self._requests = [0] * (_TABLE + 1)
        self._errors = [0] * (_TABLE + 1)
        self._busy_ns = [0] * (_TABLE + 1)  # time spent answering, by opcode (zarrfs stats)
        self.bytes_read = self.bytes_written = 0  # by the handlers of READ and WRITE
        # ZARRFS_REQUEST_CPU=1: each request's thread CPU time, by type (scripts/bench_ops.py);
        # off by default, as the clock costs two system calls a request.
        self._cpu_ns: list[int] | None = None
        if os.environ.get("ZARRFS_REQUEST_CPU"):
            self._cpu_ns = [0] * (_TABLE + 1)
            self.handle = self._timed_handle  # type: ignore[method-assign]

    def _unknown(self, head: Header, buf: memoryview) -> None:
        self._reply_error(head, errno.ENOSYS)

    # ------------------------------------------------------------------ dispatch
    def handle(self, buf: memoryview) -> None:
        """Answer the request at the start of ``buf`` (which may run past its end)."""
        try:
            head: Header = _new_header(Header, _unpack_header(buf))
        except struct.error:  # not even a header: no request ID to answer to
            log.warning("a request of %d bytes, shorter than a header, ignored", len(buf))
            return
        op = head.opcode
        if op >= _TABLE:
            op = _TABLE
        self._requests[op] += 1
        watch = self.watch
        watch.unique, watch.node = head.unique, head.nodeid
        started = _clock()
        try:
            length = head.len
            if length < self._min_len[op] or length > len(buf):
                raise k.Malformed(f"length {length}: {self._min_len[op]} at least, {len(buf)} read")
            self._handlers[op](head, buf)
        except RestartedError:
            raise  # run again by fuse.workers, not answered
        except Exception as exc:
            self._failed(head, op, exc, buf)
        self._busy_ns[op] += _clock() - started

    def _timed_handle(self, buf: memoryview) -> None:
        """:meth:`handle`, its thread's CPU time added to its request type's."""
        start = time.thread_time_ns()
        try:
            Dispatcher.handle(self, buf)
        finally:
            op = _unpack_header(buf)[1] if len(buf) >= k.IN_HEADER_SIZE else _TABLE
            self._cpu_ns[op if op < _TABLE else _TABLE] += time.thread_time_ns() - start  # type: ignore[index]

    @contextmanager
    def _answering(self, op: int, count: int) -> Iterator[None]:
        """Around requests answered together, not through :meth:`handle` (a group of closes,
        ``Session.flushes``): ``count`` requests of type ``op`` counted, and the time (with
        ZARRFS_REQUEST_CPU the thread's CPU too) spent answering them, as :meth:`handle`
        counts one's."""
        self._requests[op] += count
        cpu = self._cpu_ns
        started, thread_started = _clock(), (time.thread_time_ns() if cpu is not None else 0)
        try:
            yield
        finally:
            self._busy_ns[op] += _clock() - started
            if cpu is not None:
                cpu[op] += time.thread_time_ns() - thread_started

    def _failed(self, head: Header, op: int, exc: Exception, buf: memoryview | None = None) -> None:
        # One log line at most, never a traceback: a malformed request says what was wrong
        # with it, an error of a call what the caller hears (unless routine).
        what = self._names[op]
        if isinstance(exc, k.Malformed):
            log.warning("%s request refused (EINVAL): %s", what, exc)
            code = errno.EINVAL
        elif not self._answered[op]:
            log.error("%s: %s", what, exc)
            code = 0
        else:
            code = to_errno(exc)
            if not is_quiet(exc):
                level = log_level(exc)
                reason = errno.errorcode.get(code, code)
                log.log(level, "%s %s: %s (%s)", what, self._describe(head, buf), reason, exc)
        if self._answered[op]:
            self._reply_error(head, code)
        else:
            self._errors[op] += 1

    def stats(self) -> dict[str, dict[str, int]]:
        """Requests served, error replies sent and nanoseconds spent answering since the mount
        began, by request type (types never seen left out), and the bytes read and written:
        ``{"requests": {name: count}, "errors": ..., "busy_ns": ..., "bytes": {"read", "written"}}``;
        with ZARRFS_REQUEST_CPU, ``"cpu_us"`` too: their handlers' CPU time."""
        names = self._names
        figures = {
            "requests": {names[op]: n for op, n in enumerate(self._requests) if n},
            "errors": {names[op]: n for op, n in enumerate(self._errors) if n},
            "busy_ns": {names[op]: n for op, n in enumerate(self._busy_ns) if n},
            "bytes": {"read": self.bytes_read, "written": self.bytes_written},
        }
        if self._cpu_ns is not None:  # microseconds of CPU, by type (ZARRFS_REQUEST_CPU)
            figures["cpu_us"] = {names[op]: ns // 1000 for op, ns in enumerate(self._cpu_ns) if ns}
        return figures

    def _describe(self, head: Header, buf: memoryview | None = None) -> str:
        """What a request was about, for a log line: the node's path (a subclass knows it,
        :meth:`_path`), and for a request about a name in a folder (a lookup, a create, an
        unlink) the file's name too, not only the folder's."""
        where = self._path(head.nodeid)
        name = None if buf is None else k.request_name(head.opcode, buf, head.len)
        return where if name is None else where.rstrip("/") + "/" + name

    def _path(self, nodeid: int) -> str:
        return f"node {nodeid}"

    def _reply_error(self, head: Header, code: int) -> None:
        op = head.opcode
        self._errors[op if op < _TABLE else _TABLE] += 1
        self.replies.error(head.unique, code)

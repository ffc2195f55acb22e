"""The request loop: libfuse's session driven from here, spinning briefly before it sleeps.

Every FUSE request is a round trip: the client's thread sleeps until the daemon answers, and
the daemon sleeps on ``/dev/fuse`` until the next request. On many machines, waking a thread
that sleeps on another CPU is most of the cost of a round trip (on the 2-core VM of the
README, the daemon answered about 10,000 lookups/s from one client when it slept between
requests and over 30,000 when it did not). So after each request this loop keeps polling
``/dev/fuse`` for up to ``spin`` microseconds before it blocks: a client that sends its next
request within that window (a ``stat`` loop, a chunk written in pieces, create + write + close)
finds the daemon awake. The window adapts: when requests come further apart than ``spin`` it
halves after each of them, down to nothing, and it is full again as soon as a request follows
within ``spin``; an idle mount sleeps and costs no CPU. ``-o spin=0`` turns spinning off;
``scripts/bench_loop.py`` measures the choice.

:meth:`Loop.main` takes the place of ``fuse_main_real``: mfusepy builds the operations table
and hands it here. It serves from one thread, lets libfuse's handlers turn SIGINT, SIGTERM
and SIGHUP into the end of the session, and on the way out unmounts and destroys the session,
which runs the ``destroy`` operation.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable

import mfusepy

from zarrfs.backends._util import next_window

log = logging.getLogger("zarrfs.loop")

DEFAULT_SPIN_US = 200
# How long a sleeping loop waits before it looks at the session again (a signal delivered to
# another thread of the process ends the session without waking this one).
IDLE_POLL_MS = 500
# Command-line options of fuse_main that fuse_new does not take; this loop has one thread.
_LOOP_ONLY = ("max_threads", "max_idle_threads", "clone_fd")


class FuseArgs(ctypes.Structure):
    """``struct fuse_args``."""

    _fields_ = [
        ("argc", ctypes.c_int),
        ("argv", ctypes.POINTER(ctypes.c_char_p)),
        ("allocated", ctypes.c_int),
    ]


class FuseBuf(ctypes.Structure):
    """``struct fuse_buf``, with room to spare: libfuse fills it and owns its memory."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_int64),
        ("_reserved", ctypes.c_char * 64),
    ]


class PollFd(ctypes.Structure):
    """``struct pollfd``."""

    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


POLLIN = 0x001


def _bind():
    lib = mfusepy._libfuse
    new = getattr(lib, "fuse_new_31", None) or lib.fuse_new
    new.argtypes = [ctypes.POINTER(FuseArgs), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    new.restype = ctypes.c_void_p
    signatures = {
        "fuse_mount": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
        "fuse_unmount": ([ctypes.c_void_p], None),
        "fuse_destroy": ([ctypes.c_void_p], None),
        "fuse_get_session": ([ctypes.c_void_p], ctypes.c_void_p),
        "fuse_set_signal_handlers": ([ctypes.c_void_p], ctypes.c_int),
        "fuse_remove_signal_handlers": ([ctypes.c_void_p], None),
        "fuse_session_fd": ([ctypes.c_void_p], ctypes.c_int),
        "fuse_session_exited": ([ctypes.c_void_p], ctypes.c_int),
        "fuse_session_reset": ([ctypes.c_void_p], None),
        "fuse_session_receive_buf": ([ctypes.c_void_p, ctypes.POINTER(FuseBuf)], ctypes.c_int),
        "fuse_session_process_buf": ([ctypes.c_void_p, ctypes.POINTER(FuseBuf)], None),
    }
    funcs = {"fuse_new": new}
    for name, (argtypes, restype) in signatures.items():
        func = getattr(lib, name)
        func.argtypes = argtypes
        func.restype = restype
        funcs[name] = func
    return funcs


def split_argv(argv: list[bytes]) -> tuple[list[bytes], bytes]:
    """The arguments for ``fuse_new`` and the mountpoint, from mfusepy's ``fuse_main`` argv
    (``prog [-f] [-s] [-d] -o opts mountpoint``)."""
    args = [b"zarrfs"]
    mountpoint = argv[-1]
    words = iter(argv[1:-1])
    for word in words:
        if word == b"-o":
            opts = [o for o in next(words, b"").split(b",") if o.split(b"=")[0].decode() not in _LOOP_ONLY]
            if opts:
                args += [b"-o", b",".join(opts)]
        elif word == b"-d":
            args.append(b"-d")
        # -f (foreground) and -s (one thread) describe this loop already.
    return args, mountpoint


class Loop:
    """One mount's session and the loop serving it. ``on_ready`` runs once, after the first
    request (the kernel's INIT) is answered: the kernel has then applied the session's
    settings, and the mount serves."""

    def __init__(self, spin_us: float = DEFAULT_SPIN_US, on_ready: Callable[[], None] | None = None) -> None:
        self.spin = spin_us / 1e6
        self.on_ready = on_ready
        self.lib = _bind()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.poll.argtypes = [ctypes.POINTER(PollFd), ctypes.c_ulong, ctypes.c_int]
        self._libc.poll.restype = ctypes.c_int

    def main(self, argc: int, argv, ops, ops_size: int, user_data) -> int:
        """What ``fuse_main_real`` does, with this loop: returns 0 after a clean unmount."""
        words = [argv[i] for i in range(argc)]
        args, mountpoint = split_argv(words)
        arr = (ctypes.c_char_p * (len(args) + 1))(*args, None)
        fargs = FuseArgs(len(args), arr, 0)
        lib = self.lib
        fuse = lib["fuse_new"](ctypes.byref(fargs), ctypes.cast(ops, ctypes.c_void_p), ops_size, user_data)
        if not fuse:
            return 1
        try:
            if lib["fuse_mount"](fuse, mountpoint) != 0:
                return 2
            session = lib["fuse_get_session"](fuse)
            if lib["fuse_set_signal_handlers"](session) != 0:
                lib["fuse_unmount"](fuse)
                return 3
            try:
                self.serve(session)
            finally:
                lib["fuse_remove_signal_handlers"](session)
                lib["fuse_unmount"](fuse)
        finally:
            lib["fuse_destroy"](fuse)
        return 0

    def serve(self, session) -> None:
        """Receive and process requests until the session ends."""
        lib = self.lib
        receive, process = lib["fuse_session_receive_buf"], lib["fuse_session_process_buf"]
        exited = lib["fuse_session_exited"]
        fd = lib["fuse_session_fd"](session)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        buf = FuseBuf()
        pbuf = ctypes.byref(buf)
        pollfd = PollFd(fd, POLLIN, 0)
        longest = self.spin
        window = longest
        clock = time.perf_counter
        last = clock()
        poll = self._libc.poll
        eagain, eintr = -errno.EAGAIN, -errno.EINTR
        try:
            while not exited(session):
                res = receive(session, pbuf)
                if res > 0:
                    process(session, pbuf)
                    last = clock()
                    if self.on_ready is not None:
                        ready, self.on_ready = self.on_ready, None
                        ready()
                elif res == eagain:
                    if clock() - last > window:
                        poll(ctypes.byref(pollfd), 1, IDLE_POLL_MS)
                        now = clock()
                        window = next_window(window, now - last, longest)
                        last = now
                elif res == eintr:
                    continue
                elif res == 0:  # unmounted, or the connection was aborted
                    break
                else:
                    log.error("reading /dev/fuse failed: %s", os.strerror(-res))
                    break
        finally:
            if buf.mem:
                ctypes.CDLL(None).free(ctypes.c_void_p(buf.mem))
            lib["fuse_session_reset"](session)

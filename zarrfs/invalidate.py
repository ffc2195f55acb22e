"""Dropping the kernel's cached view of files the mount changed on its own.

When a metadata change makes the format layer rewrite (or create) a consolidated document, the
kernel may still hold that file's old size and pages, or a cached "no such file" for it: they
are kept for ``cache_timeout``. libfuse's ``fuse_invalidate_path`` drops attributes and pages
of a known file, and ``fuse_lowlevel_notify_inval_entry`` drops a (negative) name entry.

The request that caused the change waits for that before it is answered, so the caller's next
read sees the new document. The notifications are sent from a thread of their own, and the
wait is bounded: a notification can need a lock that the kernel holds until another request
(a read of that very file, queued behind this one) is answered; then the reply goes first and
the notification completes right after.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading

import mfusepy

log = logging.getLogger("zarrfs.invalidate")

FUSE_ROOT_ID = 1
WAIT = 0.1  # seconds a request waits for its notifications before it is answered anyway


class Invalidator:
    """The thread that sends invalidation notifications, and the queue that feeds it."""

    def __init__(self) -> None:
        lib = mfusepy._libfuse
        self._session: int | None = None
        self._fuse: int | None = None
        self._queue: queue.SimpleQueue[tuple[list[str], threading.Event] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._path = getattr(lib, "fuse_invalidate_path", None)
        self._entry = getattr(lib, "fuse_lowlevel_notify_inval_entry", None)
        self._get_session = getattr(lib, "fuse_get_session", None)
        if self._path is not None:
            self._path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            self._path.restype = ctypes.c_int
        if self._entry is not None and self._get_session is not None:
            self._entry.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
            self._entry.restype = ctypes.c_int
            self._get_session.argtypes = [ctypes.c_void_p]
            self._get_session.restype = ctypes.c_void_p

    def start(self) -> None:
        """Start; called from inside a FUSE request (``init``), where the session is known."""
        if self._path is None:
            log.warning("libfuse has no fuse_invalidate_path: side-effect changes show after cache_timeout")
            return
        self._fuse = mfusepy._libfuse.fuse_get_context().contents.fuse
        if self._get_session is not None and self._entry is not None:
            self._session = self._get_session(self._fuse)
        self._thread = threading.Thread(target=self._run, name="zarrfs-invalidate", daemon=True)
        self._thread.start()

    def keys_changed(self, keys: list[str]) -> None:
        """Drop what the kernel holds for the files at ``keys`` (store keys); returns when done,
        or after :data:`WAIT` seconds."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put((keys, done))
        done.wait(WAIT)

    def stop(self) -> None:
        """Stop the thread (unmount)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            keys, done = item
            for key in keys:
                raw = key.encode("utf-8", "surrogateescape")
                # -ENOENT only means the kernel holds nothing for that path: nothing to drop.
                self._path(self._fuse, b"/" + raw)
                if self._session is not None and b"/" not in raw:
                    # A file the mount just created may still be cached as missing.
                    self._entry(self._session, FUSE_ROOT_ID, raw, len(raw))
            done.set()

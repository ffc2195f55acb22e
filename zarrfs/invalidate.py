"""Dropping the kernel's cached attributes and pages of files the mount changed on its own.

When a metadata change makes the format layer rewrite a consolidated ``.zmetadata``, the kernel
may still hold that file's old size and pages (they are cached for ``cache_timeout``). libfuse's
``fuse_invalidate_path`` drops them. It is called from a thread of its own, after the request
that caused the change has been answered: a notification sent from inside a request handler can
wait on a lock that the kernel holds for that very request.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading

import mfusepy

log = logging.getLogger("zarrfs.invalidate")


class Invalidator:
    """A queue of mount paths whose kernel caches are to be dropped, and the thread that does it."""

    def __init__(self) -> None:
        self._fuse: int | None = None
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._call = getattr(mfusepy._libfuse, "fuse_invalidate_path", None)
        if self._call is not None:
            self._call.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            self._call.restype = ctypes.c_int

    def start(self) -> None:
        """Start; must be called from inside a FUSE request (``init``), where the session is known."""
        if self._call is None:
            log.warning(
                "this libfuse has no fuse_invalidate_path: side-effect changes show after cache_timeout"
            )
            return
        self._fuse = mfusepy._libfuse.fuse_get_context().contents.fuse
        self._thread = threading.Thread(target=self._run, name="zarrfs-invalidate", daemon=True)
        self._thread.start()

    def keys_changed(self, keys: list[str]) -> None:
        """Queue the files at ``keys`` (store keys) for invalidation."""
        if self._thread is not None:
            for key in keys:
                self._queue.put("/" + key)

    def stop(self) -> None:
        """Stop the thread (unmount)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            if path is None:
                return
            # ENOENT only means the kernel holds nothing for that path: nothing to drop.
            self._call(self._fuse, path.encode("utf-8", "surrogateescape"))

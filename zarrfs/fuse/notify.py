"""Dropping the kernel's cached view of files the mount changed on its own (a rewritten
consolidated document): notifications written by a thread of their own, in the order decided,
before the caller's reply (docs/architecture.md, "Design notes by module"). Those that never
wait in the kernel (a node's attributes alone, :func:`inval_attrs`) are written at once by the
caller: a queued one can wait long behind one that needs a folder's lock."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from zarrfs.fs.api import name_bytes
from zarrfs.fuse import abi as k

log = logging.getLogger("zarrfs.fuse.notify")

WAIT = 0.1  # seconds a request waits for its notifications before it is answered anyway


def inval_inode(nodeid: int) -> bytes:
    """The notification dropping a node's attributes and pages."""
    return k.NOTIFY_INVAL_INODE_OUT.pack(40, k.NOTIFY_INVAL_INODE, 0, nodeid, 0, 0)


class AtOnce(bytes):
    """A notification that never waits in the kernel: :class:`Invalidator` writes it at once,
    from the caller's thread, ahead of those queued."""


def inval_attrs(nodeid: int) -> AtOnce:
    """The notification dropping a node's attributes only (offset -1): the kernel then takes
    no page lock, so writing it never waits for a request the mount is to answer."""
    return AtOnce(k.NOTIFY_INVAL_INODE_OUT.pack(40, k.NOTIFY_INVAL_INODE, 0, nodeid, -1, 0))


def inval_entry(parent_id: int, name: str, flags: int = 0) -> bytes:
    """The notification dropping the entry ``name`` of folder ``parent_id`` (with
    ``EXPIRE_ONLY``: marking it to be looked up again at its next use)."""
    raw = name_bytes(name)
    size = k.NOTIFY_INVAL_ENTRY_OUT.size + len(raw) + 1
    head = k.NOTIFY_INVAL_ENTRY_OUT.pack(size, k.NOTIFY_INVAL_ENTRY, 0, parent_id, len(raw), flags)
    return head + raw + b"\0"


def invalidations(keys: list[str], held: Callable[[str], int | None]) -> list[bytes]:
    """The notifications that drop what the kernel caches of ``keys``: the attributes and pages
    of each the kernel holds a node of (``held``: key -> node ID, or None), and the entry of
    each name in a folder it holds (also a cached "no such file") with the folder's kept
    listing (its pages: a name may be new there)."""
    notes = []
    folders = set()
    for key in keys:
        nodeid = held(key)
        if nodeid is not None:
            notes.append(inval_inode(nodeid))
        parent, _, name = key.rpartition("/")
        parent_id = held(parent)
        if parent_id is not None:
            notes.append(inval_entry(parent_id, name))
            folders.add(parent_id)
    notes += [inval_inode(folder) for folder in sorted(folders)]
    return notes


class Invalidator:
    """The thread that writes notifications to ``/dev/fuse``, and the queue that feeds it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._queue: queue.SimpleQueue[tuple[list[bytes], Callable[[], None]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: Held while deciding what to drop and queueing it (docs/architecture.md, "Design notes by module").
        self.order = threading.Lock()
        #: Around a request's wait for its notifications: with several request threads, lets
        #: go of the filesystem lock (``fuse.admission``), so a notification that waits for a
        #: kernel lock held by a request queued behind this one does not wait on this one.
        self.released: Callable[[], AbstractContextManager[object]] = nullcontext

    def wait(self, done: threading.Event) -> None:
        """Wait for notifications queued (``done``), at most :data:`WAIT`."""
        if not done.is_set():
            with self.released():
                done.wait(WAIT)

    def start(self) -> None:
        """Start the thread (once the kernel has answered INIT)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zarrfs-invalidate", daemon=True)
            self._thread.start()

    def send(self, notes: list[bytes]) -> None:
        """Write ``notes`` (packed notifications); returns when done, or after :data:`WAIT`."""
        self.wait(self.enqueue(notes))

    def enqueue(self, notes: list[bytes]) -> threading.Event:
        """Queue ``notes``; the event is set once they are written (at once when the thread
        is not running). Those that never wait (:class:`AtOnce`) are written now."""
        done = threading.Event()
        if self._thread is None:
            done.set()
            return done
        queued = self._now(notes)
        if queued:
            self._queue.put((queued, done.set))
        else:
            done.set()
        return done

    def drop_attrs(self, nodeids: list[int]) -> None:
        """Drop the kernel's attributes of ``nodeids`` now, from the calling thread, ahead of
        anything queued (:func:`inval_attrs` never waits): what the caller answers next
        reaches the kernel after them. A queued notification can wait long, behind one
        that waits for a folder's lock held by a rename the mount has not answered yet, and
        an answer must not meet the size of a version the mount no longer shows."""
        if self._thread is not None:  # else before INIT: the kernel holds nothing yet
            self._now([inval_attrs(nodeid) for nodeid in nodeids])

    def _now(self, notes: list[bytes]) -> list[bytes]:
        """Write the notes of ``notes`` that never wait; the others, to be queued."""
        later = []
        for note in notes:
            if isinstance(note, AtOnce):
                self._write(note)
            else:
                later.append(note)
        return later

    def _write(self, note: bytes) -> None:
        try:
            os.write(self.fd, note)
        except FileNotFoundError:
            pass  # the kernel holds nothing for it: nothing to drop
        except OSError as exc:
            log.debug("notification not taken: %s", exc)

    def send_then(self, notes: list[bytes], then: Callable[[], None]) -> None:
        """Write ``notes``, then call ``then`` (which writes a reply), from the thread; returns
        at once."""
        if self._thread is None:
            then()
            return
        self._queue.put((self._now(notes), then))

    def post(self, notes: list[bytes]) -> None:
        """Write ``notes`` without waiting for them (nothing the caller answers depends on
        them)."""
        if self._thread is not None:
            queued = self._now(notes)
            if queued:
                self._queue.put((queued, _nothing))

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
            notes, then = item
            for note in notes:
                self._write(note)
            try:
                then()
            except OSError as exc:
                log.debug("reply after notifications not taken: %s", exc)


def _nothing() -> None:
    """What follows notifications that nothing waits for."""

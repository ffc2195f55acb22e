"""Dropping the kernel's cached view of files the mount changed on its own (a rewritten
consolidated document): notifications written by a thread of their own, in the order decided,
before the caller's reply (docs/architecture.md, "Design notes by module"). Those that never
wait in the kernel (a node's attributes alone, :func:`inval_attrs`) are written at once by the
caller: a queued one can wait long behind one that needs a folder's lock."""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from zarrfs.fs.api import name_bytes
from zarrfs.fuse import abi as k

log = logging.getLogger("zarrfs.fuse.notify")

WAIT = 0.1  # seconds a request waits for its notifications before it is answered anyway
SLICE = 0.001  # seconds between two looks at /dev/fuse while the idle poll waits for them


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


def entry_folder(note: bytes) -> int | None:
    """The folder whose entry ``note`` drops (None: another kind of notification). The kernel
    writes such a drop under that folder's lock, which a lookup or a rename in it holds until
    it is answered."""
    if len(note) < k.NOTIFY_INVAL_ENTRY_OUT.size:
        return None
    _, code, _, parent, _, _ = k.NOTIFY_INVAL_ENTRY_OUT.unpack_from(note)
    return parent if code == k.NOTIFY_INVAL_ENTRY else None


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
        #: Drops of entries, which the kernel writes under their folder's lock, written by a
        #: thread of their own: one waiting there for a rename or a lookup in that folder to
        #: be answered holds up no drop of attributes or pages queued after it.
        self._entries: queue.SimpleQueue[tuple[list[bytes], Callable[[], None]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._entry_thread: threading.Thread | None = None
        #: Held while deciding what to drop and queueing it (docs/architecture.md, "Design notes by module").
        self.order = threading.Lock()
        #: Around a request's wait for its notifications: with several request threads, lets
        #: go of the filesystem lock (``fuse.admission``), so a notification that waits for a
        #: kernel lock held by a request queued behind this one does not wait on this one.
        self.released: Callable[[], AbstractContextManager[object]] = nullcontext
        #: Waits for queued notifications that ran out of time (:meth:`wait`).
        self.late = 0

    def wait(self, done: threading.Event, until_request: int | None = None) -> None:
        """Wait for notifications queued (``done``), at most :data:`WAIT` (counted in
        :attr:`late` when that ran out). ``until_request``: the ``/dev/fuse`` descriptor,
        for a wait between requests (the change feed's idle poll): it ends when a request
        comes, whose folder locks (a rename's, a lookup's, taken before it was sent) may be
        what a drop of an entry waits for; that request is answered first, as one sent
        before the change was heard."""
        if until_request is None:
            self.wait_all([done])
            return
        if done.is_set():
            return
        with self.released():
            deadline = time.monotonic() + WAIT
            while not done.wait(SLICE):
                if select.select([until_request], [], [], 0)[0]:
                    return
                if time.monotonic() > deadline:
                    self.late += 1
                    return

    def wait_all(self, events: list[threading.Event]) -> None:
        """Wait for several batches queued (of either queue), at most :data:`WAIT` in all
        (counted in :attr:`late` when that ran out): batches behind one held up by a folder's
        lock would otherwise each run out a bound of their own."""
        pending = [e for e in events if not e.is_set()]
        if not pending:
            return
        with self.released():
            deadline = time.monotonic() + WAIT
            for done in pending:
                if not done.wait(max(0.0, deadline - time.monotonic())):
                    self.late += 1
                    return

    def start(self) -> None:
        """Start the thread (once the kernel has answered INIT)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, args=(self._queue,), name="zarrfs-invalidate", daemon=True
            )
            self._entry_thread = threading.Thread(
                target=self._run, args=(self._entries,), name="zarrfs-invalidate-entries", daemon=True
            )
            self._thread.start()
            self._entry_thread.start()

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
        others, entries = _split(self._now(notes))
        if others and entries:  # set once both threads wrote theirs
            lock, left = threading.Lock(), [2]

            def one() -> None:
                with lock:
                    left[0] -= 1
                    last = not left[0]
                if last:
                    done.set()

            self._queue.put((others, one))
            self._entries.put((entries, one))
        elif others or entries:
            (self._queue if others else self._entries).put((others or entries, done.set))
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
            others, entries = _split(self._now(notes))
            if others:
                self._queue.put((others, _nothing))
            if entries:
                self._entries.put((entries, _nothing))

    def stop(self) -> None:
        """Stop the thread (unmount)."""
        if self._thread is not None:
            self._queue.put(None)
            self._entries.put(None)
            self._thread.join(timeout=5)
            if self._entry_thread is not None:
                self._entry_thread.join(timeout=5)
            self._thread = self._entry_thread = None

    def _run(self, source: queue.SimpleQueue) -> None:
        while True:
            item = source.get()
            if item is None:
                return
            notes, then = item
            for note in notes:
                self._write(note)
            try:
                then()
            except OSError as exc:
                log.debug("reply after notifications not taken: %s", exc)


def _split(notes: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """``notes`` as those that never wait for a folder's lock, and the drops of entries."""
    entries = [n for n in notes if entry_folder(n) is not None]
    if not entries:
        return notes, []
    return [n for n in notes if entry_folder(n) is None], entries


def _nothing() -> None:
    """What follows notifications that nothing waits for."""

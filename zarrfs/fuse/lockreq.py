"""The lock requests of the session: GETLK, SETLK and SETLKW (``fcntl`` record locks, and
``flock`` when ``lk_flags`` holds ``LK_FLOCK``), answered from the lock table of
:class:`~zarrfs.fs.api.Operations`, which keeps them in the database.

The request thread never waits for a lock: a SETLKW that conflicts is handed to the table's
waiters and left unanswered; its reply is written later from their thread (one ``write`` of a
whole reply, which ``/dev/fuse`` takes from any thread), or EINTR when the kernel interrupts it.

A granted lock brings the file up to date (the filesystem reads it again from the newest stored
version): before the reply, the kernel's cached pages and attributes of it are dropped, so the
caller's next ``read``, ``fstat`` or ``lseek(SEEK_END)`` asks the mount.
"""

from __future__ import annotations

import errno

from zarrfs.fs.api import FsError, Operations
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header
from zarrfs.fuse.notify import inval_inode


class LockRequests:
    """Handlers mixed into :class:`~zarrfs.fuse.session.Session`."""

    # It uses the session's ops, inodes, pages, invalidator, _key, _send and _reply_ok (it
    # comes first among the bases, so it must not define them).
    ops: Operations
    _lock_nodes: dict[int, int]  # request -> node ID of a lock request kept waiting

    @property
    def lock_flags(self) -> int:
        """The INIT flags to ask for: lock requests only when the database keeps locks."""
        return k.LOCKS if self.ops.locks is not None else 0

    def start_locks(self) -> None:
        """Called once INIT is answered: waiting requests may be answered from now on."""
        self.ops.start_locks(self._lock_answered)

    def _lock_args(self, head: Header, buf: memoryview) -> tuple:
        if self.ops.locks is None:
            raise FsError(errno.ENOSYS, "locks are not kept by this mount", quiet=True)
        fh, owner, start, end, type_, pid, lk_flags, _ = k.LK_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        return self._key(head.nodeid), fh, owner, start, end, type_, pid, bool(lk_flags & k.LK_FLOCK)

    def _getlk(self, head: Header, buf: memoryview) -> None:
        key, _, owner, start, end, type_, _, flock = self._lock_args(head, buf)
        lock = self.ops.getlk(key, owner, start, end, type_, flock)
        if lock is None:
            reply = (start, end, k.F_UNLCK, 0)
        else:
            reply = (lock.start, lock.end, lock.type, lock.pid)
        self._send(k.LK_REPLY.pack(k.LK_REPLY.size, 0, head.unique, *reply))

    def _setlk(self, head: Header, buf: memoryview, wait: bool = False) -> None:
        key, fh, owner, start, end, type_, pid, flock = self._lock_args(head, buf)
        if wait:
            self._lock_nodes[head.unique] = head.nodeid
        try:
            request = head.unique if wait else None
            done = self.ops.setlk(key, fh, owner, start, end, type_, pid, flock, request)
        except BaseException:
            self._lock_nodes.pop(head.unique, None)
            raise
        if done is not None:
            self._lock_nodes.pop(head.unique, None)
        if done and type_ != k.F_UNLCK:
            self._granted(head.nodeid, head.unique)
        elif done:
            self._reply_ok(head.unique)
        elif done is False:
            raise FsError(errno.EAGAIN, f"{key}: locked by another owner", quiet=True)
        # None: kept waiting; answered by _lock_answered

    def _setlkw(self, head: Header, buf: memoryview) -> None:
        self._setlk(head, buf, wait=True)

    def _interrupt(self, head: Header, buf: memoryview) -> None:
        # Only a waiting lock request can be interrupted: every other request runs to its end,
        # and its reply ends the wait.
        self.ops.interrupt(k.INTERRUPT_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])

    def drop_cached(self, nodeid: int) -> None:
        """Drop what the kernel caches of a file, its pages and attributes (and what the page
        cache policy remembers of them): another mount's bytes were stored with this mount's
        writes."""
        inode = self.inodes.get(nodeid)
        if inode is not None:
            self.pages.dropped(inode)
        if self._inval_ok:
            self.invalidator.send([inval_inode(nodeid)])

    def _granted(self, nodeid: int, unique: int) -> None:
        """Answer a granted lock once the kernel's cached pages and attributes of the file are
        dropped (written from the notifications' thread: dropping pages may wait for a read
        of the file that this thread is to answer)."""
        with self.invalidator.order:  # after any drop the change feed decided on before
            inode = self.inodes.get(nodeid)
            if inode is not None:
                self.pages.dropped(inode)
            if self._inval_ok:
                self.invalidator.send_then([inval_inode(nodeid)], lambda: self._reply_ok(unique))
                return
        self._reply_ok(unique)

    def _lock_answered(self, unique: int, code: int) -> None:
        nodeid = self._lock_nodes.pop(unique, None)
        try:
            if code == 0 and nodeid is not None:
                self._granted(nodeid, unique)
            elif code:
                self._send(k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, -code, unique))
            else:
                self._reply_ok(unique)
        except OSError:  # the mount is gone: nobody waits any more
            pass


__all__ = ["LockRequests"]

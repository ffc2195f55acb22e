"""The lock requests of a session: GETLK, SETLK and SETLKW (``fcntl`` record locks, and
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
from collections.abc import Callable

from zarrfs.fs.api import FsError, Operations, PageCache
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.notify import Invalidator, inval_inode
from zarrfs.fuse.replies import Replies


class LockRequests:
    """Answers a session's lock requests, and INTERRUPT (only a waiting lock request can be
    interrupted). ``key`` gives the store key of a node ID the kernel holds (ENOENT when it
    names no file any more); ``inodes``, ``pages`` and ``invalidator`` are the session's, which
    a granted lock drops the file's cached pages and attributes through."""

    def __init__(
        self,
        ops: Operations,
        inodes: InodeTable,
        pages: PageCache,
        invalidator: Invalidator,
        key: Callable[[int], str],
        replies: Replies,
    ) -> None:
        self.ops = ops
        self.inodes = inodes
        self.pages = pages
        self.invalidator = invalidator
        self.key = key
        self.replies = replies
        # Whether the kernel takes invalidations: the session sets it when INIT is agreed.
        self.inval_ok = False
        self._waiting: dict[int, int] = {}  # request -> node ID of a lock request kept waiting

    @property
    def flags(self) -> int:
        """The INIT flags to ask for: lock requests only when the database keeps locks."""
        return k.LOCKS if self.ops.locks is not None else 0

    def start(self) -> None:
        """Called once INIT is answered: waiting requests may be answered from now on."""
        self.ops.start_locks(self._answered)

    def _args(self, head: Header, buf: memoryview) -> tuple:
        if self.ops.locks is None:
            raise FsError(errno.ENOSYS, "locks are not kept by this mount", quiet=True)
        fh, owner, start, end, type_, pid, lk_flags, _ = k.LK_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        return self.key(head.nodeid), fh, owner, start, end, type_, pid, bool(lk_flags & k.LK_FLOCK)

    def getlk(self, head: Header, buf: memoryview) -> None:
        key, _, owner, start, end, type_, _, flock = self._args(head, buf)
        lock = self.ops.getlk(key, owner, start, end, type_, flock)
        if lock is None:
            reply = (start, end, k.F_UNLCK, 0)
        else:
            reply = (lock.start, lock.end, lock.type, lock.pid)
        self.replies.send(k.LK_REPLY.pack(k.LK_REPLY.size, 0, head.unique, *reply))

    def setlk(self, head: Header, buf: memoryview, wait: bool = False) -> None:
        key, fh, owner, start, end, type_, pid, flock = self._args(head, buf)
        if wait:
            self._waiting[head.unique] = head.nodeid
        try:
            request = head.unique if wait else None
            done = self.ops.setlk(key, fh, owner, start, end, type_, pid, flock, request)
        except BaseException:
            self._waiting.pop(head.unique, None)
            raise
        if done is not None:
            self._waiting.pop(head.unique, None)
        if done and type_ != k.F_UNLCK:
            self._granted(head.nodeid, head.unique)
        elif done:
            self.replies.ok(head.unique)
        elif done is False:
            raise FsError(errno.EAGAIN, f"{key}: locked by another owner", quiet=True)
        # None: kept waiting; answered by _answered

    def setlkw(self, head: Header, buf: memoryview) -> None:
        self.setlk(head, buf, wait=True)

    def interrupt(self, head: Header, buf: memoryview) -> None:
        # Only a waiting lock request can be interrupted: every other request runs to its end,
        # and its reply ends the wait.
        self.ops.interrupt(k.INTERRUPT_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])

    def _granted(self, nodeid: int, unique: int) -> None:
        """Answer a granted lock once the kernel's cached pages and attributes of the file are
        dropped (written from the notifications' thread: dropping pages may wait for a read
        of the file that this thread is to answer)."""
        with self.invalidator.order:  # after any drop the change feed decided on before
            inode = self.inodes.get(nodeid)
            if inode is not None:
                self.pages.dropped(inode)
            self.inodes.xattrs_changed(nodeid)
            self.inodes.lock_granted(nodeid)
            if self.inval_ok:
                # Its size at once (an open answered meanwhile must not meet the old one), its
                # pages before the reply.
                self.invalidator.drop_attrs([nodeid])
                self.invalidator.send_then([inval_inode(nodeid)], lambda: self.replies.ok(unique))
                return
        self.replies.ok(unique)

    def _answered(self, unique: int, code: int) -> None:
        nodeid = self._waiting.pop(unique, None)
        try:
            if code == 0 and nodeid is not None:
                self._granted(nodeid, unique)
            elif code:
                self.replies.error(unique, code)
            else:
                self.replies.ok(unique)
        except OSError:  # the mount is gone: nobody waits any more
            pass


__all__ = ["LockRequests"]

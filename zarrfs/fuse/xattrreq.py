"""The extended-attribute requests of a session: GETXATTR, LISTXATTR, SETXATTR and
REMOVEXATTR, answered from :class:`~zarrfs.fs.api.Operations` (which keeps them in the
database: :mod:`zarrfs.fs.xattrs`).

A GETXATTR or LISTXATTR of size 0 asks only how many bytes the answer has; a larger size
gets the bytes, or ERANGE when they do not fit.

The kernel caches no extended attributes: ``ls -l`` asks each file's ``security.selinux``
(one round trip a file). A node without that label answers EOPNOTSUPP, not ENODATA: programs
linked with libselinux (``ls``, ``cp``) then take the filesystem as one without labels and stop
asking for the rest of their run (docs/performance.md, "`ls -l` and the SELinux label"; under
SELinux the kernel answers that name itself and never asks the daemon). A label set is kept
and read back like any ``security.*`` name. A mount that follows a change feed remembers which nodes the
kernel holds were read with none (:meth:`~zarrfs.fuse.inodes.InodeTable.bare_of_xattrs`)
and answers those without reading. What drops the kernel's attributes of a node drops that
too: the feed telling of a change to the file (:mod:`zarrfs.fuse.coherence`), a lock granted
on it, the kernel forgetting the node; and this mount's own ``setxattr`` or ``removexattr``.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from zarrfs.fs.api import FsError, Operations
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.replies import Replies

#: The SELinux label: EOPNOTSUPP for a node without one (see the module's docstring).
SELINUX = b"security.selinux"
#: What a write removes (the kernel's, or past the page cache the daemon's: kill_capability).
CAPABILITY = b"security.capability"


class XattrRequests:
    """Answers a session's extended-attribute requests. ``key`` gives the store key of a node
    ID the kernel holds (ENOENT when it names no file any more)."""

    def __init__(
        self,
        ops: Operations,
        inodes: InodeTable,
        key: Callable[[int], str],
        replies: Replies,
        followed: Callable[[], bool],
        error: Callable[[Header, int], None] | None = None,
    ) -> None:
        self.ops = ops
        self.inodes = inodes
        self.key = key
        self.replies = replies
        self.followed = followed  # whether a change feed keeps what the mount read true
        # The error reply, counted as the dispatcher counts it: a name the node is known not to
        # have is answered with no exception raised (a new file's security.capability, before
        # its first write; ls -l's label).
        self.error = error

    def _record(self, nodeid: int, key: str) -> dict[bytes, bytes] | None:
        """Every extended attribute of the node: none when known to be none, else read (and,
        under a change feed, remembered when none); None: left to the call to read."""
        if not self.followed():
            return None
        inodes = self.inodes
        if inodes.bare_of_xattrs(nodeid):
            return {}
        record = self.ops.xattrs(key)
        inodes.xattrs_read(nodeid, not record)
        return record

    def _sized(self, head: Header, size: int, data: bytes) -> None:
        if size == 0:
            self.replies.send(k.GETXATTR_OUT.pack(k.GETXATTR_OUT.size, 0, head.unique, len(data), 0))
        elif len(data) > size:
            raise FsError(errno.ERANGE, f"{len(data)} bytes do not fit in {size}", quiet=True)
        else:
            self.replies.data(head.unique, data)

    def getxattr(self, head: Header, buf: memoryview) -> None:
        size = k.GETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        name = k.name(buf, k.IN_HEADER_SIZE + k.GETXATTR_IN.size, head.len)
        key = self.key(head.nodeid)
        record = self._record(head.nodeid, key)
        error = self.error
        if record is not None and error is not None and name not in record:
            error(head, errno.EOPNOTSUPP if name == SELINUX else self.ops.absent_xattr(name))
            return
        try:
            value = self.ops.getxattr(key, name, record)
        except FsError as exc:
            if exc.errno == errno.ENODATA and name == SELINUX:
                raise FsError(errno.EOPNOTSUPP, f"{key}: no SELinux label", quiet=True) from None
            raise
        self._sized(head, size, value)

    def kill_capability(self, nodeid: int, key: str) -> None:
        """A write the kernel passed on without removing ``security.capability`` (past the page
        cache): removed here, as HANDLE_KILLPRIV_V2 leaves to the daemon. Under a change feed
        a file known to have no attributes is not read again."""
        record = self._record(nodeid, key)
        if record is None:
            record = self.ops.xattrs(key)
        if CAPABILITY in record:
            try:
                self.ops.setxattr(key, CAPABILITY, None)
            finally:
                self.inodes.xattrs_changed(nodeid)

    def listxattr(self, head: Header, buf: memoryview) -> None:
        size = k.GETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        key = self.key(head.nodeid)
        names = self.ops.listxattr(key, self._record(head.nodeid, key))
        self._sized(head, size, b"".join(n + b"\0" for n in names))

    def setxattr(self, head: Header, buf: memoryview) -> None:
        size, flags = k.SETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        at = k.IN_HEADER_SIZE + k.SETXATTR_IN.size
        end = bytes(buf[at : head.len]).find(b"\0")
        if end < 0 or at + end + 1 + size != head.len:
            raise k.Malformed(f"a setxattr of {size} bytes in a request of {head.len}")
        name, value = bytes(buf[at : at + end]), bytes(buf[at + end + 1 : head.len])
        try:
            self.ops.setxattr(self.key(head.nodeid), name, value, flags)
        finally:
            self.inodes.xattrs_changed(head.nodeid)
        self.replies.ok(head.unique)

    def removexattr(self, head: Header, buf: memoryview) -> None:
        name = k.name(buf, k.IN_HEADER_SIZE, head.len)
        try:
            self.ops.setxattr(self.key(head.nodeid), name, None)
        finally:
            self.inodes.xattrs_changed(head.nodeid)
        self.replies.ok(head.unique)


__all__ = ["XattrRequests"]

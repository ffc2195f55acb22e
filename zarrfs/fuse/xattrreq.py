"""The extended-attribute requests of a session: GETXATTR, LISTXATTR, SETXATTR and
REMOVEXATTR, answered from :class:`~zarrfs.fs.api.Operations` (which keeps them in the
database: :mod:`zarrfs.fs.xattrs`).

A GETXATTR or LISTXATTR of size 0 asks only how many bytes the answer has; a larger size
gets the bytes, or ERANGE when they do not fit.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from zarrfs.fs.api import FsError, Operations
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header
from zarrfs.fuse.replies import Replies


class XattrRequests:
    """Answers a session's extended-attribute requests. ``key`` gives the store key of a node
    ID the kernel holds (ENOENT when it names no file any more)."""

    def __init__(self, ops: Operations, key: Callable[[int], str], replies: Replies) -> None:
        self.ops = ops
        self.key = key
        self.replies = replies

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
        self._sized(head, size, self.ops.getxattr(self.key(head.nodeid), name))

    def listxattr(self, head: Header, buf: memoryview) -> None:
        size = k.GETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        names = self.ops.listxattr(self.key(head.nodeid))
        self._sized(head, size, b"".join(n + b"\0" for n in names))

    def setxattr(self, head: Header, buf: memoryview) -> None:
        size, flags = k.SETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        at = k.IN_HEADER_SIZE + k.SETXATTR_IN.size
        end = bytes(buf[at : head.len]).find(b"\0")
        if end < 0 or at + end + 1 + size != head.len:
            raise k.Malformed(f"a setxattr of {size} bytes in a request of {head.len}")
        name, value = bytes(buf[at : at + end]), bytes(buf[at + end + 1 : head.len])
        self.ops.setxattr(self.key(head.nodeid), name, value, flags)
        self.replies.ok(head.unique)

    def removexattr(self, head: Header, buf: memoryview) -> None:
        name = k.name(buf, k.IN_HEADER_SIZE, head.len)
        self.ops.setxattr(self.key(head.nodeid), name, None)
        self.replies.ok(head.unique)


__all__ = ["XattrRequests"]

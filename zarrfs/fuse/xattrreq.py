"""The extended-attribute requests of the session: GETXATTR, LISTXATTR, SETXATTR and
REMOVEXATTR, answered from :class:`~zarrfs.fs.api.Operations` (which keeps them in the
database: :mod:`zarrfs.fs.xattrs`).

A GETXATTR or LISTXATTR of size 0 asks only how many bytes the answer has; a larger size
gets the bytes, or ERANGE when they do not fit.
"""

from __future__ import annotations

import errno

from zarrfs.fs.api import FsError, Operations
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header


class XattrRequests:
    """Handlers mixed into :class:`~zarrfs.fuse.session.Session`."""

    # It uses the session's ops, _key, _send, _reply_ok and _reply_data (it comes first among
    # the bases, so it must not define them).
    ops: Operations

    def _sized(self, head: Header, size: int, data: bytes) -> None:
        if size == 0:
            self._send(k.GETXATTR_OUT.pack(k.GETXATTR_OUT.size, 0, head.unique, len(data), 0))
        elif len(data) > size:
            raise FsError(errno.ERANGE, f"{len(data)} bytes do not fit in {size}", quiet=True)
        else:
            self._reply_data(head.unique, data)

    def _getxattr(self, head: Header, buf: memoryview) -> None:
        size = k.GETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        name = k.name(buf, k.IN_HEADER_SIZE + k.GETXATTR_IN.size, head.len)
        self._sized(head, size, self.ops.getxattr(self._key(head.nodeid), name))

    def _listxattr(self, head: Header, buf: memoryview) -> None:
        size = k.GETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        names = self.ops.listxattr(self._key(head.nodeid))
        self._sized(head, size, b"".join(n + b"\0" for n in names))

    def _setxattr(self, head: Header, buf: memoryview) -> None:
        size, flags = k.SETXATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        at = k.IN_HEADER_SIZE + k.SETXATTR_IN.size
        end = bytes(buf[at : head.len]).find(b"\0")
        if end < 0 or at + end + 1 + size != head.len:
            raise k.Malformed(f"a setxattr of {size} bytes in a request of {head.len}")
        name, value = bytes(buf[at : at + end]), bytes(buf[at + end + 1 : head.len])
        self.ops.setxattr(self._key(head.nodeid), name, value, flags)
        self._reply_ok(head.unique)

    def _removexattr(self, head: Header, buf: memoryview) -> None:
        name = k.name(buf, k.IN_HEADER_SIZE, head.len)
        self.ops.setxattr(self._key(head.nodeid), name, None)
        self._reply_ok(head.unique)

"""The replies of a FUSE session: each one ``write`` of a whole reply to ``/dev/fuse``.

The kernel takes a reply from any thread, so a reply written later (a waiting lock granted) goes
through the same object. A request interrupted meanwhile is gone (``ENOENT``): nobody waits for
its reply, which is dropped.
"""

from __future__ import annotations

import os

from zarrfs.fuse import abi as k


class Replies:
    """Writes replies to the FUSE device ``fd``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, data) -> None:
        """A reply packed whole, header included."""
        try:
            os.write(self.fd, data)
        except FileNotFoundError:
            pass  # the request was interrupted and is gone: nobody waits for this reply

    def ok(self, unique: int) -> None:
        """The reply of success without data to request ``unique``."""
        self.send(k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, 0, unique))

    def data(self, unique: int, data) -> None:
        """The reply of success carrying ``data`` (bytes or a buffer), written without a copy."""
        header = k.OUT_HEADER.pack(k.OUT_HEADER_SIZE + len(data), 0, unique)
        try:
            os.writev(self.fd, [header, data])
        except FileNotFoundError:
            pass

    def error(self, unique: int, code: int) -> None:
        """The reply of failure with errno ``code`` to request ``unique``."""
        self.send(k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, -code, unique))


__all__ = ["Replies"]

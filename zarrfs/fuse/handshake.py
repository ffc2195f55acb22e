"""INIT: the protocol version and features the kernel and zarrfs agree on.

The kernel opens a mount with an INIT request naming its version (``7.minor``) and the features
it offers. zarrfs answers with the older of the two minor versions, in the reply layout of that
version, and with the features it wants among those offered; from then on both sides speak
that version. A kernel older than :data:`~zarrfs.fuse.abi.MIN_MINOR`, or of another major
version, is refused (EPROTO): the layouts zarrfs reads and writes would not be its own.
"""

from __future__ import annotations

from typing import NamedTuple

from zarrfs.fuse import abi as k


class Refused(Exception):
    """The kernel's version cannot be served; the message says why, for the log."""


class Agreed(NamedTuple):
    """What INIT settled: the protocol ``minor`` both sides speak and the feature ``flags``
    granted."""

    minor: int
    flags: int

    @property
    def inval(self) -> bool:
        """Whether the kernel takes NOTIFY_INVAL_INODE and NOTIFY_INVAL_ENTRY."""
        return self.minor >= k.NOTIFY_INVAL_MINOR

    @property
    def direct_io_mmap(self) -> bool:
        """Whether a file opened with FOPEN_DIRECT_IO may still be mapped."""
        return bool(self.flags & k.DIRECT_IO_ALLOW_MMAP)

    @property
    def store(self) -> bool:
        """Whether the kernel takes NOTIFY_STORE (pages handed to it)."""
        return self.minor >= k.NOTIFY_STORE_MINOR

    @property
    def expire(self) -> bool:
        """Whether NOTIFY_INVAL_ENTRY takes EXPIRE_ONLY (look the name up again, keep it)."""
        return self.minor >= k.NOTIFY_EXPIRE_MINOR


def negotiate(
    body: bytes | memoryview, unique: int, max_write: int, wanted: int = k.WANTED
) -> tuple[Agreed, bytes]:
    """The agreement and the packed INIT reply (header included) for the INIT request whose
    arguments are ``body`` and whose ID is ``unique``; ``wanted``: the features asked for.
    Raises :class:`Refused` for a kernel zarrfs cannot serve, :class:`~zarrfs.fuse.abi.Malformed`
    for a request too short for the version it names."""
    major, minor = k.INIT_VERSION.unpack_from(body)
    if major != k.MAJOR or minor < k.MIN_MINOR:
        raise Refused(
            f"the kernel speaks FUSE {major}.{minor}; zarrfs serves {k.MAJOR}.{k.MIN_MINOR} to "
            f"{k.MAJOR}.{k.MINOR}"
        )
    if len(body) < k.INIT_IN.size:  # every kernel since 7.6 sends readahead and flags
        raise k.Malformed(f"an INIT of {len(body)} bytes for FUSE {major}.{minor}")
    readahead, offered = k.INIT_IN.unpack_from(body)[2:]
    if offered & k.INIT_EXT and len(body) >= k.INIT_IN_EXT.size:
        offered |= k.INIT_IN_EXT.unpack_from(body)[4] << 32
    agreed_minor = min(minor, k.MINOR)
    if agreed_minor < k.DIRECT_IO_ALLOW_MMAP_MINOR:
        wanted &= ~k.DIRECT_IO_ALLOW_MMAP
    agreed = Agreed(agreed_minor, offered & wanted & ~k.INIT_EXT)
    low, high = agreed.flags & 0xFFFFFFFF, agreed.flags >> 32
    if agreed.minor < k.INIT_REPLY_MINOR:
        reply = k.INIT_REPLY_22.pack(
            k.INIT_REPLY_22.size, 0, unique, k.MAJOR, agreed.minor, readahead, low, 0, 0, max_write
        )
    else:
        reply = k.INIT_REPLY.pack(
            k.INIT_REPLY.size,
            0,
            unique,
            k.MAJOR,
            agreed.minor,
            readahead,
            low | (k.INIT_EXT if high else 0),
            0,  # max_background: the kernel's default
            0,  # congestion_threshold: the kernel's default
            max_write,
            1,  # time_gran: nanoseconds
            # max_pages: a WRITE of max_write bytes; without MAX_PAGES the kernel's 32 pages.
            max_write // 4096 if agreed.flags & k.MAX_PAGES else 0,
            0,  # map_alignment
            high,  # flags2
        )
    return agreed, reply


__all__ = ["Agreed", "Refused", "negotiate"]

"""The folder requests of a session: OPENDIR, READDIR, READDIRPLUS, RELEASEDIR and FSYNCDIR,
answered from the listings of :class:`~zarrfs.fs.api.Operations`; READDIRPLUS gives each new name
with its node, and under a change feed the kernel keeps a folder's listing
(docs/architecture.md, "Design notes by module")."""

from __future__ import annotations

import errno
import logging
import stat
from collections import deque
from collections.abc import Callable
from functools import partial

from zarrfs.fs.api import FsError, Node, Operations, name_bytes
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import ROOT_ID, Header
from zarrfs.fuse.inodes import Checked, InodeTable
from zarrfs.fuse.replies import Replies

log = logging.getLogger("zarrfs.fuse.dirreq")

_SMALLEST = k.DIRENTPLUS.size + 8  # the least an entry takes (a name of one byte, padded)
_ZERO_ENTRY = bytes(k.ENTRY_OUT.size)  # node ID 0: no attributes (the kernel keeps the name alone)


class DirRequests:
    """Answers a session's folder requests. ``key`` gives the store key of a node ID the kernel
    holds (ENOENT when it names no file any more); ``entries`` the node IDs and packed
    ``fuse_entry_out`` records of lists of keys and their nodes, which counts one lookup of
    each (the session's, as LOOKUP's; its third argument: the keys are known new to the node
    table)."""

    def __init__(
        self,
        ops: Operations,
        inodes: InodeTable,
        key: Callable[[int], str],
        entries: Callable[[list[str], list[Node], bool], tuple[list[int], list[bytes]]],
        replies: Replies,
    ) -> None:
        self.ops = ops
        self.inodes = inodes
        self.key = key
        self.entries = entries
        self.replies = replies
        #: Work for the time between requests, done while none waits (by the one thread of
        #: :class:`~zarrfs.fuse.loop.Loop`; alone, by the thread that polls the change feed,
        #: with request threads), each item called until it returns False; None where no
        #: loop does it (READDIRPLUS reads no window ahead).
        self.ahead: deque[Callable[[], bool]] | None = None

    def opendir(self, head: Header, buf: memoryview, keep: bool = False) -> None:
        """A folder the kernel holds: ENOTDIR for a node this table knows as something else,
        without asking the database (a folder gone or replaced since is found by the
        listing's first read). ``keep``: the kernel may keep the listing it reads (a change
        feed drops it when the folder changes elsewhere; docs/architecture.md, "Design notes by module")."""
        key = self.key(head.nodeid)
        inode = self.inodes.get(head.nodeid)
        if inode is not None and not stat.S_ISDIR(inode.kind):
            raise FsError(errno.ENOTDIR, key, quiet=True)
        fh = self.ops.opendir(key)
        flags = k.FOPEN_CACHE_DIR | k.FOPEN_KEEP_CACHE if keep else 0
        self.replies.send(k.OPEN_REPLY.pack(k.OPEN_REPLY.size, 0, head.unique, fh, flags, 0))

    def readdir(self, head: Header, buf: memoryview) -> None:
        fh, offset, size = k.READ_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        listed = self.inodes.numbered(self.key(head.nodeid), head.nodeid, self.ops.readdir(fh, offset))
        self.replies.data(head.unique, k.dirents(listed, size))

    def readdirplus(self, head: Header, buf: memoryview) -> None:
        """Entries with their node IDs and attributes, as many as fit in ``size`` bytes. Each
        entry with a node ID counts one lookup (the kernel forgets it like a LOOKUP's), so an
        entry is remembered only once it is known to fit; ``.``, ``..``, a name gone since
        it was listed and a name whose node the kernel holds already go with node ID 0 (the
        kernel then keeps the name alone)."""
        fh, offset, size = k.READ_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        fixed = k.DIRENTPLUS.size + 7
        held = Checked(self.inodes)
        most = size // _SMALLEST + 1
        used = 0
        taken: list[tuple[bytes, int, int, str, str, Node | None]] = []  # the entries that fit
        keys: list[str] = []
        nodes: list[Node] = []
        while used < size and (rows := self.ops.readdirplus(fh, offset, most, held)):
            for name, kind, at, key, node in rows:
                raw = name_bytes(name)
                length = (fixed + len(raw)) & ~7
                if used + length > size:
                    used = size
                    break
                used += length
                taken.append((raw, kind, at, name, key, node))
                if node is not None:
                    keys.append(key)
                    nodes.append(node)
                offset = at
        ids, entries = self.entries(keys, nodes, held.still_none()) if nodes else ((), ())
        numbered, packed = iter(ids), iter(entries)
        dirents = k.DIRENTS
        parts: list[bytes] = []
        append = parts.append
        for raw, kind, at, name, key, node in taken:
            n = len(raw)
            if node is None:
                append(_ZERO_ENTRY)
                ino = self._listed_ino(head.nodeid, name, key, kind)
            else:
                append(next(packed))
                ino = next(numbered)
            append((dirents[n] if n < 256 else k.dirent_of(n)).pack(ino, at, n, (kind & 0o170000) >> 12, raw))
        self.replies.data(head.unique, b"".join(parts))
        if used >= size and self.ahead is not None:
            # A full reply: the program reads on, and the next window is read while the
            # kernel takes this one in (docs/performance.md, "A listing read ahead").
            self.ahead.append(partial(self._read_ahead, fh, offset, len(taken)))

    def _read_ahead(self, fh: int, offset: int, count: int) -> bool:
        """:meth:`Operations.read_ahead`; a read that fails is left to the request that needs
        it (which reads it again and answers with what failed)."""
        try:
            return self.ops.read_ahead(fh, offset, count)
        except Exception as exc:
            log.debug("a listing's window read ahead failed: %s", exc)
            return False

    def _listed_ino(self, nodeid: int, name: str, key: str | None, kind: int) -> int:
        """``d_ino`` of an entry given without a node: ``.`` and ``..`` (their folders'), a name
        gone since it was listed (a number of its own, as a listing's)."""
        if name == ".":
            return nodeid
        if name == ".." or key is None:
            folder = self.key(nodeid)
            return (self.inodes.ids.get(folder.rpartition("/")[0]) if folder else None) or ROOT_ID
        return self.inodes.number(key, kind)

    def releasedir(self, head: Header, buf: memoryview) -> None:
        self.ops.releasedir(k.RELEASE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])
        self.replies.ok(head.unique)

    def fsyncdir(self, head: Header, buf: memoryview) -> None:
        self.replies.ok(head.unique)


__all__ = ["DirRequests"]

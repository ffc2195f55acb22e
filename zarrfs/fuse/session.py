"""The FUSE session: kernel requests in, calls of :class:`~zarrfs.fs.api.Operations` (and of its
:class:`~zarrfs.fs.api.HandleTable` for requests on an open handle), replies out.

A request is parsed with :mod:`struct` straight from the buffer it was read into (no callbacks
from C, no path rebuilt per call), checked against its opcode's entry in
:data:`zarrfs.fuse.abi.OPCODES` (EINVAL when short), and answered with one packed reply. Node
IDs become store keys through :class:`~zarrfs.fuse.inodes.InodeTable`; exceptions become the
reply's errno through :func:`zarrfs.fs.api.to_errno` (one log line unless routine); the page
cache decisions are :class:`zarrfs.fs.api.PageCache`'s, this module only says them.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import struct
from collections.abc import Callable, Sequence

from zarrfs.fs.api import (
    DIR,
    FILE,
    NOW,
    RENAME_EXCHANGE,
    FsError,
    Node,
    Operations,
    PageCache,
    Stored,
    key_text,
    stored_blocks,
    version_mark,
    without_setid,
)
from zarrfs.fuse import abi as k
from zarrfs.fuse.abi import Header
from zarrfs.fuse.dirreq import DirRequests
from zarrfs.fuse.dispatch import Dispatcher, Handler
from zarrfs.fuse.handshake import Agreed, Refused, negotiate
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.lockreq import LockRequests
from zarrfs.fuse.notify import Invalidator, inval_inode, invalidations
from zarrfs.fuse.tuning import give_back_memory
from zarrfs.fuse.xattrreq import XattrRequests

log = logging.getLogger("zarrfs.fuse.session")

BLKSIZE = 1 << 20  # st_blksize: tools read and write in blocks this large
MAX_WRITE = 1 << 20  # bytes of data in one WRITE request
BUFFER_SIZE = MAX_WRITE + 4096  # a request with its headers
NS = 1_000_000_000

_name = k.name


_OPCODE = struct.Struct("<II")  # a request's length and opcode
_FH = struct.Struct("<Q")  # the handle that begins FLUSH_IN and RELEASE_IN
_ENTRY_HEADER = k.OUT_HEADER.pack  # a LOOKUP reply: this, then the fuse_entry_out
_ENTRY_REPLY_SIZE = k.ENTRY_REPLY.size
_pack_entry = k.ENTRY_OUT.pack
_pack_entry_parts = k.ENTRY_PARTS.pack
_pack_attr_tail = k.ATTR_TAIL.pack
_OPEN_OUT = k.OPEN_OUT.pack
# Requests that never write to the database (fuse.interrupts: served while a write waits).
_NO_WRITE = frozenset(
    {k.LOOKUP, k.GETATTR, k.READLINK, k.READ, k.STATFS, k.GETXATTR, k.LISTXATTR, k.OPENDIR}
    | {k.READDIR, k.READDIRPLUS, k.RELEASEDIR}
)


class Session(Dispatcher):
    """Serves one mount's requests. ``timeouts`` are the kernel's cache times in seconds for
    names, attributes and missing names; ``on_init`` runs once the kernel has applied INIT.
    Folder, lock and extended-attribute requests are answered by the objects it holds
    (``dirs``, ``locks``, ``xattrs``), through one-line handlers here."""

    def __init__(
        self,
        ops: Operations,
        fd: int,
        entry_timeout: float = 1.0,
        attr_timeout: float = 1.0,
        negative_timeout: float = 1.0,
        on_init: Callable[[], None] | None = None,
        acl: bool = False,
    ) -> None:
        self.ops = ops
        #: The open files: requests on an open handle are theirs alone (read, write, fsync...).
        self.files = ops.handles
        self.inodes = InodeTable(DIR)
        self.pages = PageCache(attr_timeout)
        self.entry_valid = k.split_time(entry_timeout)
        self.attr_valid = k.split_time(attr_timeout)
        self.negative_valid = k.split_time(negative_timeout)
        self.on_init = on_init
        self.acl_wanted = acl  # POSIX ACLs enforced by the kernel (default_permissions)
        self._umask = False  # whether CREATE, MKNOD and MKDIR leave the umask to zarrfs
        self.initialized = False
        self.agreed: Agreed | None = None  # the protocol version and features INIT settled
        self._inval_ok = self._store_ok = self._direct_ok = False  # what the agreed version has
        self.invalidator = Invalidator(fd)
        self.coherence = None  # a fuse.coherence.Coherence when the driver has a change feed
        # With several request threads (fuse.workers): who runs with whom (fuse.admission).
        self.admission = None
        # Node ID -> the handles open on a file unlinked while open (a live set): what answers
        # its fstat, which the kernel sends as a GETATTR of the node without a handle.
        self._orphans: dict[int, set[int]] = {}
        # The handles of files created write-only, written past the page cache (_create).
        self._direct_writes: set[int] = set()
        ops.on_keys_changed(self.keys_changed)
        # The handler of each opcode of abi.OPCODES is the method named after it (``_lookup``).
        handlers: dict[int, Handler] = {code: getattr(self, f"_{op.name}") for code, op in k.OPCODES.items()}
        super().__init__(fd, handlers, BUFFER_SIZE)
        self.dirs = DirRequests(ops, self.inodes, self._key, self._entries, self.replies)
        self.locks = LockRequests(ops, self.inodes, self.pages, self.invalidator, self._key, self.replies)
        followed = lambda: self.coherence is not None  # noqa: E731
        self.xattrs = XattrRequests(ops, self.inodes, self._key, self.replies, followed, self._reply_error)
        # While a write waits for a lock another program holds, what needs no write is served.
        self.watch.serve, self.watch.may_serve = self.handle, self._needs_no_write

    # ------------------------------------------------------------------ helpers
    def _path(self, nodeid: int) -> str:
        key = self.inodes.key(nodeid)
        return "/" + key if key is not None else f"node {nodeid}"

    def _key(self, nodeid: int) -> str:
        key = self.inodes.key(nodeid)
        if key is None:
            raise FsError(errno.ENOENT, f"node {nodeid} is gone", quiet=True)
        return key

    def _existing(self, nodeid: int, key: str | None) -> tuple[str | None, Node | None]:
        """``key``, a name of node ``nodeid``, and what is there; when nothing is and the node
        is a file with hard links, another of its names that exists and what is there (its
        name removed elsewhere, which the change feed has not told yet: the node names it until
        then)."""
        node = None if key is None else self.ops.find(key)
        if node is None and key is not None:
            inode = self.inodes.get(nodeid)
            for name in sorted(inode.aliases or ()) if inode is not None else ():
                other = self.ops.find(name)
                if other is not None and other.kind == inode.kind:
                    return name, other
        return key, node

    def stats(self) -> dict:
        """:meth:`Dispatcher.stats`, and the notifications the mount wrote to drop what other
        mounts changed (``sent``) and the waits for queued ones that ran out (``late``)."""
        figures: dict = super().stats()
        sent = 0 if self.coherence is None else self.coherence.dropped
        figures["notifications"] = {"sent": sent, "late": self.invalidator.late}
        return figures

    def _child(self, nodeid: int, name: bytes) -> str:
        # _key inlined: every request naming a child passes here (LOOKUP inlines this too).
        parent = self.inodes.key(nodeid)
        if parent is None:
            raise FsError(errno.ENOENT, f"node {nodeid} is gone", quiet=True)
        text = key_text(name)
        return parent + "/" + text if parent else text

    def _needs_no_write(self, data: bytes) -> bool:
        """Whether the request ``data`` can be answered without writing to the database (see
        ``fuse.interrupts``, :meth:`Watch.serve_waiting`): a lookup, attributes, a read, a
        listing, extended attributes read, a read-only open, the close of a reader, and what is
        answered ENOSYS (``ioctl``, which ``open`` in Python sends, say)."""
        if len(data) < k.IN_HEADER_SIZE:
            return False
        opcode = _OPCODE.unpack_from(data)[1]
        if opcode in _NO_WRITE or opcode not in k.OPCODES:  # the others are answered ENOSYS
            return True
        if opcode == k.OPEN and len(data) >= k.IN_HEADER_SIZE + k.OPEN_IN.size:
            flags = k.OPEN_IN.unpack_from(data, k.IN_HEADER_SIZE)[0]
            return flags & (os.O_ACCMODE | os.O_TRUNC) == os.O_RDONLY
        if opcode in (k.FLUSH, k.RELEASE) and len(data) >= k.IN_HEADER_SIZE + 8:
            return self.ops.close_writes_nothing(_FH.unpack_from(data, k.IN_HEADER_SIZE)[0])
        return False

    def reader_key(self, data: memoryview, nodeid: int):
        """With several request threads (``fuse.workers``): None when the request ``data``
        must run alone (it writes, or an open that brings other mounts' changes in first),
        else the key readers about the same thing take turns on: a lookup's folder and name,
        another request's node. Forgets take turns on nothing."""
        length, opcode = _OPCODE.unpack_from(data)
        if opcode == k.LOOKUP:
            if self._feed_first():  # brings other mounts' new names in first (see _lookup)
                return None
            return (nodeid, bytes(data[k.IN_HEADER_SIZE : length]))
        if opcode in (k.FORGET, k.BATCH_FORGET):
            return (None, k.IN_HEADER.unpack_from(data)[2])
        if not self._needs_no_write(data):
            return None
        coherence = self.coherence
        if opcode in (k.OPEN, k.OPENDIR) and coherence is not None:
            if coherence.news() or coherence.unfinished():  # its poll waits for their drops
                return None
        return nodeid

    def _stored(self, nodeid: int | None, stored: Stored | None) -> None:
        # Content stored through this mount: the policy records it, and may hand the kernel
        # the file's last partial page.
        if nodeid is None or stored is None:
            return
        inode = self.inodes.get(nodeid)
        if inode is None or not inode.lookups:  # unknown, or forgotten by the kernel
            return
        if stored.others:  # another mount's bytes are in it: the kernel's pages are not it
            self.drop_cached(nodeid)
            return
        tail = self.pages.stored(inode, stored)
        if tail is not None and self._store_ok:
            offset, data = tail
            size = k.NOTIFY_STORE_OUT.size + len(data)
            head = k.NOTIFY_STORE_OUT.pack(size, k.NOTIFY_STORE, 0, nodeid, offset, len(data), 0)
            try:
                os.writev(self.fd, [head, data])
            except OSError as exc:  # ENOENT: the kernel no longer holds the file; nothing to give
                log.debug("page store for node %d not taken: %s", nodeid, exc)

    def _attr(self, nodeid: int, node: Node) -> tuple:
        a = node.attrs
        size = node.size
        at, atn = divmod(a.atime, NS)
        mt, mtn = divmod(a.mtime, NS)
        ct, ctn = divmod(a.ctime, NS)
        # nlink 1 for folders too: it tells find(1) not to guess subfolder counts from it. An
        # open file whose name is gone has 0.
        return (
            nodeid,
            size,
            stored_blocks(node),
            at,
            mt,
            ct,
            atn,
            mtn,
            ctn,
            a.mode,
            node.nlink,
            a.uid,
            a.gid,
            node.rdev,
            BLKSIZE,
            0,
        )

    def _entry_values(self, key: str, node: Node) -> tuple:
        coherence = self.coherence
        if coherence is not None and coherence.negatives:  # a name found or made is no longer a missing one
            coherence.created(key)
        # Extended attributes read as none by a listing answer later asks (fuse.xattrreq).
        nodeid, inode = self.inodes.remember(
            key, node.kind, node.group, node.names, node.no_xattrs and coherence is not None
        )
        self.pages.shown(inode, node)
        es, ens = self.entry_valid
        ats, atns = self._attr_valid(node)
        return (nodeid, 0, es, ats, ens, atns, *self._attr(nodeid, node))

    def _entry(self, key: str, node: Node) -> tuple[int, bytes]:
        """The node ID of ``key`` shown as ``node``, counted as one more lookup, and its packed
        ``fuse_entry_out``: of every LOOKUP, CREATE, MKDIR... and of each of a READDIRPLUS
        reply's names. A plain file or folder (most) is numbered in one call and packed
        here; a file in parts, with hard links or shown as an older version, by
        :meth:`_entry_values`. A name found or made is no longer a missing one the mount
        remembers (:meth:`Coherence.created`). A READDIRPLUS reply's names take
        :meth:`_entries`, the same for many names at once (``test_readdirplus.py`` holds the
        two equal)."""
        coherence = self.coherence
        if coherence is not None and coherence.negatives:
            coherence.created(key)
        if node.group or node.passing or node.attrs.parted or node.allocated is not None:
            values = self._entry_values(key, node)
            return values[0], _pack_entry(*values)
        kind = node.kind
        a = node.attrs
        size = node.size
        inodes = self.inodes
        mark = version_mark(size, a.mtime) if kind == FILE else 0
        nodeid = inodes.remember_plain(key, kind, mark, coherence is not None and node.no_xattrs)
        if inodes.paged(nodeid):
            self.pages.shown(inodes.get(nodeid), node)
        es, ens = self.entry_valid
        ats, atns = self.attr_valid
        at, atn = divmod(a.atime, NS)
        mt, mtn = divmod(a.mtime, NS)
        ct, ctn = divmod(a.ctime, NS)
        return nodeid, _pack_entry(
            nodeid, 0, es, ats, ens, atns,
            nodeid, size, (size + 511) // 512, at, mt, ct, atn, mtn, ctn,
            a.mode, node.nlink, a.uid, a.gid, node.rdev, BLKSIZE, 0,
        )  # fmt: skip

    def _entries(
        self, keys: Sequence[str], nodes: Sequence[Node], new: bool = False
    ) -> tuple[Sequence[int], list[bytes]]:
        """:meth:`_entry` of each of a READDIRPLUS reply's names, at once: their node IDs and
        packed ``fuse_entry_out`` records. Plain files and folders (most) are numbered by the
        node table in one call (a folder's first listing: appended to its columns at once)
        and packed in one loop here, with no call a name; the others by
        :meth:`_entry_values`, in their places in the lists, numbered after the plain ones.
        ``new``: no key has a node yet (``fuse.inodes.Checked``)."""
        coherence = self.coherence
        feed = coherence is not None
        if feed and coherence.negatives:  # names found are no longer missing ones
            created = coherence.created
            for key in keys:
                created(key)
        odd: list[int] = []
        kinds: list[int] = []
        marks: list[int] = []
        for i, node in enumerate(nodes):
            a = node.attrs
            if node.group or node.passing or a.parted or node.allocated is not None:
                odd.append(i)
                continue
            kind = node.kind
            kinds.append(kind)
            marks.append(version_mark(node.size, a.mtime) if kind == FILE else 0)
        if odd:
            skip = set(odd)
            plain_keys = [key for i, key in enumerate(keys) if i not in skip]
            plain = [node for i, node in enumerate(nodes) if i not in skip]
        else:
            plain_keys, plain = keys, nodes
        inodes = self.inodes
        bare = [node.no_xattrs for node in plain] if feed else None
        ids = inodes.remember_plains(plain_keys, kinds, marks, bare, new)
        for i in inodes.paged_among(ids):
            self.pages.shown(inodes.get(ids[i]), plain[i])
        es, ens = self.entry_valid
        ats, atns = self.attr_valid
        valid = k.ENTRY_VALID.pack(0, es, ats, ens, atns)
        # The attributes after the size, packed once for the names that share them: a pack
        # of six arguments a name instead of twenty-two (docs/performance.md, "The first `ls`
        # of 100,000 names").
        tails: dict[tuple[int, ...], bytes] = {}
        packed = []
        append = packed.append
        for nodeid, node in zip(ids, plain, strict=True):
            a = node.attrs
            size = node.size
            same = (a.atime, a.mtime, a.ctime, a.mode, a.uid, a.gid, node.nlink, node.rdev)
            tail = tails.get(same)
            if tail is None:
                at, atn = divmod(a.atime, NS)
                mt, mtn = divmod(a.mtime, NS)
                ct, ctn = divmod(a.ctime, NS)
                tail = tails[same] = _pack_attr_tail(
                    at, mt, ct, atn, mtn, ctn, a.mode, node.nlink, a.uid, a.gid, node.rdev, BLKSIZE, 0
                )
            append(_pack_entry_parts(nodeid, valid, nodeid, size, (size + 511) // 512, tail))
        if not odd:
            return ids, packed
        # The others in their places, numbered after the plain ones.
        all_ids: list[int] = []
        all_packed: list[bytes] = []
        plain_at = iter(zip(ids, packed, strict=True))
        for i, (key, node) in enumerate(zip(keys, nodes, strict=True)):
            if i in skip:
                values = self._entry_values(key, node)
                all_ids.append(values[0])
                all_packed.append(_pack_entry(*values))
            else:
                nodeid, raw = next(plain_at)
                all_ids.append(nodeid)
                all_packed.append(raw)
        return all_ids, all_packed

    def _attr_valid(self, node: Node) -> tuple[int, int]:
        """How long the kernel may keep ``node``'s attributes: not at all for one shown as the
        older version open descriptors read (``Node.passing``), else the mount's timeout."""
        return (0, 0) if node.passing else self.attr_valid

    def _reply_entry(self, unique: int, key: str) -> None:
        node = self.ops.find(key)
        if node is None:
            raise FsError(errno.ENOENT, key, quiet=True)
        self._send(_ENTRY_HEADER(_ENTRY_REPLY_SIZE, 0, unique) + self._entry(key, node)[1])

    def _reply_attr(self, unique: int, nodeid: int, node: Node) -> None:
        inode = self.inodes.get(nodeid)
        if inode is not None:
            self.pages.shown(inode, node)
        ats, atns = self._attr_valid(node)
        self._send(k.ATTR_REPLY.pack(k.ATTR_REPLY.size, 0, unique, ats, atns, 0, *self._attr(nodeid, node)))

    # ------------------------------------------------------------------ session
    def _init(self, head: Header, buf: memoryview) -> None:
        try:
            wanted = k.WANTED | self.locks.flags | (k.ACL_FLAGS if self.acl_wanted else 0)
            agreed, reply = negotiate(buf[k.IN_HEADER_SIZE : head.len], head.unique, MAX_WRITE, wanted)
        except Refused as exc:
            log.error("%s", exc)
            self._reply_error(head, errno.EPROTO)
            return
        self._send(reply)
        log.debug("FUSE %d.%d agreed with the kernel, flags %#x", k.MAJOR, agreed.minor, agreed.flags)
        self.agreed = agreed
        self._inval_ok, self._store_ok, self._direct_ok = agreed.inval, agreed.store, agreed.direct_io_mmap
        self.locks.inval_ok = agreed.inval
        self._umask = bool(agreed.flags & k.DONT_MASK)
        self.ops.acl = bool(agreed.flags & k.POSIX_ACL)
        self.initialized = True
        self.invalidator.start()
        if agreed.flags & k.LOCKS:
            self.locks.start()
        if self.on_init is not None:
            on_init, self.on_init = self.on_init, None
            on_init()

    def _destroy(self, head: Header, buf: memoryview) -> None:
        self._reply_ok(head.unique)

    def close(self) -> None:
        """Stop sending notifications (the mount is ending)."""
        self.invalidator.stop()

    def drop_cached(self, nodeid: int) -> None:
        """Drop what the kernel caches of a file, its pages and attributes (and what the page
        cache policy remembers of them): another mount's bytes were stored with this mount's
        writes."""
        inode = self.inodes.get(nodeid)
        if inode is not None:
            self.pages.dropped(inode)
        if self._inval_ok:
            self.invalidator.drop_attrs([nodeid])
            self.invalidator.send([inval_inode(nodeid)])

    def keys_changed(self, keys: list[str]) -> None:
        """Drop what the kernel caches for ``keys``, changed as a side effect of another call
        (a consolidated document the format layer rewrote): their attributes and pages, and a
        cached "no such file" for a name that now exists. Nothing before INIT, or with a
        kernel whose version has no such notifications."""
        if not self._inval_ok:
            return
        notes = invalidations(keys, self.inodes.held)
        if notes:
            self.invalidator.send(notes)

    # ------------------------------------------------------------------ names
    def _feed_first(self) -> bool:
        """Whether a lookup must ask the change feed before it answers: the mount answers a
        name missing from the names it knows of a folder without asking the database, so a
        name another mount made, then closed, must come in first, or the open that follows
        the close on this mount would fail with ENOENT (close-to-open). Only when the feed
        has news: a look at its descriptor."""
        return self.coherence is not None and self.coherence.names_known and self.coherence.news()

    def _lookup(self, head: Header, buf: memoryview) -> None:
        # _child inlined, and the folder and name kept for ops.find: on this road each
        # microsecond before the reply counts several times over (docs/performance.md,
        # "Cold `stat` since cfc4921: a reply after the client's CPU went idle").
        folder = self.inodes.key(head.nodeid)
        if folder is None:
            raise FsError(errno.ENOENT, f"node {head.nodeid} is gone", quiet=True)
        try:
            name = key_text(_name(buf, k.IN_HEADER_SIZE, head.len))
        except FsError as exc:  # a name no file can have (EILSEQ) is not there
            if exc.errno != errno.EILSEQ:
                raise
            raise FsError(errno.ENOENT, str(exc), quiet=True) from None
        key = folder + "/" + name if folder else name
        coherence = self.coherence
        if (
            coherence is not None
            and coherence.names_known  # _feed_first, inlined
            and (self.admission is None or self.admission.runs_alone())
            and coherence.news()
        ):
            coherence.poll(locked=True)  # the kernel holds the folder's lock
        node = self.ops.find(key, folder, name)
        if node is None:
            if self.negative_valid == (0, 0):
                self._reply_error(head, errno.ENOENT)
            else:  # node ID 0: the kernel caches "no such file" for the entry timeout
                ns, nns = self.negative_valid
                if self.coherence is not None:  # remembered, to be dropped when it appears
                    ns, nns = self.coherence.negative_time(key, (ns, nns))
                self._send(
                    k.ENTRY_REPLY.pack(k.ENTRY_REPLY.size, 0, head.unique, 0, 0, ns, 0, nns, 0, *_ZERO_ATTR)
                )
            return
        self._send(_ENTRY_HEADER(_ENTRY_REPLY_SIZE, 0, head.unique) + self._entry(key, node)[1])

    def _forget(self, head: Header, buf: memoryview) -> None:
        self.inodes.forget(head.nodeid, k.FORGET_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])

    def _batch_forget(self, head: Header, buf: memoryview) -> None:
        count = k.BATCH_FORGET_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        at = k.IN_HEADER_SIZE + k.BATCH_FORGET_IN.size
        held = (head.len - at) // k.FORGET_ONE.size
        if count > held:  # forget what is there; the rest would be read past the request
            log.warning("batch_forget of %d nodes holds %d", count, held)
            count = held
        forget = self.inodes.forget
        for nodeid, n in k.FORGET_ONE.iter_unpack(buf[at : at + count * k.FORGET_ONE.size]):
            forget(nodeid, n)
        if self.inodes.shrunk():
            give_back_memory()

    def _getattr(self, head: Header, buf: memoryview) -> None:
        flags, _, fh = k.GETATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        key, node = self._existing(head.nodeid, self.inodes.key(head.nodeid))
        if node is None and flags & k.GETATTR_FH:
            node = self.files.open_node(fh)
        if node is None and key is None and self._orphans:
            node = self._orphan(head.nodeid)
        if node is None:
            raise FsError(errno.ENOENT, key or f"node {head.nodeid}", quiet=True)
        self._reply_attr(head.unique, head.nodeid, node)

    def _orphan(self, nodeid: int) -> Node | None:
        """What an open file unlinked while open shows, through any handle still open on it."""
        for fh in self._orphans.get(nodeid, ()):
            return self.files.open_node(fh)
        self._orphans.pop(nodeid, None)  # every handle closed: the file is gone
        return None

    def _setattr(self, head: Header, buf: memoryview) -> None:
        (valid, _, fh, size, _, atime, mtime, _, atimens, mtimens, _, mode, _, uid, gid, _) = (
            k.SETATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        )
        handle = fh if valid & k.FATTR_FH else None
        key = self.inodes.key(head.nodeid)
        if key is None:  # a file unlinked while open (fchmod comes without a handle)
            handle = next(iter(self._orphans.get(head.nodeid, ())), None) if handle is None else handle
            if handle is None:
                raise FsError(errno.ENOENT, f"node {head.nodeid} is gone", quiet=True)
            set_attrs = functools.partial(self.ops.set_open_attrs, handle)
        else:
            set_attrs = functools.partial(self.ops.set_attrs, key)
        if valid & k.FATTR_KILL_SUIDGID and not valid & k.FATTR_MODE:
            self._kill_suidgid(key, handle, set_attrs)
        # The order of chmod, chown, truncate, utimens: explicit times are set last.
        if valid & k.FATTR_MODE:
            set_attrs(mode=mode)
        if valid & (k.FATTR_UID | k.FATTR_GID):
            set_attrs(uid=uid if valid & k.FATTR_UID else None, gid=gid if valid & k.FATTR_GID else None)
        if valid & k.FATTR_SIZE:
            self.files.truncate(key or "", size, handle)
        if valid & (k.FATTR_ATIME | k.FATTR_MTIME):
            set_attrs(
                atime=_time(valid, k.FATTR_ATIME, k.FATTR_ATIME_NOW, atime, atimens),
                mtime=_time(valid, k.FATTR_MTIME, k.FATTR_MTIME_NOW, mtime, mtimens),
            )
        node = None if key is None else self.ops.find(key)
        if node is None and handle is not None:
            node = self.files.open_node(handle)
        if node is None:
            raise FsError(errno.ENOENT, key or f"node {head.nodeid}", quiet=True)
        self._reply_attr(head.unique, head.nodeid, node)

    def _kill_suidgid(self, key: str | None, handle: int | None, set_attrs: Callable) -> None:
        """A chown, or a truncate by a caller without CAP_FSETID, under HANDLE_KILLPRIV_V2:
        the set-id bits the kernel's VFS would clear, cleared here (:func:`without_setid`)."""
        node = None if key is None else self.ops.find(key)
        if node is None and handle is not None:
            node = self.files.open_node(handle)
        if node is not None and node.kind != DIR and without_setid(node.attrs.mode) != node.attrs.mode:
            set_attrs(mode=without_setid(node.attrs.mode))

    def _readlink(self, head: Header, buf: memoryview) -> None:
        target = self.ops.readlink(self._key(head.nodeid))
        self._reply_data(head.unique, target.encode("utf-8", "surrogateescape"))

    def _symlink(self, head: Header, buf: memoryview) -> None:
        name, target = k.names(buf, k.IN_HEADER_SIZE, head.len)
        key = self._child(head.nodeid, name)
        self.ops.symlink(target.decode("utf-8", "surrogateescape"), key, head.uid, head.gid)
        self._reply_entry(head.unique, key)

    def _mknod(self, head: Header, buf: memoryview) -> None:
        mode, rdev, umask = k.MKNOD_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        key = self._child(head.nodeid, _name(buf, k.IN_HEADER_SIZE + k.MKNOD_IN.size, head.len))
        self.ops.mknod(key, mode, rdev, head.uid, head.gid, umask if self._umask else 0)
        self._reply_entry(head.unique, key)

    def _mkdir(self, head: Header, buf: memoryview) -> None:
        mode, umask = k.MKDIR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        key = self._child(head.nodeid, _name(buf, k.IN_HEADER_SIZE + k.MKDIR_IN.size, head.len))
        self.ops.mkdir(key, mode, head.uid, head.gid, umask if self._umask else 0)
        self._reply_entry(head.unique, key)

    def _unlink(self, head: Header, buf: memoryview) -> None:
        key = self._child(head.nodeid, _name(buf, k.IN_HEADER_SIZE, head.len))
        handles = self.files.handles_of(key)
        self.ops.unlink(key)
        self._orphaned(self.inodes.ids.get(key), handles)
        self.inodes.detach(key)
        self._reply_ok(head.unique)

    def _orphaned(self, nodeid: int | None, handles: set[int]) -> None:
        """Keep the handles open on a node whose name was removed (an unlink, a rename onto
        it): what ``fstat``, ``fchmod`` and the like of its descriptors answer from."""
        if handles and nodeid is not None:
            self._orphans = {n: h for n, h in self._orphans.items() if h}  # drop closed ones
            self._orphans[nodeid] = handles

    def _rmdir(self, head: Header, buf: memoryview) -> None:
        key = self._child(head.nodeid, _name(buf, k.IN_HEADER_SIZE, head.len))
        self.ops.rmdir(key)
        self.inodes.detach(key)
        self._reply_ok(head.unique)

    def _rename(self, head: Header, buf: memoryview) -> None:
        newdir = k.RENAME_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        self._move(head, buf, newdir, 0, k.IN_HEADER_SIZE + k.RENAME_IN.size)

    def _rename2(self, head: Header, buf: memoryview) -> None:
        newdir, flags, _ = k.RENAME2_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        self._move(head, buf, newdir, flags, k.IN_HEADER_SIZE + k.RENAME2_IN.size)

    def _move(self, head: Header, buf: memoryview, newdir: int, flags: int, at: int) -> None:
        old, new = k.names(buf, at, head.len)
        src, dst = self._child(head.nodeid, old), self._child(newdir, new)
        # What others changed of the names first, while the kernel's nodes are still theirs:
        # a change heard after the move would drop the node now at the name, not the one moved.
        if self.coherence is not None and (self.admission is None or self.admission.runs_alone()):
            if self.coherence.news():  # the kernel holds both folders' locks
                self.coherence.poll(locked=True)
        replaced = None if flags & RENAME_EXCHANGE else self.inodes.ids.get(dst)
        handles = self.files.handles_of(dst) if replaced is not None else set()
        stored = self.ops.rename(src, dst, flags)
        if flags & RENAME_EXCHANGE:
            self.inodes.exchanged(src, dst)
            if self.coherence is not None and self._inval_ok:
                # Each name now shows the other's stored value, which a change not heard yet
                # may have made newer than the version its node was shown at: then its size
                # is dropped at once, its pages by the next open (which keeps none of them).
                # Not otherwise: a drop makes the kernel ignore what a request about the node
                # sent before it answers (a size a read or a getattr brings).
                moved = []
                for key in (src, dst):
                    nodeid = self.inodes.held(key)
                    node = None if nodeid is None else self.ops.find(key)
                    inode = None if nodeid is None else self.inodes.nodes[nodeid]
                    if inode is not None and (node is None or self.pages.differs(inode, node)):
                        self.pages.dropped(inode)
                        moved.append(nodeid)
                self.invalidator.drop_attrs(moved)
        else:
            self.inodes.moved(src, dst)
            self._stored(self.inodes.ids.get(dst), stored)
            if replaced != self.inodes.ids.get(dst):  # not two names of one file
                self._orphaned(replaced, handles)
        self._reply_ok(head.unique)

    def _link(self, head: Header, buf: memoryview) -> None:
        src = self._key(k.LINK_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])
        dst = self._child(head.nodeid, _name(buf, k.IN_HEADER_SIZE + k.LINK_IN.size, head.len))
        self.ops.link(src, dst)
        node = self.ops.find(dst)
        if node is None:
            raise FsError(errno.ENOENT, dst, quiet=True)
        # The kernel's inode of the source is the inode of the new name: same node ID.
        self.inodes.linked(k.LINK_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0], node.group)
        self._send(_ENTRY_HEADER(_ENTRY_REPLY_SIZE, 0, head.unique) + self._entry(dst, node)[1])

    # ------------------------------------------------------------------ files
    def _create(self, head: Header, buf: memoryview) -> None:
        flags, mode, umask, _ = k.CREATE_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        key = self._child(head.nodeid, _name(buf, k.IN_HEADER_SIZE + k.CREATE_IN.size, head.len))
        fh = self.ops.create(key, mode, flags, head.uid, head.gid, umask if self._umask else 0)
        node = self.ops.find(key)
        if node is None:  # cannot happen: a created file shows at once
            self.ops.release(fh)
            raise FsError(errno.EIO, f"{key} vanished while it was created")
        entry = self._entry(key, node)[1]
        open_flags = 0
        if flags & os.O_ACCMODE == os.O_WRONLY and self._direct_ok:
            # Written past the page cache: the kernel then asks no GETXATTR of
            # security.capability before the first write (its cached path does, for every new
            # file; the direct one leaves set-id bits and capabilities to the daemon under
            # HANDLE_KILLPRIV_V2). A write-only descriptor reads nothing; the kernel drops
            # the pages a direct write covers, so another descriptor's cached reads see it
            # (Linux 6.6, the same release as _direct_ok's DIRECT_IO_ALLOW_MMAP); and the
            # content is handed to the kernel once stored and closed
            # (HandleTable.write_direct), so what was written is read back from memory.
            open_flags = k.FOPEN_DIRECT_IO
            self.files.write_direct(fh)
            self._direct_writes.add(fh)
        self._send(_ENTRY_HEADER(k.CREATE_REPLY.size, 0, head.unique) + entry + _OPEN_OUT(fh, open_flags, 0))

    def _open(self, head: Header, buf: memoryview) -> None:
        flags, kill = k.OPEN_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        # Close-to-open: what others committed, first (with several request threads, by an
        # open that runs alone: reader_key makes one when the feed has news); then the node's
        # name, which that may change (a hard link removed elsewhere).
        if self.coherence is not None and (self.admission is None or self.admission.runs_alone()):
            self.coherence.poll()
        key = self._key(head.nodeid)
        if self.inodes.nodes[head.nodeid].aliases:
            key = self._existing(head.nodeid, key)[0] or key
        inode = self.inodes.get(head.nodeid)
        # A file known without hard links needs no look for its other names.
        fh = self.files.open(key, flags, None if inode is None or inode.group else False)
        if kill & k.OPEN_KILL_SUIDGID and flags & os.O_TRUNC:  # by one without CAP_FSETID
            self.files.kill_suidgid(fh)
        seen, private = self.files.opened(fh)
        if seen is not None and self.coherence is not None and self.coherence.news():
            # A commit the open read may have come after the look above: its drops go before
            # this reply, or the kernel could show the size it held over the pages read now
            # (with request threads: when this open runs alone, as a writer does).
            if self.admission is None or self.admission.runs_alone():
                self.coherence.poll()
        if seen is not None and inode is not None and self._inval_ok:
            self._show_anew(head.nodeid, inode, key, seen)
        # The kernel holds no size of this version (dropped, with the size it had before kept
        # for reads short of it): a read through the page cache could be padded to that size.
        # Nor is it sure to after another writer's change: a reply may have shown this version
        # to a kernel that ignored it (a request sent before the drop).
        heard = inode is not None and inode.heard
        if heard:
            inode.heard = False
        unsure = seen is not None and inode is not None and (heard or not self.pages.holds(inode, seen))
        if private:  # the kernel's pages are another version's, which descriptors still read
            open_flags = k.FOPEN_DIRECT_IO
        else:
            keep = inode is not None and self.pages.opened(inode, self.ops.find, key, seen)
            open_flags = k.FOPEN_KEEP_CACHE if keep else 0
            # Past the page cache only where a mapping of the file still works (_direct_ok).
            readonly = flags & os.O_ACCMODE == os.O_RDONLY
            if self._direct_ok and readonly and (unsure or self.pages.direct(keep, seen, readonly)):
                open_flags = k.FOPEN_DIRECT_IO
        if flags & os.O_ACCMODE == os.O_RDONLY:
            # Its close has nothing to store: spare the reader that round trip.
            open_flags |= k.FOPEN_NOFLUSH
        self._send(k.OPEN_REPLY.pack(k.OPEN_REPLY.size, 0, head.unique, fh, open_flags, 0))

    def _show_anew(self, nodeid: int, inode, key: str, seen: Node) -> None:
        """Drop the kernel's attributes of a file opened at another version than the one whose
        attributes it holds (given by any reply, a lookup's too, and not dropped since), before
        the open's reply, when the newer one is what it is to be shown now: its size over
        pages read at this open would cut or pad them. While descriptors of the older version
        are open, the file is shown as that version (``find``). Written at once, not queued:
        a drop still queued (behind one waiting for a folder's lock) may reach the kernel
        after this reply."""
        if self.pages.differs(inode, seen):
            shown = self.ops.find(key)
            if shown is not None and self.pages.differs(inode, shown):
                self.pages.dropped(inode)
                self.invalidator.drop_attrs([nodeid])

    def _read(self, head: Header, buf: memoryview) -> None:
        fh, offset, size = k.READ_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        data = self.files.read(fh, size, offset)
        self.bytes_read += len(data)
        self._reply_data(head.unique, data)

    def _write(self, head: Header, buf: memoryview) -> None:
        fh, offset, size, write_flags = k.WRITE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:4]
        if size > head.len - k.WRITE_DATA:
            raise k.Malformed(f"a write of {size} bytes in a request of {head.len}")
        written = self.files.write(fh, buf[k.WRITE_DATA : k.WRITE_DATA + size], offset)
        self.bytes_written += written
        if write_flags & k.WRITE_KILL_SUIDGID:  # a writer without CAP_FSETID (HANDLE_KILLPRIV_V2)
            self.files.kill_suidgid(fh)
        if fh in self._direct_writes and (key := self.files.named_and_stored(fh)) is not None:
            # Past the page cache the kernel removes no capability: a file stored since its
            # create may have been given one (a new file has none until then).
            self.xattrs.kill_capability(head.nodeid, key)
        self._send(k.WRITE_REPLY.pack(k.WRITE_REPLY.size, 0, head.unique, written, 0))

    def _fallocate(self, head: Header, buf: memoryview) -> None:
        fh, offset, length, mode = k.FALLOCATE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:4]
        self.files.fallocate(fh, offset, length, mode)
        self._reply_ok(head.unique)

    def _lseek(self, head: Header, buf: memoryview) -> None:
        fh, offset, whence = k.LSEEK_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        if whence not in (os.SEEK_DATA, os.SEEK_HOLE):  # the kernel answers the others itself
            raise FsError(errno.EINVAL, f"lseek whence {whence}", quiet=True)
        at = self.files.seek(fh, offset, whence)
        self._send(k.LSEEK_REPLY.pack(k.LSEEK_REPLY.size, 0, head.unique, at))

    def _flush(self, head: Header, buf: memoryview) -> None:
        fh, _, _, lock_owner = k.FLUSH_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        self._stored(head.nodeid, self.ops.flush(fh, lock_owner))
        self._reply_ok(head.unique)

    def passing_key(self, data: memoryview, nodeid: int):
        """With several request threads: the key of a writer that may run while a close's
        commit waits on its server (``Admission.open_door``), None for others. A create (its
        folder and name, as a lookup of that name), a write and a release (their file) write
        nothing to the database as a rule: a new file is stored at its close, a write goes to
        the open file's buffer (one whose content is not read yet reads it, through its own
        connection), a release after a close forgets the descriptor. One that writes after all
        (a default ACL, a release storing what a close did not, an unlock) first waits for its
        turn as the writer (``Admission.upgrade``)."""
        length, opcode = _OPCODE.unpack_from(data)
        if opcode in (k.WRITE, k.RELEASE):
            return nodeid
        if opcode == k.CREATE and length > k.IN_HEADER_SIZE + k.CREATE_IN.size:
            return (nodeid, bytes(data[k.IN_HEADER_SIZE + k.CREATE_IN.size : length]))
        return None

    def shared_flush(self, data: memoryview) -> bool:
        """Whether the request ``data`` is a close whose commit may share a transaction with
        other closes' (``fuse.workers`` then serves those waiting together: :meth:`flushes`)."""
        if len(data) < k.IN_HEADER_SIZE + k.FLUSH_IN.size or _OPCODE.unpack_from(data)[1] != k.FLUSH:
            return False
        return self.ops.flush_shares(_FH.unpack_from(data, k.IN_HEADER_SIZE)[0])

    def flushes(self, requests: list[memoryview]) -> None:
        """Answer several closes of different files (each one :meth:`shared_flush`) at once:
        their commits in one transaction where they can be (``HandleTable.flush_many``), each
        answered with its own result."""
        heads = [Header._make(k.IN_HEADER.unpack_from(data)) for data in requests]
        with self._answering(k.FLUSH, len(heads)):  # their time, as handle() counts one's
            fhs = [k.FLUSH_IN.unpack_from(data, k.IN_HEADER_SIZE)[0] for data in requests]
            results = self.files.flush_many(fhs)
            for head, data, result in zip(heads, requests, results, strict=True):
                if isinstance(result, Exception):
                    self._failed(head, k.FLUSH, result, data)
                    continue
                try:
                    self._stored(head.nodeid, result)
                except Exception as exc:  # the kernel's page store: the commit stands
                    log.debug("after the commit of node %d: %s", head.nodeid, exc)
                self._reply_ok(head.unique)

    def _fsync(self, head: Header, buf: memoryview) -> None:
        self._stored(head.nodeid, self.files.fsync(k.FSYNC_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]))
        self._reply_ok(head.unique)

    def _release(self, head: Header, buf: memoryview) -> None:
        fh = k.RELEASE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        self._direct_writes.discard(fh)
        try:
            self._stored(head.nodeid, self.ops.release(fh))
        except Exception as exc:  # nobody to tell: close() has returned already
            log.error("release %s: %s", self._describe(head), exc)
        lost = self.files.take_never_stored()
        if lost and self._inval_ok:  # created, never stored: the kernel forgets the name
            self.invalidator.post(invalidations(lost, self.inodes.held))
        outdated = self.files.take_outdated()
        if outdated and self._inval_ok:  # shown as the version its last descriptors read
            # Its size at once; its pages, the older version's, by the next open (none kept).
            held = [n for n in map(self.inodes.held, outdated) if n is not None]
            for nodeid in held:
                self.pages.dropped(self.inodes.nodes[nodeid])
            self.invalidator.drop_attrs(held)
        self._reply_ok(head.unique)

    def _statfs(self, head: Header, buf: memoryview) -> None:
        s = self.ops.statfs()
        figures = (s[f] for f in ("f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_bsize"))
        tail = (s["f_namemax"], s["f_frsize"], 0)
        self._send(k.STATFS_REPLY.pack(k.STATFS_REPLY.size, 0, head.unique, *figures, *tail))

    # ------------------------------------------------------------------ folders (fuse.dirreq)
    def _opendir(self, head: Header, buf: memoryview) -> None:
        # Under a change feed the kernel keeps a folder's listing (fuse.dirreq): what others
        # committed comes first, as for an open, so a listing after another mount's close
        # shows its names (their notifications drop the kept listing before this reply).
        followed = self.coherence is not None
        if followed and (self.admission is None or self.admission.runs_alone()):
            self.coherence.poll()
        self.dirs.opendir(head, buf, keep=followed)

    def _readdir(self, head: Header, buf: memoryview) -> None:
        self.dirs.readdir(head, buf)

    def _readdirplus(self, head: Header, buf: memoryview) -> None:
        self.dirs.readdirplus(head, buf)

    def _releasedir(self, head: Header, buf: memoryview) -> None:
        self.dirs.releasedir(head, buf)

    def _fsyncdir(self, head: Header, buf: memoryview) -> None:
        self.dirs.fsyncdir(head, buf)

    # ------------------------------------------------------------------ locks (fuse.lockreq)
    def _getlk(self, head: Header, buf: memoryview) -> None:
        self.locks.getlk(head, buf)

    def _setlk(self, head: Header, buf: memoryview) -> None:
        self.locks.setlk(head, buf)

    def _setlkw(self, head: Header, buf: memoryview) -> None:
        self.locks.setlkw(head, buf)

    def _interrupt(self, head: Header, buf: memoryview) -> None:
        self.locks.interrupt(head, buf)

    # ------------------------------------------------------------------ xattrs (fuse.xattrreq)
    def _getxattr(self, head: Header, buf: memoryview) -> None:
        self.xattrs.getxattr(head, buf)

    def _listxattr(self, head: Header, buf: memoryview) -> None:
        self.xattrs.listxattr(head, buf)

    def _setxattr(self, head: Header, buf: memoryview) -> None:
        self.xattrs.setxattr(head, buf)

    def _removexattr(self, head: Header, buf: memoryview) -> None:
        self.xattrs.removexattr(head, buf)


_ZERO_ATTR = (0,) * 16


def _time(valid: int, given: int, now: int, seconds: int, nanos: int) -> int | str | None:
    """A time of a SETATTR in nanoseconds, :data:`NOW`, or None when it is not changed."""
    if not valid & given:
        return None
    if valid & now:
        return NOW
    return seconds * NS + nanos


__all__ = ["BLKSIZE", "BUFFER_SIZE", "MAX_WRITE", "Session"]

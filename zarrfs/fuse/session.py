"""The FUSE session: kernel requests in, :class:`~zarrfs.fs.api.Operations` calls, replies out.

zarrfs answers the kernel itself rather than through libfuse's callbacks: a request is parsed
with :mod:`struct` straight from the buffer it was read into, node IDs become store keys
through the :class:`~zarrfs.fuse.inodes.InodeTable`, and each reply is one packed ``bytes`` written
to ``/dev/fuse``. No call from C back into Python per request, no path rebuilt by libfuse for
each call. On the README's machine the same loop answering lookups from a dict
(``scripts/python_floor.py``) serves 31,000-43,000 per second to one client, about what a C
filesystem does there (``scripts/fuse_floor.c``): what a request costs beyond that is the
work of the call itself.

Every exception a call raises becomes the errno of the reply here, through
:func:`zarrfs.fs.errors.to_errno`, with one log line unless it is routine (a missing name).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable

from zarrfs.fs.api import NOW, Operations
from zarrfs.fs.errors import FsError, is_quiet, to_errno
from zarrfs.fs.handles import Stored
from zarrfs.fs.namespace import DIR, FILE, RENAME_EXCHANGE, Node
from zarrfs.fuse import abi as k
from zarrfs.fuse.inodes import Inode, InodeTable
from zarrfs.fuse.notify import Invalidator

log = logging.getLogger("zarrfs.fuse.session")

BLKSIZE = 1 << 20  # st_blksize: tools read and write in blocks this large
MAX_WRITE = 1 << 20  # bytes of data in one WRITE request
BUFFER_SIZE = MAX_WRITE + 4096  # a request with its headers
NS = 1_000_000_000

Handler = Callable[[tuple, memoryview], None]


class Session:
    """Serves one mount's requests. ``timeouts`` are the kernel's cache times in seconds for
    names, attributes and missing names; ``on_init`` runs once the kernel has applied INIT."""

    def __init__(
        self,
        ops: Operations,
        fd: int,
        entry_timeout: float = 1.0,
        attr_timeout: float = 1.0,
        negative_timeout: float = 1.0,
        on_init: Callable[[], None] | None = None,
    ) -> None:
        self.ops = ops
        self.fd = fd
        self.inodes = InodeTable(DIR)
        self.entry_valid = k.split_time(entry_timeout)
        self.attr_valid = k.split_time(attr_timeout)
        self.negative_valid = k.split_time(negative_timeout)
        self.attr_timeout = attr_timeout
        self.on_init = on_init
        self.initialized = False
        self.invalidator = Invalidator(fd)
        ops.tree.on_side_effects = self.keys_changed
        self.handlers: list[Handler | None] = [None] * 64
        for code, name in k.OPCODE_NAMES.items():
            self.handlers[code] = getattr(self, "_" + name, None)

    # ------------------------------------------------------------------ dispatch
    def handle(self, buf: memoryview) -> None:
        """Answer the request at the start of ``buf``."""
        head = k.IN_HEADER.unpack_from(buf)
        op = head[1]
        handler = self.handlers[op] if op < 64 else None
        try:
            if handler is None:
                if op != k.INTERRUPT:  # interrupts are not answered; requests run to the end
                    self._reply_error(head[2], errno.ENOSYS)
                return
            handler(head, buf)
        except Exception as exc:
            if op in _UNANSWERED:
                log.error("%s: %s", k.OPCODE_NAMES[op], exc)
                return
            code = to_errno(exc)
            if not is_quiet(exc):
                level = logging.WARNING if isinstance(exc, OSError) else logging.ERROR
                what = k.OPCODE_NAMES.get(op, str(op))
                log.log(
                    level, "%s %s: %s (%s)", what, self._describe(head), errno.errorcode.get(code, code), exc
                )
            self._reply_error(head[2], code)

    def _describe(self, head: tuple) -> str:
        key = self.inodes.key(head[3])
        return "/" + key if key is not None else f"node {head[3]}"

    def _send(self, data) -> None:
        try:
            os.write(self.fd, data)
        except FileNotFoundError:
            pass  # the request was interrupted and is gone: nobody waits for this reply

    def _reply_error(self, unique: int, code: int) -> None:
        self._send(k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, -code, unique))

    def _reply_ok(self, unique: int) -> None:
        self._send(k.OUT_HEADER.pack(k.OUT_HEADER_SIZE, 0, unique))

    def _reply_data(self, unique: int, data) -> None:
        header = k.OUT_HEADER.pack(k.OUT_HEADER_SIZE + len(data), 0, unique)
        try:
            os.writev(self.fd, [header, data])
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ helpers
    def _key(self, nodeid: int) -> str:
        key = self.inodes.key(nodeid)
        if key is None:
            raise FsError(errno.ENOENT, f"node {nodeid} is gone", quiet=True)
        return key

    def _child(self, nodeid: int, name: bytes) -> str:
        parent = self._key(nodeid)
        text = name.decode("utf-8", "surrogateescape")
        return parent + "/" + text if parent else text

    def _name(self, buf: memoryview, start: int, head: tuple) -> bytes:
        return bytes(buf[start : head[0] - 1])

    def _stamp(self, inode: Inode, node: Node) -> None:
        # What decides whether an open may keep the file's cached pages: unchanged since the
        # last open, judged by size and mtime (libfuse's auto_cache does the same).
        if node.kind == FILE:
            stamp = (node.size, node.attrs.mtime)
            if stamp != inode.stamp:
                inode.stamp = stamp
                inode.cache_ok = False
            inode.stamp_time = time.monotonic()

    def _stored(self, nodeid: int | None, stored: Stored | None) -> None:
        # Content written through this mount was stored: the kernel's pages of the file are
        # that content (writes go through its page cache), so the next open may keep them.
        if nodeid is None or stored is None:
            return
        inode = self.inodes.get(nodeid)
        if inode is None:
            return
        inode.stamp = (stored.size, stored.mtime)
        inode.stamp_time = time.monotonic()
        inode.cache_ok = True
        if stored.tail:
            self._store_tail(nodeid, stored)

    def _store_tail(self, nodeid: int, stored: Stored) -> None:
        # All pages but a partial last one are cached by the writes; handing the kernel that
        # one spares a READ (and a database read) at the next read of the file: a Zarr chunk
        # read then never reaches the daemon. Only given once no descriptor of the file is
        # open (see handles._tail), so writing it here cannot wait on a request of ours.
        if not self.initialized:
            return
        cut = len(stored.tail)
        size = k.NOTIFY_STORE_OUT.size + cut
        head = k.NOTIFY_STORE_OUT.pack(size, k.NOTIFY_STORE, 0, nodeid, stored.size - cut, cut, 0)
        try:
            os.writev(self.fd, [head, stored.tail])
        except OSError as exc:  # ENOENT: the kernel no longer holds the file; nothing to give
            log.debug("page store for node %d not taken: %s", nodeid, exc)

    def _attr(self, nodeid: int, node: Node) -> tuple:
        a = node.attrs
        size = node.size
        at, atn = divmod(a.atime, NS)
        mt, mtn = divmod(a.mtime, NS)
        ct, ctn = divmod(a.ctime, NS)
        # nlink 1 for folders too: it tells find(1) not to guess subfolder counts from it.
        return (
            nodeid,
            size,
            (size + 511) // 512,
            at,
            mt,
            ct,
            atn,
            mtn,
            ctn,
            a.mode,
            1,
            a.uid,
            a.gid,
            0,
            BLKSIZE,
            0,
        )

    def _entry_values(self, key: str, node: Node) -> tuple:
        nodeid, inode = self.inodes.remember(key, node.kind)
        self._stamp(inode, node)
        es, ens = self.entry_valid
        ats, atns = self.attr_valid
        return (nodeid, 0, es, ats, ens, atns, *self._attr(nodeid, node))

    def _reply_entry(self, unique: int, key: str) -> None:
        node = self.ops.find(key)
        if node is None:
            raise FsError(errno.ENOENT, key, quiet=True)
        self._send(k.ENTRY_REPLY.pack(k.ENTRY_REPLY.size, 0, unique, *self._entry_values(key, node)))

    def _reply_attr(self, unique: int, nodeid: int, node: Node) -> None:
        inode = self.inodes.get(nodeid)
        if inode is not None:
            self._stamp(inode, node)
        ats, atns = self.attr_valid
        self._send(k.ATTR_REPLY.pack(k.ATTR_REPLY.size, 0, unique, ats, atns, 0, *self._attr(nodeid, node)))

    # ------------------------------------------------------------------ session
    def _init(self, head: tuple, buf: memoryview) -> None:
        major, minor, readahead, flags = k.INIT_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        if major < k.MAJOR:
            log.error("the kernel speaks FUSE %d.%d; zarrfs needs 7.%d or later", major, minor, k.MINOR)
            self._reply_error(head[2], errno.EPROTO)
            return
        self._send(
            k.INIT_REPLY.pack(
                k.INIT_REPLY.size,
                0,
                head[2],
                k.MAJOR,
                k.MINOR,
                readahead,
                flags & k.WANTED,
                0,  # max_background: the kernel's default
                0,  # congestion_threshold: the kernel's default
                MAX_WRITE,
                1,  # time_gran: nanoseconds
                MAX_WRITE // 4096,  # max_pages
                0,
                0,
            )
        )
        self.initialized = True
        self.invalidator.start()
        if self.on_init is not None:
            on_init, self.on_init = self.on_init, None
            on_init()

    def _destroy(self, head: tuple, buf: memoryview) -> None:
        self._reply_ok(head[2])

    def close(self) -> None:
        """Stop sending notifications (the mount is ending)."""
        self.invalidator.stop()

    def keys_changed(self, keys: list[str]) -> None:
        """Drop what the kernel caches for ``keys``, changed as a side effect of another call
        (a consolidated document the format layer rewrote): their attributes and pages, and a
        cached "no such file" for a name that now exists."""
        notes = []
        for key in keys:
            nodeid = self.inodes.ids.get(key)
            if nodeid is not None:
                notes.append(k.NOTIFY_INVAL_INODE_OUT.pack(40, k.NOTIFY_INVAL_INODE, 0, nodeid, 0, 0))
            parent, _, name = key.rpartition("/")
            parent_id = self.inodes.ids.get(parent)
            if parent_id is not None:
                raw = name.encode("utf-8", "surrogateescape")
                size = k.NOTIFY_INVAL_ENTRY_OUT.size + len(raw) + 1
                head = k.NOTIFY_INVAL_ENTRY_OUT.pack(size, k.NOTIFY_INVAL_ENTRY, 0, parent_id, len(raw), 0)
                notes.append(head + raw + b"\0")
        if notes:
            self.invalidator.send(notes)

    # ------------------------------------------------------------------ names
    def _lookup(self, head: tuple, buf: memoryview) -> None:
        key = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE, head))
        node = self.ops.find(key)
        if node is None:
            if self.negative_valid == (0, 0):
                self._reply_error(head[2], errno.ENOENT)
            else:  # node ID 0: the kernel caches "no such file" for the entry timeout
                ns, nns = self.negative_valid
                self._send(
                    k.ENTRY_REPLY.pack(k.ENTRY_REPLY.size, 0, head[2], 0, 0, ns, 0, nns, 0, *_ZERO_ATTR)
                )
            return
        self._send(k.ENTRY_REPLY.pack(k.ENTRY_REPLY.size, 0, head[2], *self._entry_values(key, node)))

    def _forget(self, head: tuple, buf: memoryview) -> None:
        self.inodes.forget(head[3], k.FORGET_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])

    def _batch_forget(self, head: tuple, buf: memoryview) -> None:
        count = k.BATCH_FORGET_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        at = k.IN_HEADER_SIZE + k.BATCH_FORGET_IN.size
        forget = self.inodes.forget
        for nodeid, n in k.FORGET_ONE.iter_unpack(buf[at : at + count * k.FORGET_ONE.size]):
            forget(nodeid, n)

    def _getattr(self, head: tuple, buf: memoryview) -> None:
        flags, _, fh = k.GETATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        key = self.inodes.key(head[3])
        node = None if key is None else self.ops.find(key)
        if node is None and flags & k.GETATTR_FH:
            node = self.ops.find_open(fh)
        if node is None:
            raise FsError(errno.ENOENT, key or f"node {head[3]}", quiet=True)
        self._reply_attr(head[2], head[3], node)

    def _setattr(self, head: tuple, buf: memoryview) -> None:
        (valid, _, fh, size, _, atime, mtime, _, atimens, mtimens, _, mode, _, uid, gid, _) = (
            k.SETATTR_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        )
        handle = fh if valid & k.FATTR_FH else None
        key = self.inodes.key(head[3])
        if key is None:
            if handle is None:
                raise FsError(errno.ENOENT, f"node {head[3]} is gone", quiet=True)
            if valid & k.FATTR_SIZE:
                self.ops.truncate("", size, handle)
        else:
            ops = self.ops
            # The order of chmod, chown, truncate, utimens: explicit times are set last.
            if valid & k.FATTR_MODE:
                ops.set_attrs(key, mode=mode)
            if valid & (k.FATTR_UID | k.FATTR_GID):
                ops.set_attrs(
                    key, uid=uid if valid & k.FATTR_UID else None, gid=gid if valid & k.FATTR_GID else None
                )
            if valid & k.FATTR_SIZE:
                ops.truncate(key, size, handle)
            if valid & (k.FATTR_ATIME | k.FATTR_MTIME):
                ops.set_attrs(
                    key,
                    atime=_time(valid, k.FATTR_ATIME, k.FATTR_ATIME_NOW, atime, atimens),
                    mtime=_time(valid, k.FATTR_MTIME, k.FATTR_MTIME_NOW, mtime, mtimens),
                )
        node = None if key is None else self.ops.find(key)
        if node is None and handle is not None:
            node = self.ops.find_open(handle)
        if node is None:
            raise FsError(errno.ENOENT, key or f"node {head[3]}", quiet=True)
        self._reply_attr(head[2], head[3], node)

    def _readlink(self, head: tuple, buf: memoryview) -> None:
        target = self.ops.readlink(self._key(head[3]))
        self._reply_data(head[2], target.encode("utf-8", "surrogateescape"))

    def _symlink(self, head: tuple, buf: memoryview) -> None:
        name, target = k.names(buf, k.IN_HEADER_SIZE, head[0])[:2]
        key = self._child(head[3], name)
        self.ops.symlink(target.decode("utf-8", "surrogateescape"), key, head[4], head[5])
        self._reply_entry(head[2], key)

    def _mknod(self, head: tuple, buf: memoryview) -> None:
        mode = k.MKNOD_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        key = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE + k.MKNOD_IN.size, head))
        if not stat.S_ISREG(mode):
            raise FsError(errno.EPERM, f"{key}: only regular files, folders and symlinks are stored")
        fh = self.ops.create(key, mode, os.O_WRONLY | os.O_CREAT | os.O_EXCL, head[4], head[5])
        self.ops.release(fh)
        self._reply_entry(head[2], key)

    def _mkdir(self, head: tuple, buf: memoryview) -> None:
        mode = k.MKDIR_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        key = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE + k.MKDIR_IN.size, head))
        self.ops.mkdir(key, mode)
        self._reply_entry(head[2], key)

    def _unlink(self, head: tuple, buf: memoryview) -> None:
        key = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE, head))
        self.ops.unlink(key)
        self.inodes.detach(key)
        self._reply_ok(head[2])

    def _rmdir(self, head: tuple, buf: memoryview) -> None:
        key = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE, head))
        self.ops.rmdir(key)
        self.inodes.detach(key)
        self._reply_ok(head[2])

    def _rename(self, head: tuple, buf: memoryview) -> None:
        newdir = k.RENAME_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        self._move(head, buf, newdir, 0, k.IN_HEADER_SIZE + k.RENAME_IN.size)

    def _rename2(self, head: tuple, buf: memoryview) -> None:
        newdir, flags, _ = k.RENAME2_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        self._move(head, buf, newdir, flags, k.IN_HEADER_SIZE + k.RENAME2_IN.size)

    def _move(self, head: tuple, buf: memoryview, newdir: int, flags: int, at: int) -> None:
        old, new = k.names(buf, at, head[0])[:2]
        src, dst = self._child(head[3], old), self._child(newdir, new)
        stored = self.ops.rename(src, dst, flags)
        if flags & RENAME_EXCHANGE:
            self.inodes.exchanged(src, dst)
        else:
            self.inodes.moved(src, dst)
            self._stored(self.inodes.ids.get(dst), stored)
        self._reply_ok(head[2])

    def _link(self, head: tuple, buf: memoryview) -> None:
        src = self._key(k.LINK_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])
        dst = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE + k.LINK_IN.size, head))
        self.ops.link(src, dst)
        self._reply_entry(head[2], dst)

    # ------------------------------------------------------------------ files
    def _create(self, head: tuple, buf: memoryview) -> None:
        flags, mode, _, _ = k.CREATE_IN.unpack_from(buf, k.IN_HEADER_SIZE)
        key = self._child(head[3], self._name(buf, k.IN_HEADER_SIZE + k.CREATE_IN.size, head))
        fh = self.ops.create(key, mode, flags, head[4], head[5])
        node = self.ops.find(key)
        if node is None:  # cannot happen: a created file shows at once
            self.ops.release(fh)
            raise FsError(errno.EIO, f"{key} vanished while it was created")
        values = self._entry_values(key, node)
        self._send(k.CREATE_REPLY.pack(k.CREATE_REPLY.size, 0, head[2], *values, fh, 0, 0))

    def _open(self, head: tuple, buf: memoryview) -> None:
        flags = k.OPEN_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]
        key = self._key(head[3])
        fh = self.ops.open(key, flags)
        keep = False
        inode = self.inodes.get(head[3])
        if inode is not None:
            if time.monotonic() - inode.stamp_time > self.attr_timeout:
                node = self.ops.find(key)
                if node is not None:
                    self._stamp(inode, node)
            keep, inode.cache_ok = inode.cache_ok, True
        open_flags = k.FOPEN_KEEP_CACHE if keep else 0
        if flags & os.O_ACCMODE == os.O_RDONLY:
            # Its close has nothing to store: spare the reader that round trip.
            open_flags |= k.FOPEN_NOFLUSH
        self._send(k.OPEN_REPLY.pack(k.OPEN_REPLY.size, 0, head[2], fh, open_flags, 0))

    def _read(self, head: tuple, buf: memoryview) -> None:
        fh, offset, size = k.READ_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        self._reply_data(head[2], self.ops.read(fh, size, offset))

    def _write(self, head: tuple, buf: memoryview) -> None:
        fh, offset, size = k.WRITE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        written = self.ops.write(fh, buf[k.WRITE_DATA : k.WRITE_DATA + size], offset)
        self._send(k.WRITE_REPLY.pack(k.WRITE_REPLY.size, 0, head[2], written, 0))

    def _flush(self, head: tuple, buf: memoryview) -> None:
        self._stored(head[3], self.ops.flush(k.FLUSH_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]))
        self._reply_ok(head[2])

    def _fsync(self, head: tuple, buf: memoryview) -> None:
        self._stored(head[3], self.ops.fsync(k.FSYNC_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]))
        self._reply_ok(head[2])

    def _release(self, head: tuple, buf: memoryview) -> None:
        try:
            self._stored(head[3], self.ops.release(k.RELEASE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0]))
        except Exception as exc:  # nobody to tell: close() has returned already
            log.error("release %s: %s", self._describe(head), exc)
        self._reply_ok(head[2])

    def _statfs(self, head: tuple, buf: memoryview) -> None:
        s = self.ops.statfs()
        self._send(
            k.STATFS_REPLY.pack(
                k.STATFS_REPLY.size,
                0,
                head[2],
                s["f_blocks"],
                s["f_bfree"],
                s["f_bavail"],
                s["f_files"],
                s["f_ffree"],
                s["f_bsize"],
                s["f_namemax"],
                s["f_frsize"],
                0,
            )
        )

    # ------------------------------------------------------------------ folders
    def _opendir(self, head: tuple, buf: memoryview) -> None:
        fh = self.ops.opendir(self._key(head[3]))
        self._send(k.OPEN_REPLY.pack(k.OPEN_REPLY.size, 0, head[2], fh, 0, 0))

    def _readdir(self, head: tuple, buf: memoryview) -> None:
        fh, offset, size = k.READ_IN.unpack_from(buf, k.IN_HEADER_SIZE)[:3]
        self._reply_data(head[2], k.dirents(self.ops.readdir(fh, offset), size))

    def _releasedir(self, head: tuple, buf: memoryview) -> None:
        self.ops.releasedir(k.RELEASE_IN.unpack_from(buf, k.IN_HEADER_SIZE)[0])
        self._reply_ok(head[2])

    def _fsyncdir(self, head: tuple, buf: memoryview) -> None:
        self._reply_ok(head[2])


_ZERO_ATTR = (0,) * 16
_UNANSWERED = (k.FORGET, k.BATCH_FORGET, k.INTERRUPT)  # requests the kernel wants no reply to


def _time(valid: int, given: int, now: int, seconds: int, nanos: int) -> int | str | None:
    """A time of a SETATTR in nanoseconds, :data:`NOW`, or None when it is not changed."""
    if not valid & given:
        return None
    if valid & now:
        return NOW
    return seconds * NS + nanos


__all__ = ["BLKSIZE", "BUFFER_SIZE", "MAX_WRITE", "Session"]

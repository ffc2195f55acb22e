"""The FUSE operations: each method translates one call to the tree or the open-file table.

Meaning lives elsewhere; here a path becomes a key, an exception becomes an errno (through
:func:`zarrfs.errors.to_errno`, with one log line for anything that is not routine) and a node
becomes a ``stat`` dict.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import stat
import struct
import time
from typing import Any

import mfusepy

from zarrfs.errors import FsError, is_quiet, to_errno
from zarrfs.handles import HandleTable
from zarrfs.invalidate import Invalidator
from zarrfs.listing import DirListing
from zarrfs.loop import DEFAULT_SPIN_US, Loop
from zarrfs.tree import DIR, RENAME_EXCHANGE, RENAME_NOREPLACE, Node, Tree

log = logging.getLogger("zarrfs.ops")

BLKSIZE = 1 << 20
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


def key_of(path: str) -> str:
    """The store key of a mount path: ``/grp/arr/0.0`` -> ``grp/arr/0.0``."""
    return path.strip("/")


def fuse_error(exc: Exception, call: str) -> mfusepy.FuseOSError:
    """The errno the kernel should hear for ``exc``, with one log line unless routine."""
    code = to_errno(exc)
    if not is_quiet(exc):
        level = logging.WARNING if isinstance(exc, OSError) else logging.ERROR
        log.log(level, "%s: %s (%s)", call, errno.errorcode.get(code, code), exc)
    return mfusepy.FuseOSError(code)


def translated(method):
    """Run a FUSE call; turn any exception into the errno the caller should see."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except mfusepy.FuseOSError:
            raise
        except Exception as exc:
            names = " ".join(str(a) for a in args[:2] if isinstance(a, str))
            raise fuse_error(exc, f"{method.__name__} {names}") from None

    return wrapper


def node_stat(node: Node) -> dict[str, Any]:
    """The ``stat`` fields of a node (times in nanoseconds)."""
    a = node.attrs
    return {
        "st_mode": a.mode,
        # 1 for folders tells find(1) not to guess subfolder counts from the link count.
        "st_nlink": 1,
        "st_size": node.size,
        "st_uid": a.uid,
        "st_gid": a.gid,
        "st_atime": a.atime,
        "st_mtime": a.mtime,
        "st_ctime": a.ctime,
        "st_blocks": (node.size + 511) // 512,
        "st_blksize": BLKSIZE,
    }


class Operations(mfusepy.Operations):
    """FUSE operations over a :class:`Tree` and its :class:`HandleTable`."""

    use_ns = True

    def __init__(self, tree: Tree, handles: HandleTable) -> None:
        self.tree = tree
        self.handles = handles
        self.dirs: dict[int, DirListing] = {}
        self._next_dir = 1
        self.invalidator = Invalidator()
        tree.on_side_effects = self.invalidator.keys_changed

    # ------------------------------------------------------------------ lifecycle
    def init(self, path: str) -> None:
        self.invalidator.start()

    def destroy(self, path: str) -> None:
        self.invalidator.stop()
        self.handles.commit_all()
        self.tree.driver.close()

    # ------------------------------------------------------------------ attributes
    @translated
    def find(self, path: str) -> Node | None:
        """The node at ``path``, pending writes included, or None (the hot path of every
        lookup)."""
        key = key_of(path)
        return self.handles.pending(key) or self.tree.find(key)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        node = self.find(path)
        if node is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        return node_stat(node)

    @translated
    def statfs(self, path: str) -> dict[str, int]:
        return self.tree.statfs()

    def _set_attrs(self, path: str, **changes: Any) -> None:
        key = key_of(path)
        if not self.handles.set_attrs(key, **changes):
            self.tree.set_attrs(key, **changes)

    @translated
    def chmod(self, path: str, mode: int) -> int:
        self._set_attrs(path, mode=mode)
        return 0

    @translated
    def chown(self, path: str, uid: int, gid: int) -> int:
        self._set_attrs(path, uid=uid, gid=gid)
        return 0

    @translated
    def utimens(self, path: str, times: tuple[int | None, int | None] | None = None) -> int:
        now = time.time_ns()
        atime, mtime = times if times is not None else (now, now)
        self._set_attrs(path, atime=now if atime == "now" else atime, mtime=now if mtime == "now" else mtime)
        return 0

    # ------------------------------------------------------------------ folders
    @translated
    def opendir(self, path: str) -> int:
        key = key_of(path)
        if self.tree.lookup(key).kind != DIR:
            raise FsError(errno.ENOTDIR, key)
        fh = self._next_dir
        self._next_dir += 1
        self.dirs[fh] = DirListing(self.tree, key, extra=self.handles.unstored_names(key))
        return fh

    def readdir_with_offset(self, path: str, offset: int, fh: int):
        # A generator: libfuse stops taking entries when the kernel's buffer is full, so only
        # what fits is ever produced (a buffer holds about a hundred names).
        # An int where mfusepy takes the attributes is the mode: the type is all readdir returns.
        return _translated_iter(self.dirs[fh].entries(offset))

    @translated
    def releasedir(self, path: str, fh: int) -> int:
        self.dirs.pop(fh, None)
        return 0

    @translated
    def mkdir(self, path: str, mode: int) -> int:
        self.tree.mkdir(key_of(path), mode)
        return 0

    @translated
    def rmdir(self, path: str) -> int:
        self.tree.rmdir(key_of(path))
        return 0

    # ------------------------------------------------------------------ names
    @translated
    def unlink(self, path: str) -> int:
        key = key_of(path)
        if not self.handles.unlinked(key):
            self.tree.unlink(key)
        return 0

    @translated
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        src, dst = key_of(old), key_of(new)
        if self.handles.unstored(src) is not None and not flags & RENAME_EXCHANGE:
            self.handles.store_as(src, dst, exclusive=bool(flags & RENAME_NOREPLACE), keep_source=False)
            return 0
        self.handles.settle(src)
        if flags & RENAME_EXCHANGE:
            self.handles.settle(dst)
        self.tree.rename(src, dst, flags)
        self.handles.renamed(src, dst)
        return 0

    @translated
    def link(self, target: str, source: str) -> int:
        src, dst = key_of(source), key_of(target)
        if self.handles.unstored(src) is not None:
            self.handles.store_as(src, dst, exclusive=True, keep_source=True)
            return 0
        self.handles.settle(src)
        self.tree.link(src, dst)
        return 0

    @translated
    def symlink(self, target: str, source: str) -> int:
        uid, gid, _ = mfusepy.fuse_get_context()
        self.tree.symlink(source, key_of(target), uid, gid)
        return 0

    @translated
    def readlink(self, path: str) -> str:
        return self.tree.readlink(key_of(path))

    # ------------------------------------------------------------------ files
    @translated
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        uid, gid, _ = mfusepy.fuse_get_context()
        return self.handles.create(key_of(path), mode | stat.S_IFREG, flags, uid, gid)

    @translated
    def open(self, path: str, flags: int) -> int:
        return self.handles.open(key_of(path), flags)

    @translated
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes | memoryview:
        return self.handles.read(fh, size, offset)

    @translated
    def write(self, path: str, data: bytes | memoryview, offset: int, fh: int) -> int:
        return self.handles.write(fh, data, offset)

    @translated
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self.handles.truncate(key_of(path), length, fh)
        return 0

    @translated
    def flush(self, path: str, fh: int) -> int:
        self.handles.flush(fh)
        return 0

    @translated
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.handles.fsync(fh)
        return 0

    @translated
    def release(self, path: str, fh: int) -> int:
        self.handles.release(fh)
        return 0


def _translated_iter(items):
    """Iterate ``items``, mapping an exception to its errno as :func:`translated` does."""
    try:
        yield from items
    except Exception as exc:
        raise fuse_error(exc, "readdir") from None


class FUSE(mfusepy.FUSE):
    """mfusepy's FUSE with the pieces of libfuse3 it leaves out: rename flags
    (RENAME_NOREPLACE, RENAME_EXCHANGE) and UTIME_NOW / UTIME_OMIT in utimens; a ``getattr``
    that fills ``struct stat`` straight from the node (it runs on every lookup); and requests
    served by :class:`zarrfs.loop.Loop` instead of libfuse's loop."""

    def __init__(
        self, operations, mountpoint: str, spin_us: float = DEFAULT_SPIN_US, on_ready=None, **kwargs: Any
    ) -> None:
        loop = Loop(spin_us, on_ready)
        # mfusepy builds the operations table and passes it to the module's fuse_main_real,
        # looked up when it is called: for this mount, that is the loop's main.
        saved = mfusepy.fuse_main_real
        mfusepy.fuse_main_real = loop.main
        try:
            super().__init__(operations, mountpoint, **kwargs)
        finally:
            mfusepy.fuse_main_real = saved

    def fgetattr(self, path, buf, fip) -> int:
        node = self.operations.find(path.decode(self.encoding, self.errors))
        if node is None:
            return -errno.ENOENT
        a = node.attrs
        size = node.size
        at, atn = divmod(a.atime, 1_000_000_000)
        mt, mtn = divmod(a.mtime, 1_000_000_000)
        ct, ctn = divmod(a.ctime, 1_000_000_000)
        values = (1, a.mode, a.uid, a.gid, size, BLKSIZE, (size + 511) // 512, at, atn, mt, mtn, ct, ctn)
        if _STAT is not None:
            # One pack of the fields over libfuse's zeroed struct, not thirteen ctypes setattrs.
            _STAT.pack_into(_view(buf, _STAT_END), _STAT_START, *values)
        else:
            _set_stat(buf.contents, values)
        return 0

    # read and write copy once, between libfuse's buffer and the file's content: mfusepy's
    # own make a bytes object of every request's data first.
    def read(self, path, buf, size: int, offset: int, fip) -> int:
        data = self.operations.read(None, size, offset, fip.contents.fh)
        n = len(data)
        if n:
            _view(buf, n)[:] = data
        return n

    def write(self, path, buf, size: int, offset: int, fip) -> int:
        return self.operations.write(None, _view(buf, size), offset, fip.contents.fh)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(
            old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags
        )

    def utimens_fuse_3(self, path, buf, fip) -> int:
        times = None
        if buf:
            times = (_timespec(buf.contents.actime), _timespec(buf.contents.modtime))
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.utimens(decoded, times)


_STAT_FIELDS = (
    ("st_nlink",),
    ("st_mode",),
    ("st_uid",),
    ("st_gid",),
    ("st_size",),
    ("st_blksize",),
    ("st_blocks",),
    ("st_atimespec", "tv_sec"),
    ("st_atimespec", "tv_nsec"),
    ("st_mtimespec", "tv_sec"),
    ("st_mtimespec", "tv_nsec"),
    ("st_ctimespec", "tv_sec"),
    ("st_ctimespec", "tv_nsec"),
)


def _set_stat(st, values) -> None:
    """Fill ``struct stat`` field by field (where :func:`_stat_struct` found no layout)."""
    for path, value in zip(_STAT_FIELDS, values, strict=True):
        target = st
        for name in path[:-1]:
            target = getattr(target, name)
        setattr(target, path[-1], value)


def _stat_struct() -> tuple[struct.Struct | None, int, int]:
    """A ``struct`` format that writes :data:`_STAT_FIELDS` where this platform's
    ``struct stat`` (as mfusepy declares it) keeps them, checked against ctypes; else None."""
    try:
        places = []
        for path in _STAT_FIELDS:
            cls, offset = mfusepy.c_stat, 0
            for name in path:
                field = getattr(cls, name)
                offset += field.offset
                cls = dict(cls._fields_)[name]
            places.append((offset, field.size, cls._type_))
        start = places[0][0]
        fmt, at = "@", start
        for offset, size, code in places:
            if offset < at or struct.calcsize("@" + code) != size:
                return None, 0, 0
            fmt += "x" * (offset - at) + code
            at = offset + size
        packer = struct.Struct(fmt)
        sample = tuple(range(1, len(_STAT_FIELDS) + 1))
        st = mfusepy.c_stat()
        packer.pack_into(memoryview(st).cast("B"), start, *sample)
        probe = mfusepy.c_stat()
        _set_stat(probe, sample)
        if bytes(st) != bytes(probe):
            return None, 0, 0
        return packer, start, at
    except (AttributeError, KeyError, TypeError, struct.error, ValueError):
        return None, 0, 0


_STAT, _STAT_START, _STAT_END = _stat_struct()


def _view(buf, size: int) -> memoryview:
    """A byte view of ``size`` bytes of libfuse's buffer at ``buf`` (valid during the call)."""
    return memoryview((ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value)).cast("B")


def _timespec(ts) -> int | str | None:
    if ts.tv_nsec == UTIME_OMIT:
        return None
    if ts.tv_nsec == UTIME_NOW:
        return "now"
    return ts.tv_sec * 10**9 + ts.tv_nsec


__all__ = ["Operations", "FUSE", "key_of", "node_stat"]

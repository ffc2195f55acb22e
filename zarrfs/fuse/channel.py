"""The ``/dev/fuse`` channel of a mount, mounted and unmounted by libfuse3.

libfuse does what it does best here: it parses the mount options (``allow_other``, ``ro``,
``fsname=``...; it names the ones it refuses on stderr), mounts, through ``fusermount3`` when
not root, and unmounts. The requests that come through the channel are answered by
:mod:`zarrfs.fuse.session`, not by libfuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util


class MountError(RuntimeError):
    """libfuse refused the options or the mount; it printed why on stderr."""


class FuseArgs(ctypes.Structure):
    """``struct fuse_args``."""

    _fields_ = [
        ("argc", ctypes.c_int),
        ("argv", ctypes.POINTER(ctypes.c_char_p)),
        ("allocated", ctypes.c_int),
    ]


def _libfuse() -> ctypes.CDLL:
    name = ctypes.util.find_library("fuse3") or "libfuse3.so.3"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise MountError(f"libfuse3 is not installed ({exc})") from None
    signatures = {
        "fuse_session_new": (
            [ctypes.POINTER(FuseArgs), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
            ctypes.c_void_p,
        ),
        "fuse_session_mount": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
        "fuse_session_fd": ([ctypes.c_void_p], ctypes.c_int),
        "fuse_session_unmount": ([ctypes.c_void_p], None),
        "fuse_session_destroy": ([ctypes.c_void_p], None),
    }
    for func, (argtypes, restype) in signatures.items():
        getattr(lib, func).argtypes = argtypes
        getattr(lib, func).restype = restype
    return lib


def option_string(options: dict[str, object]) -> str:
    """``-o`` text for libfuse: ``name`` for True, ``name=value`` otherwise, False left out."""
    words = []
    for name, value in options.items():
        if value is True:
            words.append(name)
        elif value is not False and value is not None:
            words.append(f"{name}={value}")
    return ",".join(words)


class Channel:
    """A mounted ``/dev/fuse`` connection: ``fd`` carries the kernel's requests."""

    def __init__(self, mountpoint: str, options: dict[str, object]) -> None:
        self.lib = _libfuse()
        args = [b"zarrfs"]
        text = option_string(options)
        if text:
            args += [b"-o", text.encode()]
        argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
        fargs = FuseArgs(len(args), argv, 0)
        # No operations: libfuse only mounts; the requests are read and answered elsewhere.
        self._no_ops = ctypes.create_string_buffer(1024)
        self.session = self.lib.fuse_session_new(ctypes.byref(fargs), self._no_ops, 0, None)
        if not self.session:
            raise MountError("libfuse refused the mount options")
        if self.lib.fuse_session_mount(self.session, mountpoint.encode()) != 0:
            self.lib.fuse_session_destroy(self.session)
            self.session = None
            raise MountError(f"could not mount {mountpoint}")
        self.fd = self.lib.fuse_session_fd(self.session)

    def close(self) -> None:
        """Unmount (if still mounted) and close the connection."""
        if self.session:
            self.lib.fuse_session_unmount(self.session)
            self.lib.fuse_session_destroy(self.session)
            self.session = None

"""The ``/dev/fuse`` channel of a mount, mounted and unmounted by libfuse3.

libfuse does what it does best here: it parses the mount options (``allow_other``, ``ro``,
``fsname=``...), mounts, through ``fusermount3`` when not root, and unmounts. What libfuse and
fusermount3 print on stderr while they mount (the option refused, "option allow_other only
allowed if 'user_allow_other' is set in /etc/fuse.conf") is caught and becomes the message of
:class:`MountError`. The requests that come through the channel are answered by
:mod:`zarrfs.fuse.session`, not by libfuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("zarrfs.fuse.channel")
T = TypeVar("T")


class MountError(RuntimeError):
    """libfuse refused the options or the mount; the message is its reason."""


def _captured(call: Callable[[], T]) -> tuple[T, str]:
    """Run ``call`` with file descriptor 2 (libfuse's and fusermount3's stderr) sent to a
    temporary file; return its result and what was printed."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            result = call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return result, text


def reason(text: str, fallback: str) -> str:
    """The line that says why, from what libfuse and fusermount3 printed, without their
    program names (``fuse: ``, ``fusermount3: ``)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return fallback
    line = lines[-1]
    for prefix in ("fuse: ", "fusermount3: ", "fusermount: "):
        line = line.removeprefix(prefix)
    return line


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
        self.session, said = _captured(
            lambda: self.lib.fuse_session_new(ctypes.byref(fargs), self._no_ops, 0, None)
        )
        if not self.session:
            raise MountError(reason(said, "libfuse refused the mount options"))
        status, said = _captured(lambda: self.lib.fuse_session_mount(self.session, mountpoint.encode()))
        if status != 0:
            self.lib.fuse_session_destroy(self.session)
            self.session = None
            raise MountError(reason(said, f"could not mount {mountpoint}"))
        for line in said.splitlines():
            if line.strip():
                log.warning("%s", line.strip())
        self.fd = self.lib.fuse_session_fd(self.session)

    def close(self) -> None:
        """Unmount (if still mounted) and close the connection."""
        if self.session:
            self.lib.fuse_session_unmount(self.session)
            self.lib.fuse_session_destroy(self.session)
            self.session = None

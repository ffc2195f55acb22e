"""The mount daemon: options, logging, and running FUSE over a driver until unmounted.

``serve`` runs in the foreground of the calling process. ``zarrfs mount`` without ``-f`` starts
this in a child process and returns once the child reports the mount ready (see ``cli``).
SIGINT/SIGTERM/SIGHUP end the request loop between two requests; the mount is then unmounted
and open files are committed, so a normal stop leaves neither lost data nor a dead mountpoint
behind.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from zarrfs.backends import open_driver
from zarrfs.backends.base import Driver
from zarrfs.fs.api import Operations
from zarrfs.fs.foldercache import FolderCache
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.namespace import Hooks, Tree
from zarrfs.fs.spill import DEFAULT_SPILL
from zarrfs.fuse.channel import Channel
from zarrfs.fuse.loop import DEFAULT_SPIN_US, Loop
from zarrfs.fuse.session import BUFFER_SIZE, Session
from zarrfs.fuse.tuning import DEFAULT_READAHEAD_KIB, keep_freed_memory, set_readahead

log = logging.getLogger("zarrfs")

VALIDATE_MODES = ("strict", "warn", "off")
VIEWS = ("raw", "decoded")
CONSOLIDATE_MODES = ("auto", "live", "off")


class UsageError(Exception):
    """A bad command line or mount option: reported as one line, exit status 2."""


@dataclass
class MountOptions:
    """Options of one mount: zarrfs' own, and the rest passed through to libfuse's mount."""

    readonly: bool = False
    validate: str = "strict"
    view: str = "raw"
    consolidate: str = "auto"
    cache_timeout: float = 1.0
    spill: int = DEFAULT_SPILL
    create: bool = False
    spin: float = DEFAULT_SPIN_US
    readahead: int = DEFAULT_READAHEAD_KIB
    # The kernel's cache times; each defaults to cache_timeout.
    entry_timeout: float | None = None
    attr_timeout: float | None = None
    negative_timeout: float | None = None
    # Seconds a snapshot of a busy folder answers lookups (zarrfs.fs.foldercache); defaults to
    # cache_timeout, 0 turns snapshots off.
    dir_cache: float | None = None
    fuse: dict[str, Any] = field(default_factory=dict)

    def seconds(self, name: str) -> float:
        """One of the cache times above: its own value, or ``cache_timeout``."""
        value = getattr(self, name)
        return self.cache_timeout if value is None else value


def parse_options(words: list[str]) -> MountOptions:
    """Parse ``-o`` option words (each may hold several, comma-separated)."""
    opts = MountOptions()
    for word in words:
        for item in filter(None, word.split(",")):
            name, has_value, value = item.partition("=")
            if name == "ro":
                opts.readonly = True
            elif name == "rw":
                opts.readonly = False
            elif name == "validate":
                opts.validate = _choice(name, value, VALIDATE_MODES)
            elif name == "view":
                opts.view = _choice(name, value, VIEWS)
            elif name == "consolidate":
                opts.consolidate = _choice(name, value, CONSOLIDATE_MODES)
            elif name in ("cache_timeout", "entry_timeout", "attr_timeout", "negative_timeout", "dir_cache"):
                seconds = _number(name, value, float)
                if seconds < 0:
                    raise UsageError(f"-o {name}= takes seconds, 0 or more (got {value!r})")
                setattr(opts, name, seconds)
            elif name == "spill":
                opts.spill = _number(name, value, int)
            elif name == "create":
                opts.create = True
            elif name == "readahead":
                opts.readahead = _number(name, value, int)
                if opts.readahead < 0:
                    raise UsageError(f"-o readahead= takes KiB, 0 or more (got {value!r})")
            elif name == "spin":
                opts.spin = _number(name, value, float)
                if opts.spin < 0:
                    raise UsageError(f"-o spin= takes microseconds, 0 or more (got {value!r})")
            else:
                opts.fuse[name] = value if has_value else True
    return opts


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"-o {name}= takes one of {', '.join(allowed)} (got {value!r})")
    return value


def _number(name: str, value: str, kind: type) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"-o {name}= takes a number (got {value!r})") from None


def database_path(url: str) -> str | None:
    """The file or folder a file-based URL names (LMDB, SQLite, a bare path), else None."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "lmdb", "sqlite"):
        return parsed.path if parsed.scheme else url
    return None


def open_database(url: str, opts: MountOptions) -> Driver:
    """Open the driver for ``url``; a missing file-based database is an error unless
    ``-o create``."""
    path = database_path(url)
    if path is not None and not opts.create and not os.path.exists(path):
        raise UsageError(f"database {path} does not exist (add -o create to make a new one)")
    return open_driver(url, readonly=opts.readonly)


def make_hooks(opts: MountOptions) -> Hooks:
    """The format layer's hooks for these options (plain bytes when there is no format layer)."""
    try:
        from zarrfs.format.hooks import FormatHooks
    except ImportError:
        return Hooks()
    return FormatHooks(validate=opts.validate, view=opts.view, consolidate=opts.consolidate)


def mount_options(url: str, opts: MountOptions) -> dict[str, Any]:
    """Options for libfuse's mount, with the user's pass-through options last so they win."""
    options: dict[str, Any] = {"fsname": url.replace(",", "_"), "subtype": "zarrfs"}
    if opts.readonly:
        options["ro"] = True
    options.update(opts.fuse)
    return options


def serve(url: str, mountpoint: str, opts: MountOptions, on_ready=None) -> None:
    """Mount ``url`` at ``mountpoint`` and serve requests until unmounted or stopped by
    SIGINT/SIGTERM/SIGHUP (blocking); open files are stored on the way out."""
    keep_freed_memory()
    driver = open_database(url, opts)
    try:
        tree = Tree(driver, uid=os.getuid(), gid=os.getgid(), hooks=make_hooks(opts))
        if opts.seconds("dir_cache") > 0:
            tree.folder_cache = FolderCache(opts.seconds("dir_cache"))
        handles = HandleTable(tree, spill_threshold=opts.spill, readonly=opts.readonly)
        operations = Operations(tree, handles)
        resolved = os.path.realpath(mountpoint)  # now, while it is a plain folder

        def ready() -> None:
            if opts.readahead:
                set_readahead(resolved, opts.readahead)
            if on_ready is not None:
                on_ready()

        log.info("mounting %s at %s (%s)", url, mountpoint, "read-only" if opts.readonly else "read-write")
        channel = Channel(mountpoint, mount_options(url, opts))
    except BaseException:
        driver.close()
        raise
    session = Session(
        operations,
        channel.fd,
        entry_timeout=opts.seconds("entry_timeout"),
        attr_timeout=opts.seconds("attr_timeout"),
        negative_timeout=opts.seconds("negative_timeout"),
        on_init=ready,
    )
    loop = Loop(channel.fd, session.handle, BUFFER_SIZE, opts.spin)
    try:
        loop.run()
    finally:
        session.close()
        channel.close()
        operations.destroy()
    if loop.stop_signal is not None:
        log.info("unmounted %s on signal %s", mountpoint, signal.Signals(loop.stop_signal).name)
    else:
        log.info("unmounted %s", mountpoint)


def setup_logging(level: str, log_file: str | None, foreground: bool) -> None:
    """Log to ``log_file``, else stderr in the foreground, else syslog."""
    handler: logging.Handler
    if log_file:
        handler = logging.FileHandler(log_file)
    elif foreground:
        handler = logging.StreamHandler(sys.stderr)
    elif os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(address="/dev/log")
    else:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s zarrfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))

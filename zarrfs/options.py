"""Mount options: the ``-o`` words of ``zarrfs mount`` (and of an fstab line) parsed into
:class:`MountOptions`; a bad or unknown one is a :class:`UsageError` (exit status 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from zarrfs.backends.base import DEFAULT_TIMEOUT
from zarrfs.fs.foldercache import ENTRIES as DIR_CACHE_ENTRIES
from zarrfs.fs.pagecache import DIRECT_ABOVE
from zarrfs.fs.parts import DEFAULT_ABOVE
from zarrfs.fs.spill import DEFAULT_SPILL
from zarrfs.fuse.loop import DEFAULT_SPIN_US
from zarrfs.fuse.tuning import DEFAULT_READAHEAD_KIB
from zarrfs.usage import UsageError as UsageError  # named here too: where options are parsed

VALIDATE_MODES = ("strict", "warn", "off")
VIEWS = ("raw", "decoded")
CONSOLIDATE_MODES = ("auto", "live", "off")

# Options that /etc/fstab, mount(8) and mount.fuse3 add and that mean nothing to this mount:
# ignored, as sshfs does. ``dev`` and ``suid`` are among them: a zarrfs mount is always
# ``nodev,nosuid`` (libfuse's default).
IGNORED_OPTIONS = frozenset(
    {"defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev", "nofail"}
    | {"dev", "suid", "atime", "relatime", "strictatime", "lazytime", "loop"}
)
IGNORED_PREFIXES = ("x-", "comment=", "helper=")
# Options handed to libfuse's mount as they are (libfuse3's mount and session option tables).
LIBFUSE_OPTIONS = frozenset(
    {"allow_other", "default_permissions", "fsname", "subtype", "max_read", "blksize", "auto_unmount"}
    | {"context", "fscontext", "defcontext", "rootcontext", "exec", "noexec", "nosuid", "nodev"}
    | {"sync", "async", "dirsync", "noatime", "nodiratime", "debug"}
)

DEFAULT_SNAPSHOT_HOLD = 3600.0  # seconds a snapshot mount holds its state (it costs the writers)
SHORT_CACHE = 1.0  # seconds the kernel keeps names and attributes without a change feed
FEED_CACHE = 3600.0  # ... and with one


@dataclass
class MountOptions:
    """Options of one mount: zarrfs' own, and the rest passed through to libfuse's mount."""

    readonly: bool = False
    validate: str = "strict"
    view: str = "raw"
    consolidate: str = "auto"
    # The kernel's cache time: an hour when the driver has a change feed (the mount then drops
    # what others change, zarrfs.fuse.coherence), else a second; -o cache_timeout= sets it.
    cache_timeout: float | None = None
    # Whether to follow the driver's change feed (-o feed=0: no, short cache times).
    use_feed: bool = True
    # Set by the daemon: the feed is followed.
    feed: bool = False
    spill: int = DEFAULT_SPILL
    # Files larger than this are stored in parts (zarrfs.fs.parts).
    parts_above: int = DEFAULT_ABOVE
    # A file at least this large, opened read-only while the kernel holds none of its pages,
    # is read past the page cache on that open (zarrfs.fs.pagecache); None: never.
    direct_above: int | None = DIRECT_ABOVE
    create: bool = False
    # Mount over a folder that has files in it (hidden while mounted); else that is refused.
    nonempty: bool = False
    spin: float = DEFAULT_SPIN_US
    # Request threads on a database server (zarrfs.fuse.workers); None: DEFAULT_WORKERS there,
    # 0 or 1: the one-thread loop, as for a database file (always one thread).
    workers: int | None = None
    # Seconds a call may wait on a database server before it fails with ETIMEDOUT.
    timeout: float = DEFAULT_TIMEOUT
    readahead: int = DEFAULT_READAHEAD_KIB
    # Chunks of a Zarr array read ahead of a reader in grid order (zarrfs.fs.readahead), on a
    # database server with a change feed; 0: none; None: 8 where the feed tells of a change
    # before its writer hears its commit answered (Redis), else none.
    chunks_ahead: int | None = None
    # The kernel's cache times; each defaults to cache_timeout.
    entry_timeout: float | None = None
    attr_timeout: float | None = None
    negative_timeout: float | None = None
    # Seconds a snapshot of a busy folder answers lookups (zarrfs.fs.foldercache); defaults to
    # cache_timeout, 0 turns snapshots off.
    dir_cache: float | None = None
    # Entries the snapshots of busy folders hold together (zarrfs.fs.foldercache).
    dir_cache_entries: int = DIR_CACHE_ENTRIES
    # Access: allow_root lets root in besides the mount's owner (checked by the daemon, the
    # kernel is told allow_other); allow_other/allow_root turn default_permissions on unless
    # no_default_permissions.
    allow_root: bool = False
    no_default_permissions: bool = False
    # Owner and permission bits shown for nodes that have none recorded (sshfs' uid/gid/umask).
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None
    fuse: dict[str, Any] = field(default_factory=dict)
    # -o snapshot[=NAME]: serve one committed state, read-only ("" : the state at mount time);
    # -o snapshot_hold=: the longest it is held, in seconds (0: no limit).
    snapshot: str | None = None
    snapshot_hold: float = DEFAULT_SNAPSHOT_HOLD

    def seconds(self, name: str) -> float:
        """One of the cache times above: its own value, or ``cache_timeout``."""
        value = getattr(self, name)
        if value is not None:
            return value
        if self.cache_timeout is not None:
            return self.cache_timeout
        if name == "dir_cache":  # snapshots are for bursts: a second, feed or not
            return SHORT_CACHE
        return FEED_CACHE if self.feed else SHORT_CACHE


def parse_options(words: list[str]) -> MountOptions:
    """Parse ``-o`` option words (each may hold several, comma-separated); an unknown option
    or a bad value is a :class:`UsageError`."""
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
            elif name == "feed":
                opts.use_feed = _choice(name, value, ("0", "1")) == "1"
            elif name == "timeout":
                opts.timeout = _number(name, value, float)
                if not opts.timeout > 0:
                    raise UsageError(f"-o timeout= takes seconds, more than 0 (got {value!r})")
            elif name == "dir_cache_entries":
                opts.dir_cache_entries = _number(name, value, int)
                if opts.dir_cache_entries < 0:
                    raise UsageError(f"-o {name}= takes a count of entries, 0 or more (got {value!r})")
            elif name == "spill":
                opts.spill = _size(name, value)
            elif name == "parts_above":
                opts.parts_above = _size(name, value)
            elif name == "direct_above":
                opts.direct_above = None if value == "off" else _size(name, value)
            elif name == "create":
                opts.create = True
            elif name == "chunks_ahead":
                opts.chunks_ahead = _number(name, value, int)
                if opts.chunks_ahead < 0:
                    raise UsageError(f"-o chunks_ahead= takes a number of chunks, 0 or more (got {value!r})")
            elif name == "nonempty":
                opts.nonempty = True
            elif name == "readahead":
                opts.readahead = _number(name, value, int)
                if opts.readahead < 0:
                    raise UsageError(f"-o readahead= takes KiB, 0 or more (got {value!r})")
            elif name == "workers":
                opts.workers = _number(name, value, int)
                if not 0 <= opts.workers <= 256:
                    raise UsageError(f"-o workers= takes a number of threads, 0 to 256 (got {value!r})")
            elif name == "spin":
                opts.spin = _number(name, value, float)
                if opts.spin < 0:
                    raise UsageError(f"-o spin= takes microseconds, 0 or more (got {value!r})")
            elif name in ("uid", "gid"):
                number = _number(name, value, int)
                if not 0 <= number < 2**32 - 1:
                    raise UsageError(f"-o {name}= takes a numeric id (got {value!r})")
                setattr(opts, name, number)
            elif name == "umask":
                try:
                    opts.umask = int(value, 8)
                except ValueError:
                    opts.umask = -1
                if not 0 <= opts.umask <= 0o777:
                    raise UsageError(f"-o umask= takes octal permission bits such as 022 (got {value!r})")
            elif name == "snapshot":
                opts.snapshot = value
            elif name == "snapshot_hold":
                opts.snapshot_hold = _number(name, value, float)
                if opts.snapshot_hold < 0:
                    raise UsageError(f"-o snapshot_hold= takes seconds, 0 (no limit) or more (got {value!r})")
            elif name == "allow_root":
                opts.allow_root = True
            elif name == "no_default_permissions":
                opts.no_default_permissions = True
            elif item in IGNORED_OPTIONS or item.startswith(IGNORED_PREFIXES):
                continue
            elif name in LIBFUSE_OPTIONS:
                opts.fuse[name] = value if has_value else True
            else:
                raise UsageError(f"unknown mount option -o {item} (see zarrfs --help)")
    if opts.snapshot is not None:
        if "rw" in (item for word in words for item in word.split(",")):
            raise UsageError("-o snapshot mounts read-only: drop -o rw")
        opts.readonly = True
    if opts.allow_root and opts.fuse.get("allow_other"):
        raise UsageError("-o allow_root and -o allow_other exclude each other")
    return opts


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"-o {name}= takes one of {', '.join(allowed)} (got {value!r})")
    return value


def _size(name: str, value: str) -> int:
    """A size in bytes, with an optional K, M or G suffix (powers of 1024)."""
    if not value:
        raise UsageError(f"-o {name}= takes a size in bytes, with an optional K, M or G suffix")
    scale = 1 << (10 * (" KMG".index(value[-1].upper()))) if value[-1:].upper() in ("K", "M", "G") else 1
    size = _number(name, value[:-1] if scale > 1 else value, int) * scale
    if size < 1:
        raise UsageError(f"-o {name}= takes a size in bytes, 1 or more (got {value!r})")
    return size


def _number(name: str, value: str, kind: type) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise UsageError(f"-o {name}= takes a number (got {value!r})") from None
    if not math.isfinite(number):  # float("inf"), float("nan"): no time nor count is
        raise UsageError(f"-o {name}= takes a finite number (got {value!r})")
    return number

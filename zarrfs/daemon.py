"""The mount daemon: options, logging, and running FUSE over a driver until unmounted.

``serve`` runs in the foreground of the calling process. ``zarrfs mount`` without ``-f`` starts
this in a child process and returns once the child reports the mount ready (see ``cli``).
SIGINT/SIGTERM end the request loop between two requests; the mount is then unmounted and open
files are committed, so a normal stop leaves neither lost data nor a dead mountpoint behind.
SIGHUP reopens the log file (logrotate).

Secrets: a Redis password comes from the URL, ``?password_file=PATH``, ``$ZARRFS_PASSWORD`` or
``$REDISCLI_AUTH`` (:func:`redis_secret`); only the URL handed to the driver carries it. What
is shown (logs, the mount table's source, ``zarrfs status``) is :func:`shown_url`.
"""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from zarrfs.backends import open_driver
from zarrfs.backends.base import BackendError, Driver
from zarrfs.fs.api import Operations
from zarrfs.fs.foldercache import FolderCache
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.namespace import Hooks, Tree
from zarrfs.fs.spill import DEFAULT_SPILL
from zarrfs.fuse import abi
from zarrfs.fuse.channel import Channel
from zarrfs.fuse.loop import DEFAULT_SPIN_US, Loop
from zarrfs.fuse.session import BUFFER_SIZE, Session
from zarrfs.fuse.tuning import DEFAULT_READAHEAD_KIB, keep_freed_memory, set_readahead

log = logging.getLogger("zarrfs")

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

# Where a Redis password may come from besides the URL, in this order after the URL's own.
PASSWORD_ENV = ("ZARRFS_PASSWORD", "REDISCLI_AUTH")
SECRET_QUERY = ("password", "password_file")
FILE_SCHEMES = ("lmdb", "sqlite")
_NO_SECRETS = ("", "lmdb", "sqlite", "memory")


class UsageError(Exception):
    """A bad command line or mount option: reported as one line, exit status 2."""


class MountFailure(Exception):
    """A mount that cannot be made as asked (missing database or mountpoint, busy mountpoint):
    reported as one line, exit status 1."""


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

    def seconds(self, name: str) -> float:
        """One of the cache times above: its own value, or ``cache_timeout``."""
        value = getattr(self, name)
        return self.cache_timeout if value is None else value


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
    if opts.allow_root and opts.fuse.get("allow_other"):
        raise UsageError("-o allow_root and -o allow_other exclude each other")
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


# --- URLs: paths resolved, secrets kept out of sight ------------------------------------------


def _scheme(url: str) -> str:
    head, sep, _ = url.partition("://")
    return head.lower() if sep and head and head[0].isalpha() and "/" not in head else ""


def _file_path(url: str) -> str:
    """The path of a ``lmdb://`` or ``sqlite://`` URL as the drivers read it (relative to the
    working folder unless absolute)."""
    parts = urlsplit(url)
    path = unquote(parts.netloc + parts.path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def resolve_url(url: str, cwd: str | None = None) -> str:
    """``url`` with the database path (LMDB, SQLite, a bare path) and a ``password_file``
    made absolute against ``cwd`` (default: the working folder), so that a daemon running in
    ``/`` opens what the caller named."""
    cwd = cwd or os.getcwd()
    scheme = _scheme(url)
    if not scheme:
        return os.path.normpath(os.path.join(cwd, os.path.expanduser(url)))
    parts = urlsplit(url)
    if scheme in FILE_SCHEMES:
        path = _file_path(url)
        if not path:
            raise UsageError(f"{url} names no database path")
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
        return f"{parts.scheme}://{quote(path)}" + (f"?{parts.query}" if parts.query else "")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "password_file" for k, _ in query):
        query = [
            (k, os.path.join(cwd, os.path.expanduser(v)) if k == "password_file" else v) for k, v in query
        ]
        return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query)}"
    return url


def redis_secret(url: str, environ: dict[str, str] | None = None) -> str:
    """The URL for the driver: a password from ``?password_file=`` or the environment
    (``$ZARRFS_PASSWORD``, then ``$REDISCLI_AUTH``) is added to it when the URL has none of
    its own. Other URLs come back as they are."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("redis", "rediss", "unix"):
        return url
    environ = os.environ if environ is None else environ
    query = parse_qsl(parts.query, keep_blank_values=True)
    files = [v for k, v in query if k == "password_file"]
    query = [(k, v) for k, v in query if k != "password_file"]
    password = None
    if parts.password is None and not any(k == "password" for k, _ in query):
        if files:
            try:
                with open(files[-1], encoding="utf-8") as fh:
                    password = fh.read().rstrip("\r\n")
            except (OSError, UnicodeError) as exc:
                raise MountFailure(f"cannot read the password file {files[-1]}: {_reason(exc)}") from None
        else:
            password = next((environ[n] for n in PASSWORD_ENV if environ.get(n)), None)
    if password is not None:
        query.append(("password", password))
    return f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def shown_url(url: str) -> str:
    """``url`` without credentials (a password in it or in its query, a password file's
    path): what logs, the mount table and ``zarrfs status`` show."""
    if _scheme(url) in _NO_SECRETS:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name = user.partition(":")[0]
        netloc = f"{name}@{host}" if name else host
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in SECRET_QUERY]
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def url_password(url: str) -> str | None:
    """The password as written in ``url`` itself (to hide it from the process's argv)."""
    if _scheme(url) in _NO_SECRETS:
        return None
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return None
    user = netloc.rpartition("@")[0]
    return user.partition(":")[2] or None


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def database_path(url: str) -> str | None:
    """The file or folder a file-based URL names (LMDB, SQLite, a bare path), else None."""
    scheme = _scheme(url)
    if scheme in FILE_SCHEMES:
        return _file_path(url)
    return None if scheme else url


def open_database(url: str, opts: MountOptions, hint: bool = True) -> Driver:
    """Open the driver for ``url``; a missing file-based database is an error unless
    ``-o create`` (``hint``: name that option in the error)."""
    path = database_path(url)
    if path is not None and not os.path.exists(path):
        if not opts.create:
            raise MountFailure(
                f"database {path} does not exist" + (" (add -o create to make a new one)" if hint else "")
            )
        parent = os.path.dirname(os.path.abspath(path).rstrip("/")) or "/"
        if not os.path.isdir(parent):
            raise MountFailure(f"cannot create the database {path}: the folder {parent} does not exist")
    try:
        return open_driver(url, readonly=opts.readonly)
    except BackendError:
        raise
    except Exception as exc:  # a driver's own error type, OSError...: one line, no traceback
        raise BackendError(f"cannot open the database {shown_url(url)}: {_reason(exc)}") from exc


def make_hooks(opts: MountOptions) -> Hooks:
    """The format layer's hooks for these options (plain bytes when there is no format layer)."""
    try:
        from zarrfs.format.hooks import FormatHooks
    except ImportError:
        return Hooks()
    return FormatHooks(validate=opts.validate, view=opts.view, consolidate=opts.consolidate)


def mount_options(url: str, opts: MountOptions) -> dict[str, Any]:
    """Options for libfuse's mount (``url`` is what the mount table shows: no credentials),
    with the user's pass-through options last so they win."""
    options: dict[str, Any] = {"fsname": shown_url(url).replace(",", "_"), "subtype": "zarrfs"}
    if opts.readonly:
        options["ro"] = True
    fuse = dict(opts.fuse)
    if opts.allow_root:
        fuse["allow_other"] = True  # and the daemon turns away everyone but root and the owner
    if fuse.get("allow_other") and not opts.no_default_permissions:
        fuse.setdefault("default_permissions", True)
    options.update(fuse)
    return options


# Requests the daemon answers for anyone under allow_root, as libfuse does: they act on a file
# or folder opened already, or carry no reply (forget, interrupt).
_OPEN_OR_NO_REPLY = frozenset(
    {abi.INIT, abi.DESTROY, abi.FORGET, abi.BATCH_FORGET, abi.INTERRUPT, abi.READ, abi.WRITE}
    | {abi.FSYNC, abi.RELEASE, abi.READDIR, abi.FSYNCDIR, abi.RELEASEDIR, 41, 44}  # NOTIFY_REPLY, READDIRPLUS
)


def owner_and_root_only(handle, fd: int, owner: int):
    """``handle`` behind a check that turns away, with ``EACCES``, the requests of users other
    than ``owner`` and root (``-o allow_root``)."""
    unpack, pack, size = abi.IN_HEADER.unpack_from, abi.OUT_HEADER.pack, abi.OUT_HEADER_SIZE
    denied = -errno.EACCES

    def filtered(buf: memoryview) -> None:
        head = unpack(buf)
        if head[4] in (owner, 0) or head[1] in _OPEN_OR_NO_REPLY:
            handle(buf)
            return
        try:
            os.write(fd, pack(size, denied, head[2]))
        except OSError:  # the request was interrupted meanwhile
            pass

    return filtered


class _Loop(Loop):
    """The request loop, with SIGHUP reopening the log file instead of stopping it."""

    def _catch_signals(self, wake_w: int):
        restore = super()._catch_signals(wake_w)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda _s, _f: reopen_logs())
        return restore


def serve(url: str, mountpoint: str, opts: MountOptions, on_ready=None) -> None:
    """Mount ``url`` at ``mountpoint`` and serve requests until unmounted or stopped by
    SIGINT/SIGTERM (blocking); open files are stored on the way out. ``url`` may carry a
    password: it is shown nowhere (see :func:`shown_url`)."""
    from zarrfs.control import ControlServer

    shown = shown_url(url)
    keep_freed_memory()
    driver = open_database(url, opts)
    control = None
    try:
        tree = Tree(
            driver,
            uid=os.getuid() if opts.uid is None else opts.uid,
            gid=os.getgid() if opts.gid is None else opts.gid,
            umask=0o022 if opts.umask is None else opts.umask,
            hooks=make_hooks(opts),
        )
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

        log.info("mounting %s at %s (%s)", shown, mountpoint, "read-only" if opts.readonly else "read-write")
        channel = Channel(mountpoint, mount_options(shown, opts))
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
    handle = session.handle
    if opts.allow_root:
        handle = owner_and_root_only(handle, channel.fd, os.getuid())
    loop = _Loop(channel.fd, handle, BUFFER_SIZE, opts.spin)
    try:
        try:
            control = ControlServer(resolved, shown, driver, session, handles, tree, opts)
            control.start()
        except OSError as exc:
            log.warning("no status socket for %s: %s", mountpoint, _reason(exc))
        loop.run()
    finally:
        if control is not None:
            control.close()
        session.close()
        channel.close()
        operations.destroy()
    if loop.stop_signal is not None:
        log.info("unmounted %s on signal %s", mountpoint, signal.Signals(loop.stop_signal).name)
    else:
        log.info("unmounted %s", mountpoint)


# --- logging ------------------------------------------------------------------------------------


def escape_path(path: str) -> str:
    """A file name for ``path``, as ``systemd-escape --path`` makes it (``/mnt/a-b`` ->
    ``mnt-a\\x2db``; ``/`` -> ``-``)."""
    trimmed = os.path.normpath(path).strip("/")
    if not trimmed:
        return "-"
    out = []
    for i, ch in enumerate(trimmed):
        if ch == "/":
            out.append("-")
        elif ch.isalnum() and ch.isascii() or ch in "_:" or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out)


def state_folder() -> str:
    """Where a background daemon keeps its log when there is no syslog: ``/var/log/zarrfs``
    for root, ``$XDG_STATE_HOME/zarrfs`` (``~/.local/state/zarrfs``) for a user."""
    if os.geteuid() == 0:
        return "/var/log/zarrfs"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "zarrfs")


def default_log_file(mountpoint: str) -> str:
    """The log file of a background mount without syslog."""
    return os.path.join(state_folder(), escape_path(mountpoint) + ".log")


class ReopenableFileHandler(logging.FileHandler):
    """A log file that is opened again, by name, before the first line after SIGHUP (so
    logrotate can move it away)."""

    reopen = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.reopen:
            self.reopen = False
            if self.stream is not None:
                stream, self.stream = self.stream, None
                stream.close()
        super().emit(record)


def reopen_logs() -> None:
    """SIGHUP: reopen the log file before the next line; say so in the new file."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, ReopenableFileHandler):
            handler.reopen = True
            log.info("log file reopened (SIGHUP)")


def _syslog() -> logging.Handler | None:
    if not os.path.exists("/dev/log"):
        return None
    try:
        return logging.handlers.SysLogHandler(address="/dev/log")
    except OSError:  # a socket nobody listens on
        return None


def setup_logging(level: str, log_file: str | None, foreground: bool, mountpoint: str | None = None) -> str:
    """Log to ``log_file``, else stderr in the foreground, else syslog, else the default log
    file of ``mountpoint`` (:func:`default_log_file`). Returns where the log goes."""
    handler: logging.Handler | None = None
    where = ""
    if not log_file and not foreground:
        handler = _syslog()
        where = "syslog"
        if handler is None and mountpoint is not None:
            log_file = default_log_file(mountpoint)
            try:
                os.makedirs(os.path.dirname(log_file), mode=0o700, exist_ok=True)
            except OSError:
                log_file = None
    if handler is None and log_file:
        try:
            handler, where = ReopenableFileHandler(log_file), log_file
        except OSError:
            handler = None
    if handler is None:
        handler = logging.StreamHandler(sys.stderr) if foreground else logging.NullHandler()
        where = "stderr" if foreground else ""
    handler.setFormatter(logging.Formatter("%(asctime)s zarrfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return where

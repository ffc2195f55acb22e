"""The mount daemon: opening the database and running FUSE over it until unmounted.

``serve`` runs in the foreground of the calling process. ``zarrfs mount`` without ``-f`` starts
this in a child process and returns once the child reports the mount ready (see ``cli``).
SIGINT/SIGTERM end the request loop between two requests; the mount is then unmounted and open
files are committed, so a normal stop leaves neither lost data nor a dead mountpoint behind.
SIGHUP reopens the log file (logrotate).

Options are parsed in :mod:`zarrfs.options`, URLs and their secrets handled in
:mod:`zarrfs.urls` (only the URL handed to the driver carries a password; what is shown is
:func:`zarrfs.backends.urls.shown_url`), logging set up in :mod:`zarrfs.daemon.logs`.
"""

from __future__ import annotations

import errno
import faulthandler
import logging
import logging.handlers
import os
import signal
import threading
from typing import Any

from zarrfs import compiled
from zarrfs.backends.base import Driver
from zarrfs.backends.urls import shown_url
from zarrfs.daemon import deadmount, logs
from zarrfs.daemon.logs import reopen_logs
from zarrfs.daemon.sdnotify import notify
from zarrfs.dbfiles import open_database
from zarrfs.fs.api import LockTable, Operations
from zarrfs.fs.changes import ChangeWatcher, has_feed
from zarrfs.fs.foldercache import WHOLE, FolderCache
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.readahead import DEFAULT_CHUNKS_AHEAD, Readahead
from zarrfs.fs.tree import Hooks, Tree
from zarrfs.fuse import abi
from zarrfs.fuse.channel import Channel
from zarrfs.fuse.coherence import Coherence
from zarrfs.fuse.loop import Loop
from zarrfs.fuse.session import BUFFER_SIZE, Session
from zarrfs.fuse.tuning import collect_less_often, keep_freed_memory, no_blas_threads, set_readahead
from zarrfs.fuse.workers import DEFAULT_WORKERS, Workers
from zarrfs.options import MountOptions
from zarrfs.urls import reason

log = logging.getLogger("zarrfs")



def hold_snapshot(driver: Driver, opts: MountOptions) -> Driver:
    """``driver`` behind a :class:`SnapshotDriver` holding the state of now (``-o snapshot``)."""
    from zarrfs.backends.snapshot import SnapshotDriver

    try:
        return SnapshotDriver(driver, opts.snapshot or None, opts.snapshot_hold or None)
    except BaseException:
        driver.close()
        raise


def end_snapshot_at_its_limit(driver: Driver, mountpoint: str) -> threading.Timer | None:
    """A timer that unmounts a snapshot mount when its state reaches ``-o snapshot_hold=``
    (reads would fail with ESTALE from then on), with a line in the log saying why."""
    seconds = driver.expires_in()
    if seconds is None:
        return None

    def end() -> None:
        log.error(
            "%s: the snapshot was held %g s, the limit of -o snapshot_hold=: unmounting "
            "(mount it again for a snapshot of now, or raise the limit)", mountpoint, driver.limit
        )
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()
    return timer


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
    # libfuse splits its options at commas and takes a backslash to escape the next character
    # (fusermount3 too): a comma in a path is escaped, not changed ("st,ore" showed "st_ore").
    fsname = shown_url(url).replace("\\", "\\\\").replace(",", "\\,")
    options: dict[str, Any] = {"fsname": fsname, "subtype": "zarrfs"}
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


def _hup_reopens_logs(restore):
    """After a loop caught its stop signals: SIGHUP reopens the log file instead."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda _s, _f: reopen_logs())
    return restore


class _Loop(Loop):
    """The request loop, with SIGHUP reopening the log file instead of stopping it."""

    def _catch_signals(self, wake_w: int):
        return _hup_reopens_logs(super()._catch_signals(wake_w))


class _Workers(Workers):
    """Several request threads (``-o workers=``), with SIGHUP reopening the log file."""

    def _catch_signals(self, wake_w: int):
        return _hup_reopens_logs(super()._catch_signals(wake_w))


def serve(url: str, mountpoint: str, opts: MountOptions, on_ready=None) -> None:
    """Mount ``url`` at ``mountpoint`` and serve requests until unmounted or stopped by
    SIGINT/SIGTERM (blocking); open files are stored on the way out. ``url`` may carry a
    password: it is shown nowhere (see :func:`shown_url`)."""
    from zarrfs.daemon.control import ControlServer

    shown = shown_url(url)
    keep_freed_memory()
    no_blas_threads()
    collect_less_often()
    if threading.current_thread() is threading.main_thread():  # kill -USR2: every thread's stack
        faulthandler.register(signal.SIGUSR2, all_threads=True)
    driver = open_database(url, opts)
    if opts.snapshot is not None:
        driver = hold_snapshot(driver, opts)
    if driver.readonly:  # a driver that holds one version (a zip archive, an Icechunk tag)
        opts.readonly = True
    control = None
    try:
        tree = Tree(
            driver,
            uid=os.getuid() if opts.uid is None else opts.uid,
            gid=os.getgid() if opts.gid is None else opts.gid,
            umask=0o022 if opts.umask is None else opts.umask,
            hooks=make_hooks(opts),
        )
        opts.feed = opts.use_feed and has_feed(driver)
        if opts.seconds("dir_cache") > 0:
            # No whole reads of a server's folders: a page from the name looked up costs about
            # as much a name there, and through a Redis mount a whole read of 20,000 names
            # each lifetime cost a stat loop in numeric order 40-50% of its rate
            # (docs/performance.md, "Redis: what checking a read of several round trips costs").
            whole = 0 if driver.remote else WHOLE
            tree.folder_cache = FolderCache(
                opts.seconds("dir_cache"), entries=opts.dir_cache_entries, whole=whole
            )
        # Chunks' values are read ahead by default only where they are as new as an open's
        # read (the feed tells of a commit before its writer hears it answered); elsewhere
        # their names and sizes, each open still reading its chunk, unless -o chunks_ahead=
        # asks for values.
        ahead, values = opts.chunks_ahead, True
        if ahead is None:
            ahead, values = DEFAULT_CHUNKS_AHEAD, driver.feed_before_reply
        if opts.feed and ahead > 0 and driver.remote and driver.batched:
            tree.readahead = Readahead(tree.array_of, depth=ahead, values=values)
        handles = HandleTable(tree, opts.spill, opts.readonly, opts.parts_above)
        # Locks live in the database, shared by every mount of it; a read-only mount leaves
        # them to the kernel (it could not record them).
        locks = None if opts.readonly else LockTable(driver)
        operations = Operations(tree, handles, locks)
        resolved = os.path.realpath(mountpoint)  # now, while it is a plain folder

        def ready() -> None:
            if opts.readahead:
                set_readahead(resolved, opts.readahead)
            if on_ready is not None:
                on_ready()

        log.info("mounting %s at %s (%s)", shown, mountpoint, "read-only" if opts.readonly else "read-write")
        log.info("compiled modules: %s", compiled.summary())
        channel = Channel(mountpoint, mount_options(shown, opts))
    except BaseException:
        driver.close()
        raise
    # libfuse's auto_unmount misses some deaths of the daemon; a watcher of our own does not.
    unmounter = deadmount.watch(resolved) if opts.fuse.get("auto_unmount") else None
    session = None
    try:  # mounted now: a failure before the loop runs unmounts, leaving no dead mount behind
        session = Session(
            operations,
            channel.fd,
            entry_timeout=opts.seconds("entry_timeout"),
            attr_timeout=opts.seconds("attr_timeout"),
            negative_timeout=opts.seconds("negative_timeout"),
            on_init=ready,
            acl=bool(mount_options(shown, opts).get("default_permissions")),
        )
        session.pages.direct_above = opts.direct_above
        idle = {}
        if opts.feed:
            watcher = ChangeWatcher(tree)
            session.coherence = Coherence(session, watcher)
            idle = {"idle": session.coherence.poll_between, "idle_interval": watcher.interval}
            idle["idle_fd"] = watcher.fileno()
        handle = session.handle
        if opts.allow_root:
            handle = owner_and_root_only(handle, channel.fd, os.getuid())
        # Several threads on a database server, unless asked for one (see README); one on a file.
        workers = DEFAULT_WORKERS if opts.workers is None else max(1, opts.workers)
        if workers > 1 and driver.remote and opts.snapshot is None:
            # Closes waiting together share a commit, unless a wrapper checks who asks.
            grouped = {} if opts.allow_root else {
                "group": session.shared_flush,
                "handle_group": session.flushes,
                "passing": session.passing_key,
            }
            loop = _Workers(channel.fd, handle, session.reader_key, BUFFER_SIZE, workers, **idle, **grouped)
            session.admission = loop.admission
            session.dirs.ahead = loop.ahead  # listings read ahead between requests, alone
            session.invalidator.released = loop.admission.released
            driver.watch = loop.waits  # a driver waiting lets other requests run, notices interrupts
        else:
            loop = _Loop(channel.fd, handle, BUFFER_SIZE, opts.spin, pending=session.watch.pending, **idle)
            session.dirs.ahead = loop.ahead  # listings read ahead between requests
            driver.watch = session.watch  # a driver waiting on a server notices interrupts
        limit = end_snapshot_at_its_limit(driver, mountpoint)
    except BaseException:
        if session is not None:
            session.close()
        channel.close()
        if unmounter is not None:
            unmounter.stdin.close()
        driver.close()
        raise
    try:
        try:
            control = ControlServer(resolved, shown, driver, session, handles, tree, opts)
            control.start()
        except OSError as exc:
            log.warning("no status socket for %s: %s", mountpoint, reason(exc))
        loop.run()
    finally:
        notify("STOPPING=1", f"STATUS=unmounting {mountpoint}")
        if limit is not None:
            limit.cancel()
        if control is not None:
            control.close()
        session.close()
        channel.close()
        if unmounter is not None:
            unmounter.stdin.close()  # unmounted: the watcher sees the mount gone and ends
        # The mount is gone: the last commits wait on the server without watching /dev/fuse.
        driver.watch = None
        operations.destroy()
    if loop.stop_signal is not None:
        log.info("unmounted %s on signal %s", mountpoint, signal.Signals(loop.stop_signal).name)
    else:
        log.info("unmounted %s", mountpoint)
    if logs.repeats is not None:
        logs.repeats.flush()  # what a burst left out, before the daemon ends

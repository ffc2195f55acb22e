"""``zarrfs mount``: check what can be checked before a daemon starts (the database, the
mountpoint, the log file), then serve in the foreground (``-f``) or start the daemon in the
background and return once its mount is ready, or fail with its one line.

Under systemd (``Type=notify``), the daemon says ``READY=1`` once it serves and ``STOPPING=1``
when it stops (:mod:`zarrfs.daemon.sdnotify`); a background start says ``READY=1`` with the daemon's
pid as ``MAINPID``.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import stat
import subprocess
import sys
import time

from zarrfs.backends.base import BackendError
from zarrfs.backends.registry import password_env
from zarrfs.backends.urls import shown_url, url_password
from zarrfs.cli.oneline import fail, status_of
from zarrfs.daemon.logs import setup_logging
from zarrfs.daemon.sdnotify import notify
from zarrfs.dbfiles import open_database
from zarrfs.fuse.channel import MountError
from zarrfs.options import UsageError, parse_options
from zarrfs.urls import MountFailure, location, reason

READY = b"ready\n"
WARNING_PREFIX = "zarrfs: warning: "
START_TIMEOUT = 60.0


def _hide_secrets(secrets: list[str]) -> None:
    """Take ``secrets`` out of this process's argv and environment as the kernel shows them
    (``/proc/self/cmdline``, ``/proc/self/environ``), as setproctitle does, and drop the
    password variables from ``os.environ`` (so no child inherits them). In argv a secret is cut
    out (the rest moves up, NULs fill the end: its length shows nowhere); in the environment it
    becomes NULs in place (the C library's pointers into that area stay right)."""
    for name in password_env():
        os.environ.pop(name, None)
    wanted = [s.encode() for s in secrets if s]
    if not wanted:
        return
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # Fields 48-51 of stat(5): arg_start, arg_end, env_start, env_end (3 is fields[0]).
        areas = [(int(fields[45]), int(fields[46]), True), (int(fields[47]), int(fields[48]), False)]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end, cut in areas:
                mem.seek(start)
                area = mem.read(end - start)
                hidden = area
                for secret in wanted:
                    hidden = hidden.replace(secret, b"" if cut else b"\0" * len(secret))
                if hidden != area:
                    mem.seek(start)
                    mem.write(hidden.ljust(len(area), b"\0"))
    except (OSError, ValueError, IndexError):
        pass


def _read_fd(fd: int) -> str:
    with os.fdopen(fd, "rb") as fh:
        return fh.read().decode()


def _preflight(url: str, mountpoint: str, opts) -> None:
    if not os.path.exists("/dev/fuse"):
        raise MountFailure("/dev/fuse is missing: FUSE is not available on this machine")
    try:
        is_folder = stat.S_ISDIR(os.stat(mountpoint).st_mode)
    except FileNotFoundError:
        raise MountFailure(f"mountpoint {mountpoint} does not exist") from None
    except OSError as exc:
        if exc.errno in (107, 103):  # ENOTCONN, ECONNABORTED: its daemon died (kill -9, a crash)
            raise MountFailure(
                f"mountpoint {mountpoint} holds a mount whose daemon is gone "
                f"(Transport endpoint is not connected): run 'zarrfs umount {mountpoint}' first"
            ) from None
        raise MountFailure(f"mountpoint {mountpoint}: {exc.strerror or exc}") from None
    if not is_folder:
        raise MountFailure(f"mountpoint {mountpoint} is not a folder")
    if os.path.ismount(mountpoint):
        from zarrfs.cli.mounttable import _alive, _zarrfsmounts

        # The kernel may answer the stat above from its cache when the daemon was killed.
        real = os.path.realpath(mountpoint)
        if any(mp == real for mp, _, _ in _zarrfsmounts()) and not _alive(real):
            raise MountFailure(
                f"mountpoint {mountpoint} holds a mount whose daemon is gone: run 'zarrfs umount "
                f"{mountpoint}' first"
            )
        raise MountFailure(f"mountpoint {mountpoint} is busy (already mounted)")
    if not opts.nonempty and _has_entries(mountpoint):
        raise MountFailure(
            f"mountpoint {mountpoint} is not empty (its files would be hidden while mounted): "
            "use an empty folder, or add -o nonempty"
        )
    # A bad URL, a missing database, an unreachable server. Its warnings are the daemon's to
    # say (it opens the database again, and the starting command shows them once, prefixed).
    backends = logging.getLogger("zarrfs.backends")
    level = backends.level
    backends.setLevel(logging.ERROR)
    try:
        driver = open_database(url, opts)
    finally:
        backends.setLevel(level)
    driver.close()


def _has_entries(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def _log_file(path: str) -> str:
    """``--log-file`` made absolute; a folder that is missing or a file that cannot be written
    is a :class:`MountFailure` now, not a daemon that logs nowhere."""
    path = os.path.abspath(os.path.expanduser(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise MountFailure(f"--log-file {path}: the folder {folder} does not exist (create it first)")
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise MountFailure(f"--log-file {path} cannot be written: {reason(exc)}") from None
    return path


def cmd_mount(args: argparse.Namespace) -> int:
    """``zarrfs mount``."""
    try:
        opts = parse_options(args.o or [])
        mountpoint = os.path.abspath(args.mountpoint)
        if args.url_fd is not None:  # the daemon: the URL, with any password, came by a pipe
            url = _read_fd(args.url_fd)
        else:
            url = location(args.url)
        _hide_secrets([url_password(args.url) or "", *[os.environ.get(n, "") for n in password_env()]])
        if args.log_file:
            args.log_file = _log_file(args.log_file)
        if args.ready_fd is None:
            _preflight(url, mountpoint, opts)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return fail(str(exc), status_of(exc))
    if args.foreground:
        return _run_foreground(args, opts, url, mountpoint)
    return _start_background(args, url, mountpoint)


def _run_foreground(args: argparse.Namespace, opts, url: str, mountpoint: str) -> int:
    setup_logging(args.log_level, args.log_file, foreground=args.ready_fd is None, mountpoint=mountpoint)
    starting = None
    if args.ready_fd is not None:
        # Until the mount is ready, warnings (a database another program holds) reach the
        # starting command too, which shows them at once (see _start_background).
        starting = logging.StreamHandler(sys.stderr)
        starting.setLevel(logging.WARNING)
        starting.setFormatter(logging.Formatter(WARNING_PREFIX + "%(message)s"))
        logging.getLogger().addHandler(starting)

    mounted = False

    def ready() -> None:
        nonlocal mounted
        mounted = True
        if args.ready_fd is None:  # -f: this is the service's process
            notify("READY=1", f"STATUS=serving {shown_url(url)} at {mountpoint}")
        else:
            logging.getLogger().removeHandler(starting)
            os.write(args.ready_fd, READY)
            os.close(args.ready_fd)
            # The starting process is gone now; nothing may write to its pipe any more.
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)

    from zarrfs.daemon.main import serve  # the daemon's own process only: the starter never serves

    try:
        serve(url, mountpoint, opts, on_ready=ready)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return fail(str(exc), status_of(exc))
    except MountError as exc:  # libfuse or fusermount3 refused: their reason
        if starting is not None:  # the starting command says it, once, as its own error
            logging.getLogger().removeHandler(starting)
        logging.getLogger("zarrfs").error("mount of %s failed: %s", mountpoint, exc)
        return fail(str(exc))
    except RuntimeError as exc:
        if mounted:  # it served: the mount is gone and open files were committed on the way
            logging.getLogger("zarrfs").error("the mount of %s ended: %s", mountpoint, exc)
            return 1
        return fail(f"mount failed ({exc})")
    return 0


def _start_background(args: argparse.Namespace, url: str, mountpoint: str) -> int:
    shown = shown_url(url)
    read_end, write_end = os.pipe()
    url_r, url_w = os.pipe()  # the URL with its secret: never on a command line
    os.write(url_w, url.encode())
    os.close(url_w)
    cmd = [sys.executable, "-m", "zarrfs", "mount", shown, mountpoint, "-f", "--ready-fd", str(write_end)]
    cmd += ["--url-fd", str(url_r)]
    for word in args.o or []:
        cmd += ["-o", word]
    cmd += ["--log-level", args.log_level]
    if args.log_file:
        cmd += ["--log-file", args.log_file]
    env = {k: v for k, v in os.environ.items() if k not in password_env()}
    # The daemon runs in "/": it imports this very zarrfs, wherever it came from.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=(write_end, url_r),
        start_new_session=True,
        cwd="/",
        env=env,
    )
    os.close(write_end)
    os.close(url_r)
    got = said = b""
    assert child.stderr is not None
    err_fd = child.stderr.fileno()
    warning = WARNING_PREFIX.encode()
    deadline = time.monotonic() + START_TIMEOUT
    while READY not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([read_end] + ([err_fd] if err_fd >= 0 else []), [], [], 0.2)
        if err_fd in ready:  # the daemon's warnings are shown as they come
            chunk = os.read(err_fd, 65536)
            said += chunk
            while warning in said and b"\n" in said[said.index(warning):]:
                start = said.index(warning)
                end = said.index(b"\n", start) + 1
                sys.stderr.write(said[start:end].decode(errors="replace"))
                sys.stderr.flush()
                said = said[:start] + said[end:]
            if not chunk:
                err_fd = -1
        if read_end in ready:
            chunk = os.read(read_end, 64)
            if not chunk:
                break
            got += chunk
        elif not ready and child.poll() is not None:
            break
    os.close(read_end)
    if READY in got:
        for _ in range(100):  # the kernel may take a moment to show it
            if os.path.ismount(mountpoint):
                # Under systemd (Type=notify) the daemon is the service's process from now on.
                notify("READY=1", f"MAINPID={child.pid}")
                return 0
            time.sleep(0.05)
    err = b""
    code = child.poll()
    if code is None and READY not in got and time.monotonic() < deadline:
        try:  # it closed its end of the pipe: it is on its way out
            code = child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    if code is None:
        child.terminate()
    try:
        err = child.communicate(timeout=10)[1] or b""
    except subprocess.TimeoutExpired:
        child.kill()
    text = (said + err).decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(WARNING_PREFIX)]
    if lines:
        detail = lines[-1].removeprefix("zarrfs: ")
    else:  # nothing said on stderr: what was seen, and where the daemon's own account is
        if READY in got:
            detail = "the daemon started, but the kernel does not list the mount"
        elif code is None:
            detail = f"the daemon was not ready within {START_TIMEOUT:.0f} s"
        else:
            detail = f"the daemon exited (status {code}) before it was ready"
        detail += f": see {args.log_file}" if args.log_file else ": run it with -f to see why"
    return fail(f"mount of {shown} at {mountpoint} failed: {detail}")



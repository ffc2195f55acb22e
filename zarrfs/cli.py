"""The ``zarrfs`` command line: mount, umount, check, copy, reindex.

``zarrfs mount URL MOUNTPOINT`` follows sshfs/rclone: it runs in the background by default and
returns only when the mount is ready, or fails with one clear line (bad URL, database missing,
mountpoint busy, no /dev/fuse). ``-f`` keeps it in the foreground.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import select
import shutil
import stat
import subprocess
import sys
import time

from zarrfs import __version__
from zarrfs.backends.base import BackendError
from zarrfs.daemon import UsageError, open_database, parse_options, serve, setup_logging

READY = b"ready\n"
START_TIMEOUT = 60.0


def _fail(message: str, status: int = 1) -> int:
    print(f"zarrfs: {message}", file=sys.stderr)
    return status


def _preflight(url: str, mountpoint: str, opts) -> None:
    if not os.path.exists("/dev/fuse"):
        raise UsageError("/dev/fuse is missing: FUSE is not available on this machine")
    try:
        is_folder = stat.S_ISDIR(os.stat(mountpoint).st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):  # its daemon died (kill -9, a crash)
            raise UsageError(
                f"mountpoint {mountpoint} holds a mount whose daemon is gone "
                f"(Transport endpoint is not connected): run 'zarrfs umount {mountpoint}' first"
            ) from None
        is_folder = False
    if not is_folder:
        raise UsageError(f"mountpoint {mountpoint} is not a folder")
    if os.path.ismount(mountpoint):
        raise UsageError(f"mountpoint {mountpoint} is busy (already mounted)")
    driver = open_database(url, opts)  # bad URL, missing database, unreachable server
    driver.close()


def cmd_mount(args: argparse.Namespace) -> int:
    """``zarrfs mount``."""
    try:
        opts = parse_options(args.o or [])
        mountpoint = os.path.abspath(args.mountpoint)
        if args.ready_fd is None:
            _preflight(args.url, mountpoint, opts)
    except (UsageError, BackendError, ValueError) as exc:
        return _fail(str(exc), 2 if isinstance(exc, UsageError) else 1)
    if args.foreground:
        return _run_foreground(args, opts, mountpoint)
    return _start_background(args, mountpoint)


def _run_foreground(args: argparse.Namespace, opts, mountpoint: str) -> int:
    setup_logging(args.log_level, args.log_file, foreground=args.ready_fd is None)

    mounted = False

    def ready() -> None:
        nonlocal mounted
        mounted = True
        if args.ready_fd is not None:
            os.write(args.ready_fd, READY)
            os.close(args.ready_fd)
            # The starting process is gone now; nothing may write to its pipe any more.
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)

    try:
        serve(args.url, mountpoint, opts, on_ready=ready)
    except (UsageError, BackendError, ValueError) as exc:
        return _fail(str(exc))
    except RuntimeError as exc:
        if mounted:  # it served: the mount is gone and open files were committed on the way
            logging.getLogger("zarrfs").error("the mount of %s ended: %s", mountpoint, exc)
            return 1
        return _fail(f"mount failed ({exc})")  # libfuse refused to mount; it printed why
    return 0


def _start_background(args: argparse.Namespace, mountpoint: str) -> int:
    read_end, write_end = os.pipe()
    cmd = [sys.executable, "-m", "zarrfs", "mount", args.url, mountpoint, "-f", "--ready-fd", str(write_end)]
    for word in args.o or []:
        cmd += ["-o", word]
    cmd += ["--log-level", args.log_level]
    if args.log_file:
        cmd += ["--log-file", os.path.abspath(args.log_file)]
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=(write_end,),
        start_new_session=True,
        cwd="/",
    )
    os.close(write_end)
    got = b""
    deadline = time.monotonic() + START_TIMEOUT
    while READY not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([read_end], [], [], 0.2)
        if ready:
            chunk = os.read(read_end, 64)
            if not chunk:
                break
            got += chunk
        elif child.poll() is not None:
            break
    os.close(read_end)
    if READY in got:
        for _ in range(100):  # the kernel may take a moment to show it
            if os.path.ismount(mountpoint):
                return 0
            time.sleep(0.05)
    err = b""
    if child.poll() is None:
        child.terminate()
    try:
        err = child.communicate(timeout=10)[1] or b""
    except subprocess.TimeoutExpired:
        child.kill()
    lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    # libfuse says what it refused ("fuse: unknown option(s): ..."); that line beats our own.
    fuse_lines = [ln for ln in lines if ln.startswith("fuse:")]
    detail = (fuse_lines or lines or ["the daemon did not start"])[-1].removeprefix("zarrfs: ")
    return _fail(f"mount of {args.url} at {mountpoint} failed: {detail}")


def _daemon_pids(mountpoint: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"zarrfs" in b" ".join(argv[:3]) and b"mount" in argv and mountpoint.encode() in argv:
            pids.append(int(entry))
    return pids


def cmd_umount(args: argparse.Namespace) -> int:
    """``zarrfs umount``: unmount (open files were committed when closed) and wait for the
    daemon to finish."""
    mountpoint = os.path.abspath(args.mountpoint)
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    pids = _daemon_pids(mountpoint)
    cmd = [tool, "-u"] + (["-z"] if args.lazy else []) + [mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "fusermount failed"
        if "not connected" in message:  # a daemon that died: clear the dead mountpoint
            result = subprocess.run([tool, "-u", "-z", mountpoint], capture_output=True, text=True)
            if result.returncode == 0:
                return 0
        return _fail(message)
    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        time.sleep(0.02)
    return 0


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def cmd_check(args: argparse.Namespace) -> int:
    """``zarrfs check URL``: validate every metadata and chunk key offline."""
    from zarrfs.format.check import check_database

    try:
        opts = parse_options(["ro"])
        driver = open_database(args.url, opts)
    except (UsageError, BackendError, ValueError) as exc:
        return _fail(str(exc), 2)
    with driver:
        problems = 0
        for problem in check_database(driver):
            if problem.severity == "error" or args.warnings:
                print(f"{problem.severity}: {problem.key}: {problem.rule}: {problem.value}")
            problems += problem.severity == "error"
    print(f"{problems} problem(s) found" if problems else "no problems found", file=sys.stderr)
    return 1 if problems else 0


def cmd_copy(args: argparse.Namespace) -> int:
    """``zarrfs copy SOURCE DEST``: folder -> database, database -> folder or database."""
    from zarrfs.tools.copy import copy

    try:
        count = copy(args.source, args.dest)
    except (BackendError, OSError, ValueError) as exc:
        return _fail(str(exc))
    print(f"copied {count} keys", file=sys.stderr)
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    """``zarrfs reindex URL``: rebuild a Redis database's listing index from its keyspace
    (after another client, such as zarr-python 2's ``RedisStore``, added or removed keys)."""
    try:
        driver = open_database(args.url, parse_options([]))
    except (UsageError, BackendError, ValueError) as exc:
        return _fail(str(exc), 2)
    with driver:
        reindex = getattr(driver, "reindex", None)
        if reindex is None:
            return _fail(f"{args.url}: this database lists its keys directly and keeps no index", 2)
        try:
            count = reindex()
        except BackendError as exc:
            return _fail(str(exc))
    print(f"indexed {count} keys", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zarrfs``."""
    parser = argparse.ArgumentParser(prog="zarrfs", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"zarrfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    mount = sub.add_parser("mount", help="mount a database as a Zarr folder")
    mount.add_argument(
        "url", help="lmdb:///path, sqlite:///path, redis://host:port/db?prefix=zarr, or a path"
    )
    mount.add_argument("mountpoint")
    mount.add_argument("-o", action="append", metavar="OPT[,OPT...]", help="mount options (see README)")
    mount.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    mount.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    mount.add_argument("--log-file", help="write the daemon's log here (default: syslog, or stderr with -f)")
    mount.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    mount.set_defaults(func=cmd_mount)

    umount = sub.add_parser("umount", help="unmount (waits for the daemon to finish)")
    umount.add_argument("mountpoint")
    umount.add_argument("-z", "--lazy", action="store_true", help="detach now, finish when no longer busy")
    umount.set_defaults(func=cmd_umount)

    check = sub.add_parser("check", help="validate the Zarr metadata and chunk keys of a database")
    check.add_argument("url")
    check.add_argument("--warnings", action="store_true", help="print warnings too")
    check.set_defaults(func=cmd_check)

    copy = sub.add_parser("copy", help="copy every key between a folder and a database (or two databases)")
    copy.add_argument("source", help="a folder, or a database URL")
    copy.add_argument("dest", help="a folder, or a database URL (created if missing)")
    copy.set_defaults(func=cmd_copy)

    reindex = sub.add_parser("reindex", help="rebuild a Redis database's listing index from its keys")
    reindex.add_argument("url")
    reindex.set_defaults(func=cmd_reindex)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``zarrfs`` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())

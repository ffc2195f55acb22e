"""The zarrfs command line: mount, umount, status, check, copy, reindex.

zarrfs mount URL MOUNTPOINT follows sshfs and rclone: it runs in the background by default and
returns only when the mount is ready, or fails with one clear line (bad URL, database missing,
mountpoint busy, no /dev/fuse). -f keeps it in the foreground. zarrfs URL MOUNTPOINT -o OPTS
(without "mount") is the same: the form mount.fuse3 uses for /etc/fstab and mount -t fuse.zarrfs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import stat
import subprocess
import sys
import time

from zarrfs import __version__, commit
from zarrfs.backends.base import BackendError
from zarrfs.daemon import open_database, serve
from zarrfs.fuse.channel import MountError
from zarrfs.helptext import DESCRIPTION, EXIT_HELP, OPTIONS_HELP, URLS_HELP
from zarrfs.logs import setup_logging
from zarrfs.options import UsageError, parse_options
from zarrfs.urls import PASSWORD_ENV, MountFailure, redis_secret, resolve_url, shown_url, url_password

READY = b"ready\n"
START_TIMEOUT = 60.0
COMMANDS = ("mount", "umount", "status", "commit", "check", "copy", "consolidate", "reindex")

def _fail(message: str, status: int = 1) -> int:
    print(f"zarrfs: {message}", file=sys.stderr)
    return status


def _hide_secrets(secrets: list[str]) -> None:
    """Overwrite ``secrets`` in this process's argv and environment as the kernel shows them
    (``/proc/self/cmdline``, ``/proc/self/environ``), as setproctitle does, and drop the
    password variables from ``os.environ`` (so no child inherits them)."""
    for name in PASSWORD_ENV:
        os.environ.pop(name, None)
    wanted = [s.encode() for s in secrets if s]
    if not wanted:
        return
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # Fields 48-51 of stat(5): arg_start, arg_end, env_start, env_end (3 is fields[0]).
        areas = [(int(fields[45]), int(fields[46])), (int(fields[47]), int(fields[48]))]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end in areas:
                mem.seek(start)
                area = mem.read(end - start)
                hidden = area
                for secret in wanted:
                    hidden = hidden.replace(secret, b"*" * len(secret))
                if hidden != area:
                    mem.seek(start)
                    mem.write(hidden)
    except (OSError, ValueError, IndexError):
        pass


def _read_fd(fd: int) -> str:
    with os.fdopen(fd, "rb") as fh:
        return fh.read().decode()


def _mounts() -> list[tuple[str, str, str, str]]:
    """``(mountpoint, fstype, source, options)`` of every mount this process sees."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 6 or len(tail) < 3:
                    continue
                found.append((_unescape(fields[4]), tail[0], _unescape(tail[1]), fields[5] + "," + tail[2]))
    except OSError:
        pass
    return found


def _unescape(text: str) -> str:
    for code in ("\\040", "\\011", "\\012", "\\134"):
        text = text.replace(code, chr(int(code[1:], 8)))
    return text


def _mounted(mountpoint: str) -> bool:
    return any(mp == mountpoint for mp, *_ in _mounts())


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
        raise MountFailure(f"mountpoint {mountpoint} is busy (already mounted)")
    driver = open_database(url, opts)  # bad URL, missing database, unreachable server
    driver.close()


def _status_of(exc: BaseException) -> int:
    return 2 if isinstance(exc, UsageError) else 1


def cmd_mount(args: argparse.Namespace) -> int:
    """``zarrfs mount``."""
    try:
        opts = parse_options(args.o or [])
        mountpoint = os.path.abspath(args.mountpoint)
        if args.url_fd is not None:  # the daemon: the URL, with any password, came by a pipe
            url = _read_fd(args.url_fd)
        else:
            url = redis_secret(resolve_url(args.url))
        _hide_secrets([url_password(args.url) or "", *[os.environ.get(n, "") for n in PASSWORD_ENV]])
        if args.log_file:
            args.log_file = os.path.abspath(args.log_file)
        if args.ready_fd is None:
            _preflight(url, mountpoint, opts)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return _fail(str(exc), _status_of(exc))
    if args.foreground:
        return _run_foreground(args, opts, url, mountpoint)
    return _start_background(args, url, mountpoint)


def _run_foreground(args: argparse.Namespace, opts, url: str, mountpoint: str) -> int:
    setup_logging(args.log_level, args.log_file, foreground=args.ready_fd is None, mountpoint=mountpoint)

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
        serve(url, mountpoint, opts, on_ready=ready)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return _fail(str(exc), _status_of(exc))
    except MountError as exc:  # libfuse or fusermount3 refused: their reason
        logging.getLogger("zarrfs").error("mount of %s failed: %s", mountpoint, exc)
        return _fail(str(exc))
    except RuntimeError as exc:
        if mounted:  # it served: the mount is gone and open files were committed on the way
            logging.getLogger("zarrfs").error("the mount of %s ended: %s", mountpoint, exc)
            return 1
        return _fail(f"mount failed ({exc})")
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
    env = {k: v for k, v in os.environ.items() if k not in PASSWORD_ENV}
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
    detail = (lines or ["the daemon did not start"])[-1].removeprefix("zarrfs: ")
    return _fail(f"mount of {shown} at {mountpoint} failed: {detail}")


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
    if not _mounted(mountpoint):
        if not os.path.exists(mountpoint):
            return _fail(f"{mountpoint} does not exist")
        return _fail(f"{mountpoint} is not mounted")
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    pids = _daemon_pids(mountpoint)
    cmd = [tool, "-u"] + (["-z"] if args.lazy else []) + [mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()
        message = said[-1] if said else "fusermount3 failed"
        if "not connected" in message:  # a daemon that died: clear the dead mountpoint
            result = subprocess.run([tool, "-u", "-z", mountpoint], capture_output=True, text=True)
            if result.returncode == 0:
                return 0
        if "busy" in message.lower():
            return _fail(
                f"{mountpoint} is busy: files or folders in it are in use (close them, or "
                f"'zarrfs umount -z {mountpoint}' detaches it now and finishes once they are closed)"
            )
        reason = message.rpartition(": ")[2] if ": " in message else message
        return _fail(f"cannot unmount {mountpoint}: {reason}")
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


def cmd_status(args: argparse.Namespace) -> int:
    """``zarrfs status [MOUNTPOINT]``: the zarrfs mounts, or one mount's live figures."""
    from zarrfs.control import NoAnswer, ask, render_status

    mounts = [(mp, source, options) for mp, fstype, source, options in _mounts() if fstype == "fuse.zarrfs"]
    if args.mountpoint is None:
        if args.json:
            print(json.dumps([{"mountpoint": mp, "url": src} for mp, src, _ in mounts], indent=2))
        for mp, source, options in [] if args.json else mounts:
            mode = "ro" if "ro" in options.split(",") else "rw"
            print(f"{mp}\t{source}\t{mode}")
        if not mounts and not args.json:
            print("no zarrfs mounts", file=sys.stderr)
        return 0
    mountpoint = os.path.abspath(args.mountpoint)
    if not any(mp == mountpoint for mp, _, _ in mounts):
        if not os.path.exists(mountpoint):
            return _fail(f"{mountpoint} does not exist")
        return _fail(f"{mountpoint} is not a zarrfs mount")
    try:
        doc = ask(mountpoint)
    except NoAnswer as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(render_status(doc))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``zarrfs check URL``: validate every metadata and chunk key offline, find orphan parts."""
    from itertools import chain

    from zarrfs.format.check import check_database
    from zarrfs.tools.orphans import report

    try:
        url = redis_secret(resolve_url(args.url))
        driver = open_database(url, parse_options([] if args.repair else ["ro"]), hint=False)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return _fail(str(exc), _status_of(exc))
    with driver:
        problems = 0
        found = ((p.severity, p.key, f"{p.rule}: {p.value}") for p in check_database(driver))
        for severity, key, text in chain(found, report(driver, args.repair)):
            if severity != "warning" or args.warnings:
                print(f"{severity}: {key}: {text}")
            problems += severity == "error"
    print(f"{problems} problem(s) found" if problems else "no problems found", file=sys.stderr)
    return 1 if problems else 0


def cmd_copy(args: argparse.Namespace) -> int:
    """``zarrfs copy SOURCE DEST``: between folders and databases, key for key."""
    from zarrfs.control import size_text
    from zarrfs.tools.copy import CopyError, copy

    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    try:
        source = args.source if "://" in args.source else os.path.abspath(args.source)
        dest = args.dest if "://" in args.dest else os.path.abspath(args.dest)
        source = redis_secret(resolve_url(source)) if "://" in source else source
        dest = redis_secret(resolve_url(dest)) if "://" in dest else dest
        done = copy(
            source,
            dest,
            if_exists=args.if_exists,
            dry_run=args.dry_run,
            progress=progress and not args.dry_run,
            validate=args.validate,
        )
    except (UsageError, MountFailure, CopyError, BackendError, OSError, ValueError) as exc:
        return _fail(str(exc), _status_of(exc))
    verb = "would copy" if args.dry_run else "copied"
    skipped = f", skipped {done.skipped} that exist there" if done.skipped else ""
    print(f"{verb} {done.keys} keys ({size_text(done.bytes)}){skipped}", file=sys.stderr)
    return 0


def cmd_consolidate(args: argparse.Namespace) -> int:
    """``zarrfs consolidate URL|FOLDER``: rebuild the stale consolidated documents."""
    from zarrfs.tools.consolidate import consolidate

    try:
        where = args.location if "://" in args.location else os.path.abspath(args.location)
        where = redis_secret(resolve_url(where)) if "://" in where else where
        found, changed = consolidate(where)
    except (UsageError, MountFailure, BackendError, OSError, ValueError) as exc:
        return _fail(str(exc), _status_of(exc))
    print(f"{found} consolidated document(s), rebuilt {changed}", file=sys.stderr)
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    """``zarrfs reindex URL``: rebuild a Redis database's listing index from its keyspace (after
    another client, zarr-python 2's ``RedisStore`` say, added or removed keys)."""
    try:
        url = redis_secret(resolve_url(args.url))
        driver = open_database(url, parse_options([]), hint=False)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return _fail(str(exc), _status_of(exc))
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


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one line (exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog.split()[0]} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zarrfs``."""
    raw = argparse.RawDescriptionHelpFormatter
    epilog = URLS_HELP + "\n" + OPTIONS_HELP + "\n" + EXIT_HELP
    parser = _Parser(prog="zarrfs", description=DESCRIPTION, epilog=epilog, formatter_class=raw)
    parser.add_argument("--version", action="version", version=f"zarrfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    mount = sub.add_parser(
        "mount", help="mount a database as a Zarr folder (in the background; -f: foreground)",
        description="Mount a database at MOUNTPOINT. Returns once the mount is ready, or fails "
        "with one line.", epilog=URLS_HELP + "\n" + OPTIONS_HELP + "\n" + EXIT_HELP, formatter_class=raw,
    )
    mount.add_argument("url", metavar="URL", help="database URL or path (see below)")
    mount.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing, empty folder")
    mount.add_argument("-o", action="append", metavar="OPT[,OPT...]", help="mount options (see below)")
    mount.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    mount.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    mount.add_argument(
        "--log-file",
        help="the daemon's log (default: stderr with -f; else syslog, or without one "
        "/var/log/zarrfs/MOUNTPOINT.log for root, ~/.local/state/zarrfs/MOUNTPOINT.log for users)",
    )
    mount.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    mount.add_argument("--url-fd", type=int, help=argparse.SUPPRESS)
    mount.set_defaults(func=cmd_mount)

    umount = sub.add_parser("umount", help="unmount (waits for the daemon to finish)", epilog=EXIT_HELP,
                            formatter_class=raw)
    umount.add_argument("mountpoint", metavar="MOUNTPOINT")
    umount.add_argument("-z", "--lazy", action="store_true", help="detach now, finish when no longer busy")
    umount.set_defaults(func=cmd_umount)

    status = sub.add_parser("status", help="list zarrfs mounts, or show one mount's live figures",
                            epilog=EXIT_HELP, formatter_class=raw)
    status.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)

    commit.add_parser(sub, raw)
    check = sub.add_parser("check", help="validate the Zarr metadata and chunk keys of a database",
                           epilog=URLS_HELP + "\n" + EXIT_HELP, formatter_class=raw)
    check.add_argument("url", metavar="URL")
    check.add_argument("--warnings", action="store_true", help="print warnings too")
    check.add_argument("--repair", action="store_true", help="delete the parts no file references")
    check.set_defaults(func=cmd_check)

    copy = sub.add_parser("copy", help="copy every key between a folder and a database (or two databases)",
                          epilog=URLS_HELP + "\n" + EXIT_HELP, formatter_class=raw)
    copy.add_argument("source", metavar="SOURCE", help="a folder, or a database URL")
    copy.add_argument("dest", metavar="DEST", help="a folder, or a database URL (created if missing)")
    copy.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="show a progress bar (default: when stderr is a terminal)")
    copy.add_argument(
        "--if-exists", choices=("replace", "skip", "raise"), default="replace",
        help="keys the destination has: overwrite them (default), keep them, or copy nothing (raise)",
    )
    copy.add_argument("--dry-run", action="store_true", help="say what would be copied; write nothing")
    copy.add_argument(
        "--validate", action="store_true",
        help="check the Zarr metadata and chunk keys of what is copied first; copy nothing if one is wrong",
    )
    copy.set_defaults(func=cmd_copy)

    cons = sub.add_parser("consolidate", help="rebuild the stale consolidated metadata documents",
                          epilog=URLS_HELP + "\n" + EXIT_HELP, formatter_class=raw)
    cons.add_argument("location", metavar="URL|FOLDER", help="a database URL, or a folder (a mount too)")
    cons.set_defaults(func=cmd_consolidate)

    reindex = sub.add_parser("reindex", help="rebuild a Redis database's listing index from its keys",
                             epilog=URLS_HELP + "\n" + EXIT_HELP, formatter_class=raw)
    reindex.add_argument("url", metavar="URL")
    reindex.set_defaults(func=cmd_reindex)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``zarrfs`` console script. ``zarrfs SOURCE MOUNTPOINT [-o OPTS]``
    (what mount.fuse3 runs for /etc/fstab) is ``zarrfs mount SOURCE MOUNTPOINT [-o OPTS]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        argv.insert(0, "mount")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())

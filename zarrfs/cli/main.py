"""The zarrfs command line: mount, umount, status, check, copy, consolidate, reindex.

zarrfs mount URL MOUNTPOINT follows sshfs and rclone: it runs in the background by default and
returns only when the mount is ready, or fails with one clear line (bad URL, database missing,
mountpoint busy, no /dev/fuse). -f keeps it in the foreground. zarrfs URL MOUNTPOINT -o OPTS
(without "mount") is the same: the form mount.fuse3 uses for /etc/fstab and mount -t fuse.zarrfs.
A first word that is neither a command nor a path is an unknown command, never a database name.

Every path a command takes (database, mountpoint, log file, password file, copy ends) is made
absolute once, against the caller's folder, before anything is opened or a daemon started; every
error is one line on stderr naming the thing and what to do: exit status 1, 2 for usage.
"""

from __future__ import annotations

import argparse
import os
import sys

from zarrfs import __version__
from zarrfs.backends.base import BackendError
from zarrfs.cli import commit
from zarrfs.cli.helptext import DESCRIPTION, EXIT_HELP, OPTIONS_HELP, SYNOPSIS, URLS_HELP
from zarrfs.cli.mounttable import cmd_status, cmd_umount, daemon_pids
from zarrfs.cli.oneline import fail, status_of
from zarrfs.lines import one_line
from zarrfs.urls import MountFailure, location
from zarrfs.usage import UsageError

__all__ = ["COMMANDS", "daemon_pids", "build_parser", "main"]  # daemon_pids: for the tests

COMMANDS = ("mount", "umount", "status", "stats", "commit", "check", "copy", "consolidate", "reindex")


# A command imports what it runs when it runs: ``zarrfs umount`` or ``status`` start in a tenth
# of the time the whole daemon takes to import.
def cmd_mount(args: argparse.Namespace) -> int:
    """``zarrfs mount URL MOUNTPOINT`` (see ``mount_command``)."""
    from zarrfs.cli.mount_command import cmd_mount as run

    return run(args)


def cmd_stats(args: argparse.Namespace) -> int:
    """``zarrfs stats`` (see ``stats``)."""
    from zarrfs.cli.stats import cmd_stats as run

    return run(args)


def cmd_check(args: argparse.Namespace) -> int:
    """``zarrfs check URL``: validate every metadata and chunk key offline, find orphan parts."""
    from itertools import chain

    from zarrfs.dbfiles import open_database
    from zarrfs.format.check import check_database
    from zarrfs.options import parse_options
    from zarrfs.tools.orphans import report

    try:
        url = location(_mounted_database(args.url, args.repair))
        driver = open_database(url, parse_options([] if args.repair else ["ro"]), hint=False)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return fail(str(exc), status_of(exc))
    with driver:
        problems = 0
        bar = _KeysChecked(driver) if sys.stderr.isatty() else None
        found = ((p.severity, p.key, f"{p.rule}: {p.value}") for p in check_database(bar or driver))
        try:
            for severity, key, text in chain(found, report(driver, args.repair)):
                if severity != "warning" or args.warnings:
                    line = one_line(f"{severity}: {key}: {text}")  # a key may hold a newline
                    bar.write(line) if bar is not None else print(line)
                problems += severity == "error"
        finally:
            if bar is not None:
                bar.close()
    print(f"{problems} problem(s) found" if problems else "no problems found", file=sys.stderr)
    return 1 if problems else 0


def _mounted_database(text: str, repair: bool) -> str:
    """``text``, or the database mounted there when it is the mountpoint of a zarrfs mount
    (said on stderr): ``zarrfs check MOUNTPOINT`` checks what is mounted (it suggested
    copying the mount into a new database). ``--repair`` of a mounted database is refused."""
    from zarrfs.cli.mounttable import _zarrfsmounts

    if "://" in text or not os.path.isdir(text):
        return text
    real = os.path.realpath(text)
    source = next((src for mp, src, _ in _zarrfsmounts() if mp == real), None)
    if source is None:
        return text
    if repair:
        raise MountFailure(
            f"{text} is a mount of {source}: unmount it first (zarrfs umount {text}), then zarrfs check "
            f"--repair {source}"
        )
    print(f"{text} is a mount of {source}: checking {source}", file=sys.stderr)
    return source


class _KeysChecked:
    """The driver ``zarrfs check`` reads, counting the keys its listing passes on a tqdm bar on
    stderr (a check of 10^7 keys takes minutes); problem lines go out above the bar."""

    def __init__(self, driver) -> None:
        from tqdm import tqdm

        self.driver = driver
        self.tqdm = tqdm
        self.bar = tqdm(desc="checking", unit=" keys", unit_scale=True, file=sys.stderr, mininterval=0.5)

    def scan(self, *args, **kwargs):
        page = self.driver.scan(*args, **kwargs)
        self.bar.update(len(page))
        return page

    def __getattr__(self, name: str):
        return getattr(self.driver, name)

    def write(self, line: str) -> None:
        self.tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()


def cmd_copy(args: argparse.Namespace) -> int:
    """``zarrfs copy SOURCE DEST``: between folders and databases, key for key."""
    from zarrfs.daemon.control import size_text
    from zarrfs.tools.copy import CopyError, copy

    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    if args.resume:
        args.if_exists = "skip"
    try:
        source, dest = location(args.source), location(args.dest)
        done = copy(
            source,
            dest,
            if_exists=args.if_exists,
            dry_run=args.dry_run,
            progress=progress and not args.dry_run,
            validate=args.validate,
        )
    except (UsageError, MountFailure, CopyError, BackendError, OSError, ValueError) as exc:
        return fail(str(exc), status_of(exc))
    except KeyboardInterrupt:
        return fail(
            "copy interrupted: the keys copied so far stay; run the same command with --resume "
            "to copy the rest",
            130,
        )
    verb = "would copy" if args.dry_run else "copied"
    skipped = f", skipped {done.skipped} that were there already" if done.skipped else ""
    print(f"{verb} {done.keys} keys ({size_text(done.bytes)}){skipped}", file=sys.stderr)
    return 0


def cmd_consolidate(args: argparse.Namespace) -> int:
    """``zarrfs consolidate URL|FOLDER``: rebuild the stale consolidated documents."""
    from zarrfs.tools.consolidate import consolidate

    try:
        found, changed = consolidate(location(args.location))
    except (UsageError, MountFailure, BackendError, OSError, ValueError) as exc:
        return fail(str(exc), status_of(exc))
    print(f"{found} consolidated document(s), rebuilt {changed}", file=sys.stderr)
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    """``zarrfs reindex URL``: rebuild a Redis database's listing index from its keyspace (after
    another client, zarr-python 2's ``RedisStore`` say, added or removed keys). The open does
    not build a missing index itself: the rebuild runs here, with its progress on a terminal."""
    from zarrfs.backends.registry import driver_class, normalize_url
    from zarrfs.dbfiles import open_database
    from zarrfs.options import parse_options

    try:
        url = location(args.url)
        own = {"build_index": False} if driver_class(normalize_url(url)[0]).keeps_index else {}
        driver = open_database(url, parse_options([]), hint=False, **own)
    except (UsageError, MountFailure, BackendError, ValueError) as exc:
        return fail(str(exc), status_of(exc))
    with driver:
        if not driver.keeps_index:
            return fail(f"{args.url}: this database lists its keys directly and keeps no index", 2)
        bar = _Stages() if sys.stderr.isatty() else None
        try:
            count = driver.reindex(report=bar)
        except BackendError as exc:
            return fail(str(exc))
        finally:
            if bar is not None:
                bar.close()
    print(f"indexed {count} keys", file=sys.stderr)
    return 0


class _Stages:
    """tqdm bars on stderr, one per stage of a long pass (``reindex``'s scan of the keyspace,
    then its check of the index): called as ``(stage, count, total)``."""

    def __init__(self) -> None:
        self.bar = None
        self.stage = ""

    def __call__(self, stage: str, count: int, total: int | None) -> None:
        if stage != self.stage:
            from tqdm import tqdm

            self.close()
            self.stage = stage
            self.bar = tqdm(desc=stage, total=total, unit=" keys", unit_scale=True, file=sys.stderr,
                            mininterval=0.5)
        self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _commands_note() -> str:
    return f"the commands: {', '.join(COMMANDS)}"


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one line (exit status 2) that names the commands."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help; {_commands_note()})\n")


def unknown_command(word: str) -> str:
    """The line for a first word that is neither a command nor a database path."""
    import difflib

    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    guess = f"did you mean '{close[0]}'? " if close else ""
    return (
        f"unknown command '{word}': {guess}{_commands_note()} (to mount a database named "
        f"{word}: zarrfs mount ./{word} MOUNTPOINT)"
    )


def _with_command(argv: list[str]) -> list[str]:
    """``argv`` with ``mount`` in front when it is the fstab form ``URL MOUNTPOINT [-o OPTS]``:
    a first word that is a URL or a path (it has a ``/``, ``:`` or ``.``, or exists). Any other
    first word that is no command is a :class:`UsageError`."""
    if not argv or argv[0] in COMMANDS or argv[0].startswith("-"):
        return argv
    first = argv[0]
    if any(c in first for c in "/:.") or os.path.lexists(first):
        return ["mount", *argv]
    raise UsageError(unknown_command(first))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zarrfs``."""
    raw = argparse.RawDescriptionHelpFormatter
    epilog = URLS_HELP + "\n" + OPTIONS_HELP + "\n" + EXIT_HELP
    parser = _Parser(
        prog="zarrfs", usage=SYNOPSIS, description=DESCRIPTION, epilog=epilog, formatter_class=raw
    )
    # -v too: what ``zarrfs -v`` means to most who type it (zarrfs has no verbose flag).
    parser.add_argument("-V", "-v", "--version", action="version", version=f"zarrfs {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser, title="commands",
        prog="zarrfs",
    )

    mount = sub.add_parser(
        "mount", help="mount a database as a Zarr folder (in the background; -f: foreground)",
        description="Mount a database at MOUNTPOINT. Returns once the mount is ready, or fails "
        "with one line.", epilog=URLS_HELP + "\n" + OPTIONS_HELP + "\n" + EXIT_HELP, formatter_class=raw,
    )
    mount.add_argument("url", metavar="URL", help="database URL or path (see below)")
    mount.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing, empty folder (or -o nonempty)")
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
    umount.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?")
    umount.add_argument("-z", "--lazy", action="store_true",
                        help="detach now and return; the daemon finishes when no longer busy")
    umount.add_argument("-a", "--all", action="store_true",
                        help="every zarrfs mount this user may unmount (root: all of them)")
    umount.set_defaults(func=cmd_umount)

    status = sub.add_parser("status", help="list zarrfs mounts, or show one mount's live figures",
                            epilog=EXIT_HELP, formatter_class=raw)
    status.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)

    stats = sub.add_parser(
        "stats", help="a mount's live figures every second (--prometheus: once, for a scraper)",
        epilog=EXIT_HELP, formatter_class=raw,
    )
    stats.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?")
    stats.add_argument("--prometheus", action="store_true",
                       help="print the figures once as Prometheus text (without MOUNTPOINT: every mount)")
    stats.add_argument("-i", "--interval", type=float, default=1.0, metavar="SECONDS",
                       help="seconds between rows (default 1)")
    stats.add_argument("-n", "--count", type=int, metavar="N", help="stop after N rows")
    stats.set_defaults(func=cmd_stats)

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
        help="keys the destination has: overwrite them (default), keep them when they are whole "
        "(the same size; skip), or copy nothing (raise)",
    )
    copy.add_argument("--resume", action="store_true",
                      help="go on with an interrupted copy: --if-exists skip")
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
    (what mount.fuse3 runs for /etc/fstab) is ``zarrfs mount SOURCE MOUNTPOINT [-o OPTS]``.
    Whatever goes wrong is one line on stderr, never a traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(_with_command(argv))
        return args.func(args)
    except UsageError as exc:
        return fail(str(exc), 2)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (``zarrfs status | head -1``): stop quietly, as Python's
        # documentation advises, with nothing left for the interpreter to flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (MountFailure, BackendError) as exc:
        return fail(str(exc))
    except Exception as exc:  # a bug: still one line, and where to report it
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        at = f" at {os.path.basename(where.tb_frame.f_code.co_filename)}:{where.tb_lineno}" if where else ""
        return fail(f"unexpected {type(exc).__name__}{at}: {exc} (please report this)")


if __name__ == "__main__":
    raise SystemExit(main())

"""``zarrfs commit MOUNTPOINT -m MESSAGE``: what a mount of an Icechunk branch holds becomes a
commit of the branch, asked of the mount's daemon on its socket (``zarrfs.daemon.control``). Files
still open for writing join at their close, after this commit."""

from __future__ import annotations

import argparse
import os
import sys

from zarrfs.cli.helptext import EXIT_HELP
from zarrfs.cli.oneline import fail
from zarrfs.lines import one_line


def run(args: argparse.Namespace) -> int:
    """The command: 0 once committed (or nothing to commit), 1 with one line otherwise."""
    from zarrfs.daemon.control import NoAnswer, ask

    mountpoint = os.path.abspath(args.mountpoint)
    if not os.path.ismount(mountpoint):
        return fail(f"{mountpoint} is not a mountpoint")
    request = {"op": "commit", "message": args.message, "rebase": args.rebase, "branch": args.branch}
    try:
        answer = ask(mountpoint, request, timeout=600)
    except NoAnswer as exc:
        return fail(str(exc))
    if "error" in answer:
        return fail(answer["error"])
    aside = answer.get("kept_aside") or []
    if aside:
        names = ", ".join(aside[:5]) + (", ..." if len(aside) > 5 else "")
        said = f"zarrfs: not committed: {len(aside)} file(s) not Zarr v3 keys: {names}"
        print(one_line(said), file=sys.stderr)
    if answer.get("snapshot") is None:
        print(f"zarrfs: nothing to commit on {answer['branch']}", file=sys.stderr)
    else:
        print(answer["snapshot"])
        print(f"zarrfs: committed to {answer['branch']}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction, formatter_class: type) -> None:
    """Add ``commit`` to the subcommands of ``zarrfs``."""
    commit = sub.add_parser("commit", help="commit what a mount of an Icechunk branch holds",
                            epilog=EXIT_HELP, formatter_class=formatter_class)
    commit.add_argument("mountpoint", metavar="MOUNTPOINT")
    commit.add_argument("-m", "--message", required=True, help="the commit message")
    commit.add_argument("--rebase", action="store_true",
                        help="put the writes on top of commits made elsewhere meanwhile")
    commit.add_argument("--branch", metavar="NAME",
                        help="commit to a new branch NAME, made where the mount's session began")
    commit.set_defaults(func=run)

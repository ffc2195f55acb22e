"""``zarrfs(1)``, the manual page, generated from the command line's own parser and help texts
(so it lists what ``zarrfs --help`` lists, never more or less). ``python -m zarrfs.cli.manpage``
prints it in roff; ``scripts/setup.sh`` installs it."""

from __future__ import annotations

import argparse
import datetime
import sys

from zarrfs import __version__
from zarrfs.cli.helptext import DESCRIPTION, EXIT_HELP, OPTIONS_HELP, SYNOPSIS, URLS_HELP


def _roff(text: str) -> str:
    """``text`` safe in a roff line: backslashes, hyphens, and a leading dot or quote escaped."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def _block(text: str) -> list[str]:
    """Preformatted lines (the help texts keep their own layout)."""
    return [".nf", *(_roff(line) for line in text.rstrip("\n").splitlines()), ".fi"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser``, by name, in their order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _options(sub: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in sub._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings)
            if action.choices:
                names += " " + _roff("|".join(map(str, action.choices)))
            elif action.nargs != 0:
                names += f" \\fI{_roff(action.metavar or action.dest.upper())}\\fR"
        else:
            names = f"\\fI{_roff(action.metavar or action.dest)}\\fR"
        out += [".TP", names, _roff(action.help or "")]
    return out


def render(parser: argparse.ArgumentParser) -> str:
    """The manual page of ``parser`` (the ``zarrfs`` parser) in roff."""
    today = datetime.date.today().isoformat()
    lines = [f'.TH ZARRFS 1 "{today}" "zarrfs {__version__}" "User Commands"', ".SH NAME"]
    lines.append("zarrfs \\- " + _roff(DESCRIPTION[0].lower() + DESCRIPTION[1:]))
    synopsis = "\n".join(line.removeprefix("       ") for line in SYNOPSIS.splitlines())
    lines += [".SH SYNOPSIS", *_block(synopsis)]
    lines += [".SH DESCRIPTION", _roff(DESCRIPTION)]
    lines.append(
        "A mount runs in the background and returns once it is ready; every error is one line on "
        "standard error."
    )
    lines.append(".SH COMMANDS")
    helps = _command_help(parser)
    for name, sub in subcommands(parser).items():
        lines += [".SS " + _roff(f"zarrfs {name}"), _roff(helps.get(name, "")), *_options(sub)]
    lines += [".SH DATABASE URLS", *_block(URLS_HELP.split("\n", 1)[1])]
    lines += [".SH MOUNT OPTIONS", *_block(OPTIONS_HELP.split("\n", 1)[1])]
    exit_text, _, fstab = EXIT_HELP.partition("\n\n")
    lines += [".SH EXIT STATUS", *_block(exit_text.split("\n", 1)[1])]
    lines += [".SH FILES", *_block(fstab)]
    lines += [
        ".SH ENVIRONMENT",
        ".TP", "\\fBZARRFS_PASSWORD\\fR, \\fBREDISCLI_AUTH\\fR",
        "The password of a Redis server, when the URL gives none.",
        ".TP", "\\fBNOTIFY_SOCKET\\fR",
        "Set by systemd for a Type=notify service: the mount says READY=1 once it serves and "
        "STOPPING=1 when it stops.",
        ".SH SEE ALSO", "\\fBfusermount3\\fR(1), \\fBmount.fuse3\\fR(8), \\fBfstab\\fR(5), "
        "\\fBsystemd.mount\\fR(5)",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    from zarrfs.cli.main import build_parser

    sys.stdout.write(render(build_parser()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The README's command line is ``zarrfs --help``'s, and ``--help`` is the parser's: a command,
a flag, a mount option or a default that one of them lacks or states otherwise fails here."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from pathlib import Path

from zarrfs import options
from zarrfs.cli import helptext
from zarrfs.cli.main import build_parser
from zarrfs.cli.manpage import subcommands

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_holds_the_help_text_word_for_word():
    text = README.read_text(encoding="utf-8")
    assert helptext.README_BEGIN in text and helptext.README_END in text, (
        "README.md has no command-line reference block: put the two marker lines of "
        "zarrfs/cli/helptext.py in it, then run python -m zarrfs.cli.helptext README.md"
    )
    assert helptext.with_readme_block(text) == text, (
        "README.md's command-line reference differs from zarrfs --help: "
        "run python -m zarrfs.cli.helptext README.md"
    )


def test_the_synopsis_names_every_command_and_flag_of_the_parser():
    parser = build_parser()
    lines = helptext.SYNOPSIS.splitlines()
    for name, sub in subcommands(parser).items():
        start = next((i for i, line in enumerate(lines) if line.strip().startswith(f"zarrfs {name} ")), None)
        assert start is not None, f"zarrfs {name} is missing from the synopsis"
        usage = lines[start]
        for line in lines[start + 1:]:  # continuation lines of the same command
            if line.strip().startswith("zarrfs "):
                break
            usage += " " + line
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                assert any(re.search(rf"{re.escape(flag)}\b", usage) for flag in action.option_strings), (
                    f"zarrfs {name} {action.option_strings[-1]} is missing from the synopsis"
                )
            else:
                assert (action.metavar or action.dest) in usage, (name, action.metavar)


def _option_names() -> set[str]:
    """Every option word ``parse_options`` compares ``name`` (or ``item``) with, read from its
    source, plus the ignored and libfuse sets."""
    tree = ast.parse(inspect.getsource(options.parse_options))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "name":
            for right in node.comparators:
                values = right.elts if isinstance(right, ast.Tuple) else [right]
                names |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return names | set(options.IGNORED_OPTIONS) | set(options.LIBFUSE_OPTIONS) | {
        p.rstrip("=-") for p in options.IGNORED_PREFIXES
    }


def test_the_help_names_every_mount_option_the_parser_takes():
    words = set(re.findall(r"[a-z_]+", helptext.OPTIONS_HELP))
    missing = sorted(_option_names() - words)
    assert not missing, f"mount options zarrfs --help does not name: {missing}"


def _size(n: int) -> str:
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)


def test_the_help_gives_the_defaults_the_parser_uses():
    from zarrfs.backends.base import DEFAULT_TIMEOUT
    from zarrfs.fuse.workers import DEFAULT_WORKERS

    defaults = options.MountOptions()
    text = " ".join(helptext.OPTIONS_HELP.split())  # one line: defaults may follow a line break
    expected = {
        "cache_timeout": f"({options.FEED_CACHE:g} when the database has a change feed, "
        f"else {options.SHORT_CACHE:g})",
        "dir_cache_entries": f"({defaults.dir_cache_entries})",
        "spill": f"({_size(defaults.spill)};",
        "parts_above": f"({_size(defaults.parts_above)};",
        "spin": f"({defaults.spin:g};",
        "workers": f"({DEFAULT_WORKERS} on a database server",
        "timeout": f"({DEFAULT_TIMEOUT:g})",
        "readahead": f"({defaults.readahead};",
        "direct_above": f"({_size(defaults.direct_above)};",
        "snapshot_hold": f"({options.DEFAULT_SNAPSHOT_HOLD:g};",
    }
    for option, default in expected.items():
        at = text.index(f" {option}=")
        entry = text[at:at + 250]
        assert default in entry, f"-o {option}=: zarrfs --help should give the default {default}: {entry}"


def test_the_detailed_option_table_names_every_mount_option():
    text = (README.parent / "docs" / "guarantees.md").read_text(encoding="utf-8")
    table = text[text.index("## Mount options in detail"):]
    table = table[: table.index("\n## ", 1)]
    missing = sorted(_option_names() - set(re.findall(r"[a-z_]+", table)))
    assert not missing, f"docs/guarantees.md, 'Mount options in detail', does not name: {missing}"

"""How a command of the command line fails: one line on stderr, ``zarrfs: `` and what went
wrong and what to do, and the exit status (1; 2 for usage)."""

from __future__ import annotations

import sys

from zarrfs.lines import one_line
from zarrfs.usage import UsageError


def fail(message: str, status: int = 1) -> int:
    """Print ``message`` as the one line of a failure (a newline or another control character
    in a path or URL escaped); return ``status``."""
    print(f"zarrfs: {one_line(message)}", file=sys.stderr)
    return status


def status_of(exc: BaseException) -> int:
    """The exit status of a failure: 2 for usage, else 1."""
    return 2 if isinstance(exc, UsageError) else 1

"""One line of text for a person: a log line's message, a command's error. A file name or URL
may hold a newline, a tab or a terminal's escape sequence; written as they are, one line would
become several and an escape sequence would act on the terminal. So they are escaped as Python
writes them in a string (``\\n``, ``\\t``, ``\\x1b``). At the package's root, below the command
line and the daemon, with nothing to import."""

from __future__ import annotations

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})


def one_line(text: str) -> str:
    """``text`` with its control characters (C0, DEL, C1) escaped."""
    return text if text.isprintable() else text.translate(_ESCAPES)

"""The query options of a driver's URL, parsed once for every driver (built-in or third-party):
a file database's path and options, unknown options refused, booleans, sizes and times."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import BackendError


def parse_file_url(url: str) -> tuple[str, dict[str, str]]:
    """Return the absolute path and the query options of a file-database URL.

    ``scheme:///abs/path`` and ``scheme:////abs/path`` (SQLAlchemy's spelling) are both the
    absolute ``/abs/path``; ``scheme://rel/path`` is relative to the working directory."""
    parts = urlsplit(url)
    path = unquote(parts.netloc + parts.path)
    if not path:
        raise ValueError(f"{url!r} names no database path")
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    return os.path.abspath(os.path.expanduser(path)), options


def check_options(url: str, options: dict[str, str], known: set[str]) -> None:
    """Reject query options a driver does not know, so a typo is not silently ignored."""
    unknown = set(options) - known
    if unknown:
        raise BackendError(
            f"{url}: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
        )


def parse_bool(name: str, text: str) -> bool:
    """Parse a boolean query option (``1/0``, ``true/false``, ``yes/no``, ``on/off``)."""
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise BackendError(f"option {name}={text!r} is not a boolean")


def parse_size(name: str, text: str) -> int:
    """Parse a byte count option: an integer, optionally ``2**40`` or with a K/M/G/T suffix;
    0 or more, and at most 2**64 (``10**100000000`` would take the CLI minutes to work out)."""
    low = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if "**" in low:
            base, _, exp = low.partition("**")
            b, e = int(base), int(exp)
            size = b**e if 0 <= e <= 64 and 0 <= b <= 2**16 else -1
        else:
            factor = 1
            if low and low[-1] in "KMGT":
                factor = 1024 ** ("KMGT".index(low[-1]) + 1)
                low = low[:-1]
            size = int(low) * factor
    except ValueError:
        size = -1
    if not 0 <= size <= 2**64:
        raise BackendError(f"option {name}={text!r} is not a size in bytes (0 to 2**64)")
    return size


def parse_seconds(name: str, text: str) -> float:
    """Parse a time option: a finite number of seconds, 0 or more."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):  # nan compares false
        raise BackendError(f"option {name}={text!r} is not a number of seconds (0 or more)")
    return seconds

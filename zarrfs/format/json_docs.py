"""Reading metadata documents as JSON, the way Zarr clients read them.

Clients parse with Python's :mod:`json`, which accepts the non-standard ``NaN``/``Infinity``
literals; zarr-python 3 writes those in attributes. We accept them too (refusing would break
real writers) but flag them, because strict parsers (tensorstore, browsers) reject them.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import Problem, error, warning


class _Parsed:
    """Records whether the parser met a non-standard constant (NaN, Infinity, -Infinity)."""

    def __init__(self) -> None:
        self.constants: list[str] = []

    def constant(self, name: str) -> float:
        self.constants.append(name)
        return float(name.replace("Infinity", "inf"))


def load_json(key: str, value: bytes | str, rule_prefix: str = "json") -> tuple[Any, list[Problem]]:
    """Parse a metadata value; return ``(document, problems)``.

    The document is ``None`` when the bytes are not UTF-8 JSON (then ``problems`` holds the
    error). A document that is JSON but contains ``NaN``/``Infinity`` literals is returned with a
    warning.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, [error(key, f"{rule_prefix}.not-utf8", f"not UTF-8 text ({exc.reason})")]
    else:
        text = value
    seen = _Parsed()
    try:
        doc = json.loads(text, parse_constant=seen.constant)
    except ValueError as exc:
        return None, [error(key, f"{rule_prefix}.invalid", f"not valid JSON: {exc}")]
    problems = []
    if seen.constants:
        problems.append(
            warning(
                key,
                f"{rule_prefix}.nan-literal",
                f"non-standard JSON literal {seen.constants[0]} (strict readers refuse it)",
            )
        )
    return doc, problems


def parse_json_or_none(value: bytes | None) -> Any:
    """Parse ``value`` leniently, returning ``None`` when it is missing or not JSON.

    Used on *other* keys fetched through ``get``: their own validity is their own commit's
    business, so a broken neighbour only disables the cross-checks that need it.
    """
    if value is None:
        return None
    try:
        return json.loads(bytes(value).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def short(obj: Any, limit: int = 80) -> str:
    """Render a JSON value compactly for a problem message, cut at ``limit`` characters."""
    try:
        text = json.dumps(obj, allow_nan=True, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_int(x: Any) -> bool:
    """True for a JSON integer; ``bool`` is excluded because ``True`` is an ``int`` in Python."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """True for a JSON number (integer or float), not a bool."""
    return isinstance(x, int | float) and not isinstance(x, bool)

"""The v3 "extension definition": a short-hand name or ``{name, configuration, must_understand}``.

Codecs, chunk grids, chunk key encodings, storage transformers and data types all use it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .json_docs import short


class Extension(NamedTuple):
    """One parsed extension object. ``configuration`` is ``{}`` when absent."""

    name: str
    configuration: dict[str, Any]
    must_understand: bool
    extra_keys: tuple[str, ...]


def parse_extension(obj: Any) -> Extension:
    """Parse an extension value; raise ``ValueError`` with a readable reason if malformed."""
    if isinstance(obj, str):
        return Extension(obj, {}, True, ())
    if not isinstance(obj, dict):
        raise ValueError(f"{short(obj)} is neither a name nor an object with a 'name'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{short(obj)} has no string 'name'")
    config = obj.get("configuration", {})
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError(f"{name}: 'configuration' must be an object, got {short(config)}")
    mu = obj.get("must_understand", True)
    if not isinstance(mu, bool):
        raise ValueError(f"{name}: 'must_understand' must be true or false, got {short(mu)}")
    extra = tuple(sorted(set(obj) - {"name", "configuration", "must_understand"}))
    return Extension(name, config, mu, extra)


def is_optional_extension(obj: Any) -> bool:
    """True for an object explicitly marked ``"must_understand": false`` (safe to ignore)."""
    return isinstance(obj, dict) and obj.get("must_understand") is False

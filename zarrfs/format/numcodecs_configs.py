"""Checking and building numcodecs codecs from their JSON configuration.

The v2 spec names codecs by numcodecs ``id``; v3 arrays reach the same codecs through the
``numcodecs.<id>`` names and the core ``gzip``/``zstd``/``blosc`` codecs.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numcodecs
from numcodecs.abc import Codec

# Compressors that take plain bytes and are cheap to set up: one tiny round trip catches
# configurations numcodecs accepts at construction but fails on at first use (a blosc
# ``cname`` it was not built with, a zlib level of 42). lzma is left out on purpose: its high
# presets allocate hundreds of MiB just to start.
_PROBED = frozenset({"blosc", "zlib", "gzip", "bz2", "zstd", "lz4"})
_PROBE = bytes(range(64))


def make_codec(config: dict[str, Any]) -> Codec:
    """Instantiate a numcodecs codec from a config with an ``id``; numcodecs errors propagate."""
    # get_codec pops "id" from the dict it is given in some numcodecs versions: pass a copy.
    return numcodecs.get_codec(dict(config))


@functools.lru_cache(maxsize=1024)
def _check_cached(config_json: str) -> str | None:
    config = json.loads(config_json)
    try:
        codec = make_codec(config)
    except Exception as exc:  # numcodecs raises anything from KeyError to its own classes
        return f"numcodecs cannot build {config_json}: {type(exc).__name__}: {exc}"
    if config["id"] in _PROBED:
        try:
            if bytes(codec.decode(codec.encode(_PROBE))) != _PROBE:
                return f"{config_json} does not round-trip bytes"
        except Exception as exc:
            return f"{config_json} fails on use: {type(exc).__name__}: {exc}"
    return None


def check_codec_config(config: Any) -> str | None:
    """Return why ``config`` is not a usable numcodecs configuration, or ``None`` if it is.

    ``config`` must be an object with a string ``id`` that numcodecs knows, and the other members
    must be arguments the codec accepts. Results are cached on the canonical JSON, since the same
    few configurations repeat across thousands of arrays.
    """
    if not isinstance(config, dict):
        return f"{json.dumps(config)[:80]} is not an object"
    if not isinstance(config.get("id"), str):
        return "codec object has no string 'id'"
    try:
        key = json.dumps(config, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):
        return "codec configuration is not JSON"
    return _check_cached(key)

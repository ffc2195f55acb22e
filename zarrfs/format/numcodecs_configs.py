"""Checking and building numcodecs codecs from their JSON configuration.

The v2 spec names codecs by numcodecs ``id``; v3 arrays reach the same codecs through the
``numcodecs.<id>`` names and the core ``gzip``/``zstd``/``blosc`` codecs. numcodecs (and numpy
with it) is imported at the first codec built, not with this module: a v3 array of core codecs,
and a v2 array of the common compressors' usual settings (:func:`known_good`), are checked
without it, and that import is a mount's first Zarr commit's largest cost
(docs/performance.md, "A fresh mount's first Zarr metadata: numpy's import").
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .json_docs import is_int

if TYPE_CHECKING:
    from numcodecs.abc import Codec

# Compressors that take plain bytes and are cheap to set up: one tiny round trip catches
# configurations numcodecs accepts at construction but fails on at first use (a blosc
# ``cname`` it was not built with, a zlib level of 42). lzma is left out on purpose: its high
# presets allocate hundreds of MiB just to start.
_PROBED = frozenset({"blosc", "zlib", "gzip", "bz2", "zstd", "lz4"})
_PROBE = bytes(range(64))


def make_codec(config: dict[str, Any]) -> Codec:
    """Instantiate a numcodecs codec from a config with an ``id``; numcodecs errors propagate."""
    import numcodecs

    # get_codec pops "id" from the dict it is given in some numcodecs versions: pass a copy.
    return numcodecs.get_codec(dict(config))


def _is_unknown(exc: Exception) -> bool:
    try:  # numcodecs >= 0.13
        from numcodecs.errors import UnknownCodecError
    except ImportError:  # pragma: no cover - older numcodecs raised a bare ValueError
        UnknownCodecError = None
    if UnknownCodecError is not None and isinstance(exc, UnknownCodecError):
        return True
    return isinstance(exc, ValueError) and "codec not available" in str(exc)


# What every numcodecs this project takes (0.12 on) builds and round-trips, by codec: the
# arguments its constructor takes and a check of each value. A configuration within them is
# passed without building its codec (a mount's first v2 array then checks without importing
# numcodecs and NumPy); any other goes to numcodecs for the verdict. Blosc's snappy, which
# builds may leave out, bz2, which a Python may lack, and Zstd's checksum (numcodecs 0.13)
# are left to it.
_LEVEL_0_9 = lambda v: is_int(v) and 0 <= v <= 9  # noqa: E731
_KNOWN_GOOD: dict[str, dict[str, Callable[[Any], bool]]] = {
    "blosc": {
        "cname": lambda v: v in ("blosclz", "lz4", "lz4hc", "zlib", "zstd"),
        "clevel": _LEVEL_0_9,
        "shuffle": lambda v: is_int(v) and -1 <= v <= 2,
        "blocksize": lambda v: is_int(v) and 0 <= v < 2**31,
    },
    "zstd": {"level": lambda v: is_int(v) and 0 <= v <= 22},
    "zlib": {"level": _LEVEL_0_9},
    "gzip": {"level": _LEVEL_0_9},
    "lz4": {"acceleration": lambda v: is_int(v) and 1 <= v <= 65537},
}


def known_good(config: dict[str, Any]) -> bool:
    """Whether ``config`` (with a string ``id``) is one every numcodecs builds and round-trips
    (:data:`_KNOWN_GOOD`): no need to build it to know."""
    checks = _KNOWN_GOOD.get(config["id"])
    if checks is None:
        return False
    for name, value in config.items():
        if name != "id" and (name not in checks or not checks[name](value)):
            return False
    return True


@functools.lru_cache(maxsize=1024)
def _check_cached(config_json: str) -> tuple[str, str] | None:
    config = json.loads(config_json)
    try:
        codec = make_codec(config)
    except Exception as exc:  # numcodecs raises anything from KeyError to its own classes
        if _is_unknown(exc):
            # Not installed here (zfpy, pcodec, imagecodecs' codecs...) is not the writer's
            # fault: its readers may have the codec. Flag it, never refuse it.
            return "warning", f"codec {config['id']!r} is not available here: it cannot be checked or decoded"
        return "error", f"numcodecs cannot build {config_json}: {type(exc).__name__}: {exc}"
    if config["id"] in _PROBED:
        try:
            if bytes(codec.decode(codec.encode(_PROBE))) != _PROBE:
                return "error", f"{config_json} does not round-trip bytes"
        except Exception as exc:
            return "error", f"{config_json} fails on use: {type(exc).__name__}: {exc}"
    return None


def check_codec_config(config: Any) -> tuple[str, str] | None:
    """Say what is wrong with a numcodecs configuration: ``None``, or ``(severity, message)``.

    Errors: not an object, no string ``id``, arguments the codec refuses, a compressor that
    fails a tiny round trip. A codec numcodecs does not know *here* is only a warning. Results
    are cached on the canonical JSON, since the same few configurations repeat across arrays.
    """
    if not isinstance(config, dict):
        return "error", f"{json.dumps(config)[:80]} is not an object"
    if not isinstance(config.get("id"), str):
        return "error", "codec object has no string 'id'"
    if known_good(config):
        return None
    try:
        key = json.dumps(config, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):
        return "error", "codec configuration is not JSON"
    return _check_cached(key)

"""Chunk keys: the grid of an array and the key of each chunk in it.

Encodings: ``"v2"`` (zarr v1/v2 and the v3 ``v2`` encoding) writes ``0.0`` or ``0/0``, and
``0`` for a zero-dimensional array; ``"default"`` (v3) writes ``c/0/0`` or ``c.0.0``, and
``c`` for a zero-dimensional array. Integers are decimal without sign or leading zeros, as every
client formats them: ``01`` would never be read back, so it is not a chunk key.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .json_docs import is_int
from .v3_extensions import is_optional_extension, parse_extension


def _canonical(index: str) -> bool:
    """Whether ``index`` is a chunk index as every client writes it: ASCII decimal digits,
    without a leading zero (a regular expression's ``$`` would take a trailing newline too)."""
    return index.isdigit() and index.isascii() and (index[0] != "0" or index == "0")


class ChunkKeyError(ValueError):
    """A key that is not a chunk key of an array; ``rule`` is the rule suffix."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class ChunkGrid:
    """The regular chunk grid of one array and how its chunk keys are spelled."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    separator: str
    encoding: str  # "v2" or "default"
    #: Number of chunks along each dimension (0 along an empty dimension): worked out once,
    #: as every chunk key parsed (an open's read-ahead, a commit's check) needs it.
    grid_shape: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grid = tuple(math.ceil(s / c) if c else 0 for s, c in zip(self.shape, self.chunks, strict=True))
        object.__setattr__(self, "grid_shape", grid)

    def key(self, coords: tuple[int, ...]) -> str:
        """The key of the chunk at ``coords``, relative to the array's folder."""
        body = self.separator.join(str(i) for i in coords)
        if self.encoding == "default":
            return f"c{self.separator}{body}" if coords else "c"
        return body if coords else "0"

    def parse(self, rel: str) -> tuple[int, ...]:
        """Coordinates of the chunk key ``rel`` (relative to the array's folder).

        Raises :class:`ChunkKeyError` explaining why ``rel`` is not a key of this grid.
        """
        ndim = len(self.shape)
        sep = self.separator
        if self.encoding == "default":
            if rel == "c" and ndim == 0:
                return ()
            if not rel.startswith("c" + sep) or ndim == 0:
                want = "'c'" if ndim == 0 else f"'c{sep}' followed by {ndim} indices"
                raise ChunkKeyError("format", f"{rel!r} is not a chunk key of this array (expected {want})")
            body = rel[2:]
        else:
            if ndim == 0:
                if rel == "0":
                    return ()
                raise ChunkKeyError(
                    "format", f"{rel!r}: a zero-dimensional array has the single chunk key '0'"
                )
            body = rel
        other = "/" if sep == "." else "."
        if other in body and all(_canonical(p) for p in re.split(r"[./]", body)):
            raise ChunkKeyError("separator", f"{rel!r} uses {other!r} but the array's separator is {sep!r}")
        parts = body.split(sep)
        if not all(_canonical(p) for p in parts):
            raise ChunkKeyError(
                "not-integer", f"{rel!r} is not made of decimal chunk indices joined by {sep!r}"
            )
        if len(parts) != ndim:
            raise ChunkKeyError(
                "dimensions", f"{rel!r} has {len(parts)} indices but the array has {ndim} dimensions"
            )
        coords = tuple(int(p) for p in parts)
        grid = self.grid_shape
        for i, (c, g) in enumerate(zip(coords, grid, strict=True)):
            if c >= g:
                raise ChunkKeyError(
                    "out-of-grid",
                    f"{rel!r}: index {c} along dimension {i} is outside the grid of {g} chunk(s)",
                )
        return coords


def _int_list(x: Any, minimum: int) -> tuple[int, ...] | None:
    if isinstance(x, list) and all(is_int(d) and d >= minimum for d in x):
        return tuple(x)
    return None


def grid_from_v2(doc: Any) -> ChunkGrid | None:
    """The grid of a ``.zarray`` (or v1 ``meta``) document, or ``None`` if it has none usable."""
    if not isinstance(doc, dict):
        return None
    shape, chunks = _int_list(doc.get("shape"), 0), _int_list(doc.get("chunks"), 1)
    sep = doc.get("dimension_separator") or "."
    if shape is None or chunks is None or len(shape) != len(chunks) or sep not in (".", "/"):
        return None
    return ChunkGrid(shape, chunks, sep, "v2")


def grid_from_v3(doc: Any) -> ChunkGrid | None:
    """The grid of a v3 array ``zarr.json``, or ``None`` when it cannot be known.

    Unknown chunk grids or key encodings, and storage transformers that must be understood
    (they may move keys), all make the layout unknowable: then no key is judged.
    """
    if not isinstance(doc, dict) or doc.get("node_type") != "array":
        return None
    shape = _int_list(doc.get("shape"), 0)
    try:
        grid = parse_extension(doc.get("chunk_grid"))
        enc = parse_extension(doc.get("chunk_key_encoding"))
    except ValueError:
        return None
    chunks = _int_list(grid.configuration.get("chunk_shape"), 0)
    if shape is None or grid.name != "regular" or chunks is None or len(chunks) != len(shape):
        return None
    transformers = doc.get("storage_transformers") or []
    if not isinstance(transformers, list) or not all(is_optional_extension(t) for t in transformers):
        return None
    if enc.name == "default":
        sep = enc.configuration.get("separator", "/")
    elif enc.name == "v2":
        sep = enc.configuration.get("separator", ".")
    else:
        return None
    if sep not in (".", "/"):
        return None
    return ChunkGrid(shape, chunks, sep, enc.name)

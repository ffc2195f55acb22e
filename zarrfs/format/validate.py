"""Validation of one key when it is committed: metadata documents and chunk keys.

This is what the filesystem calls before a write becomes visible. Every function returns a
list of :class:`Problem`; the write must be refused when any has severity ``"error"``
(:func:`zarrfs.format.errors.raise_on_error` does that).

``get`` is only ever asked for metadata keys (``zarr.json``, ``.zarray``, ``.zgroup``, the root
``meta``), mostly ones that do not exist: a caller on a hot path should cache its answers,
``None`` included, and drop them when a metadata key changes.
"""

from __future__ import annotations

from typing import Any

from .chunk_keys import ChunkGrid, ChunkKeyError, grid_from_v2, grid_from_v3
from .errors import Problem, Report, error, warning
from .json_docs import load_json, parse_json_or_none
from .keys import (
    V1_ATTRS,
    V1_META,
    ZARR_JSON,
    ZARRAY,
    ZATTRS,
    ZGROUP,
    ZMETADATA,
    is_metadata_key,
    is_temporary,
    join_key,
    relative_to,
    split_key,
)
from .nodes import ARRAY, GetMany, Getter, Node, enclosing_node

_RULE_PREFIX = {
    ZARRAY: "zarray",
    ZGROUP: "zgroup",
    ZATTRS: "zattrs",
    ZMETADATA: "zmetadata",
    ZARR_JSON: "zarr.json",
    V1_META: "meta",
    V1_ATTRS: "attrs",
}


def _root_is_v2_or_v3(get: Getter) -> bool:
    return any(get(k) is not None for k in (ZARR_JSON, ZARRAY, ZGROUP))


def _hierarchy_warnings(key: str, prefix: str, name: str, get: Getter) -> list[Problem]:
    """Warnings for nodes in odd places. Not errors: overwrite flows and tools that do not
    check (tensorstore) pass through these states, and their data stays readable."""
    problems = []
    sibling = {ZARRAY: ZGROUP, ZGROUP: ZARRAY}.get(name)
    if sibling and get(join_key(prefix, sibling)) is not None:
        problems.append(
            warning(
                key, "hierarchy.array-and-group", f"folder has both .zarray and .zgroup ({prefix or '/'})"
            )
        )
    if prefix:
        outer = enclosing_node(prefix, get)
        if outer is not None and outer.kind == ARRAY:
            problems.append(
                warning(
                    key, "hierarchy.node-inside-array", f"a node inside the array at {outer.prefix or '/'}"
                )
            )
    return problems


def validate_metadata(key: str, value: bytes, get: Getter) -> list[Problem]:
    """Validate the metadata document ``value`` about to be stored under ``key``.

    ``key`` must satisfy :func:`is_metadata_key`. ``get`` reads other keys (``None`` when
    absent): a ``.zattrs`` is checked against the ``.zarray`` beside it, and a root ``meta`` is
    treated as v1 only when the root is not a v2/v3 node.
    """
    prefix, name = split_key(key)
    if name in (V1_META, V1_ATTRS):
        if prefix or _root_is_v2_or_v3(get):
            return []  # an ordinary file that happens to be called "meta"
    rule_prefix = _RULE_PREFIX.get(name)
    if rule_prefix is None:
        return []
    doc, problems = load_json(key, value, rule_prefix)
    if doc is None:
        return problems
    # The document checkers load with the first metadata document, so that a mount that stores
    # plain files never imports them; numpy and numcodecs only with the first type or codec
    # that needs them (docs/performance.md, "A fresh mount's first Zarr metadata").
    from .v1_metadata import check_v1_attrs, check_v1_meta
    from .v2_metadata import check_zarray, check_zattrs, check_zgroup, check_zmetadata, zarray_ndim
    from .v3_metadata import check_zarr_json

    r = Report(key, rule_prefix, problems)
    if name == ZARRAY:
        check_zarray(doc, r)
    elif name == ZGROUP:
        check_zgroup(doc, r)
    elif name == ZATTRS:
        check_zattrs(doc, r, zarray_ndim(parse_json_or_none(get(join_key(prefix, ZARRAY)))))
    elif name == ZMETADATA:
        check_zmetadata(doc, r)
    elif name == ZARR_JSON:
        check_zarr_json(doc, r)
    elif name == V1_META:
        check_v1_meta(doc, r)
    elif name == V1_ATTRS:
        check_v1_attrs(doc, r)
    if name in (ZARRAY, ZGROUP, ZARR_JSON):
        problems.extend(_hierarchy_warnings(key, prefix, name, get))
    return problems


#: The chunk grid of each array's current document (nodes are shared while their bytes are
#: unchanged, see :mod:`zarrfs.format.nodes`, so the document's identity says it is current).
_grids: dict[str, tuple[Any, ChunkGrid | None]] = {}
_GRIDS_LIMIT = 256


def _grid(node: Node) -> ChunkGrid | None:
    cached = _grids.get(node.metadata_key)
    if cached is not None and cached[0] is node.doc:
        return cached[1]
    grid = grid_from_v3(node.doc) if node.zarr_format == 3 else grid_from_v2(node.doc)
    if len(_grids) >= _GRIDS_LIMIT:
        _grids.clear()
    _grids[node.metadata_key] = (node.doc, grid)
    return grid


def validate_data_key(key: str, get: Getter, get_many: GetMany | None = None) -> list[Problem]:
    """Validate a non-metadata key about to be stored: inside an array it must be a chunk key.

    The enclosing array is the innermost node above ``key`` (found through ``get``). Keys
    outside arrays, temporary files, names reserved by v3 for extensions (``__*``) and arrays
    whose key layout cannot be known (unknown grid or encoding) are not judged. ``get_many``
    (optional) reads several keys at once: see :func:`zarrfs.format.nodes.enclosing_node`.
    """
    if not is_data_key_judged(key):
        return []
    return chunk_key_problems(key, enclosing_node(key, get, get_many))


def is_data_key_judged(key: str) -> bool:
    """Whether :func:`validate_data_key` judges ``key`` at all (metadata and temporary files
    are not data keys it looks at)."""
    return not (is_metadata_key(key) or is_temporary(key))


def chunk_key_problems(key: str, node: Node | None) -> list[Problem]:
    """:func:`validate_data_key` of ``key`` whose innermost enclosing node is ``node`` (None:
    it is in no Zarr node)."""
    if node is None or node.kind != ARRAY:
        return []
    rel = relative_to(key, node.prefix)
    if rel is None:
        return []
    if node.zarr_format == 3 and rel.split("/", 1)[0].startswith("__"):
        return []
    grid = _grid(node)
    if grid is None:
        return []
    try:
        grid.parse(rel)
    except ChunkKeyError as exc:
        where = node.prefix or "/"
        return [error(key, f"chunk-key.{exc.rule}", f"{exc} (array at {where})")]
    return []

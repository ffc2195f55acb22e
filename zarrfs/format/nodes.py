"""Finding the Zarr node (array or group) at a folder, or the one enclosing a key.

Everything is read through ``get(key) -> bytes | None``, so the caller decides how keys are
fetched and cached. A folder is a node when it holds ``zarr.json`` (v3), ``.zarray`` or
``.zgroup`` (v2), or, at the store root only, a v1 ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .json_docs import parse_json_or_none
from .keys import V1_META, ZARR_JSON, ZARRAY, ZGROUP, ancestors, join_key, split_key

Getter = Callable[[str], "bytes | None"]
GetMany = Callable[[list[str]], "list[bytes | None]"]

ARRAY = "array"
GROUP = "group"
UNKNOWN = "unknown"


class Node(NamedTuple):
    """A node found in the store: its folder ``prefix`` (``""`` for the root), ``kind``
    (``"array"``, ``"group"`` or ``"unknown"`` for unreadable metadata), ``zarr_format`` and
    the parsed metadata document ``doc`` stored under ``metadata_key``."""

    prefix: str
    kind: str
    zarr_format: int
    doc: Any
    metadata_key: str


#: Nodes already built, by metadata key and document bytes. Every chunk stored through the
#: mount is validated against its array's metadata, read in the chunk's own transaction; the
#: bytes are compared, so only the JSON parsing is saved (the largest part of validating a
#: chunk). Documents are shared: nothing may change a node's ``doc`` in place.
_built: dict[tuple[str, bytes], Node] = {}
_BUILT_LIMIT = 256


def _node(prefix: str, key: str, raw: Any) -> Node:
    memo = (key, bytes(raw))
    node = _built.get(memo)
    if node is None:
        node = _parse_node(prefix, key, raw)
        if len(_built) >= _BUILT_LIMIT:
            _built.clear()
        _built[memo] = node
    return node


def _parse_node(prefix: str, key: str, raw: Any) -> Node:
    doc = parse_json_or_none(raw)
    name = key.rpartition("/")[2]
    if name == ZARR_JSON:
        kind = doc.get("node_type") if isinstance(doc, dict) else None
        return Node(prefix, kind if kind in (ARRAY, GROUP) else UNKNOWN, 3, doc, key)
    if name == ZARRAY:
        return Node(prefix, ARRAY if isinstance(doc, dict) else UNKNOWN, 2, doc, key)
    return Node(prefix, GROUP, 2, doc, key)


def node_at(prefix: str, get: Getter) -> Node | None:
    """The node whose metadata lives in folder ``prefix``, or ``None`` for a plain folder.

    v3 is looked up first, as zarr-python 3 does when the format is not given.
    """
    for name in (ZARR_JSON, ZARRAY, ZGROUP):
        key = join_key(prefix, name)
        raw = get(key)
        if raw is not None:
            return _node(prefix, key, raw)
    if not prefix:
        doc = parse_json_or_none(get(V1_META))
        if isinstance(doc, dict) and doc.get("zarr_format") == 1:
            return Node("", ARRAY, 1, doc, V1_META)
    return None


def candidate_keys(prefix: str) -> list[str]:
    """The metadata keys :func:`node_at` may read for folder ``prefix``, in its order."""
    keys = [join_key(prefix, name) for name in (ZARR_JSON, ZARRAY, ZGROUP)]
    return keys if prefix else [*keys, V1_META]


def enclosing_node(key: str, get: Getter, get_many: GetMany | None = None) -> Node | None:
    """The innermost node in a folder above ``key`` (its own folder first), or ``None``.

    The walk stops at the first node found: nothing in a valid hierarchy sits above an array
    inside a group, so keys under a group never cost a walk to the root. With ``get_many``
    (``keys -> values``, same order) every candidate key of every ancestor is read in one call,
    which on a remote database is one round trip instead of up to three per folder level.
    """
    prefixes = ancestors(split_key(key)[0])
    if get_many is not None:
        keys = [k for p in prefixes for k in candidate_keys(p)]
        get = dict(zip(keys, get_many(keys), strict=True)).get
    for prefix in prefixes:
        node = node_at(prefix, get)
        if node is not None:
            return node
    return None


def enclosing_array(key: str, get: Getter) -> Node | None:
    """The array whose folder contains ``key`` (at any depth), or ``None``."""
    node = enclosing_node(key, get)
    return node if node is not None and node.kind == ARRAY else None

"""Consolidated documents rebuilt from the hierarchy they describe.

A consolidated document (a v2 ``.zmetadata``, the ``consolidated_metadata`` of a v3
``zarr.json``) is a copy of the metadata below its folder, and a copy can go stale: written by
a mount with ``consolidate=off``, by a program that bypassed the mount, or by a client that
wrote it back from an outdated copy of its own (zarr-python 3 rewrites a group's
``zarr.json``, consolidated map included, when it changes the group's attributes). This module
says what the document should hold, from the metadata documents actually stored, and whether
the stored one does; the format hooks, ``zarrfs check`` and ``zarrfs consolidate`` use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .consolidated import (
    build_consolidated,
    build_consolidated_v3,
    dumps_consolidated,
    dumps_zarr_json,
    is_consolidated_key,
)
from .json_docs import parse_json_or_none
from .keys import ZARR_JSON, ZMETADATA, split_key

Getter = Callable[[str], "bytes | None"]


def is_document_key(key: str) -> bool:
    """Whether ``key`` may hold a consolidated document (``.zmetadata`` or a ``zarr.json``)."""
    return split_key(key)[1] in (ZMETADATA, ZARR_JSON)


def described(doc_key: str, key: str) -> bool:
    """Whether ``key`` is a metadata document that the document at ``doc_key`` consolidates."""
    folder, name = split_key(doc_key)
    under = folder + "/" if folder else ""
    if not key.startswith(under) or key == doc_key:
        return False
    return is_consolidated_key(key) if name == ZMETADATA else split_key(key)[1] == ZARR_JSON


def rebuilt(doc_key: str, raw: bytes | None, keys: Iterable[str], get: Getter) -> bytes | None:
    """The document at ``doc_key`` as the metadata below its folder says it should be, or
    ``None`` when ``raw`` holds no consolidated document (a ``zarr.json`` without a
    ``consolidated_metadata`` map). ``keys`` are the keys below the folder (others are
    ignored); ``get`` reads a value."""
    folder, name = split_key(doc_key)
    under = folder + "/" if folder else ""
    items = [
        (k[len(under) :], value)
        for k in keys
        if described(doc_key, k) and (value := get(k)) is not None
    ]
    if name == ZMETADATA:
        return dumps_consolidated(build_consolidated(items))
    doc = parse_json_or_none(raw) if raw is not None else None
    if not isinstance(doc, dict) or not isinstance(doc.get("consolidated_metadata"), dict):
        return None
    doc = dict(doc)
    doc["consolidated_metadata"] = build_consolidated_v3(items)
    return dumps_zarr_json(doc)


def is_stale(doc_key: str, raw: bytes | None, keys: Iterable[str], get: Getter, ahead: bool = False) -> bool:
    """Whether the consolidated document ``raw`` at ``doc_key`` differs from the metadata
    stored below its folder (by the rules of ``zarrfs check``; ``keys`` as for :func:`rebuilt`).
    A document that is not JSON is validation's business, not stale. With ``ahead``, entries
    of documents not stored yet are not stale (a hierarchy being copied in: ``cp -a`` and
    ``rsync -a`` write a folder's ``.zmetadata`` before the folders below it)."""
    from .check import consolidated_findings

    doc = parse_json_or_none(raw) if raw is not None else None
    if not isinstance(doc, dict):
        return False
    documents: dict[str, Any] = {doc_key: doc}
    for k in keys:
        if described(doc_key, k):
            parsed = parse_json_or_none(get(k))
            if parsed is not None:
                documents[k] = parsed
    return any(p.key == doc_key for p in consolidated_findings(documents, ahead))


__all__ = ["described", "is_document_key", "is_stale", "rebuilt"]

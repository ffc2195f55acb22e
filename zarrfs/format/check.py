"""Checking a whole database: every key, every metadata document, every consolidated copy.

This backs ``zarrfs check URL``: the CLI streams ``(key, value)`` pairs in key order and gives a
``get`` for random access; problems come back as they are found, then the consolidated
metadata comparisons once every key has been seen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from .consolidated import is_consolidated_key, v3_entry
from .errors import Problem, error, warning
from .json_docs import parse_json_or_none
from .keys import ZARR_JSON, ZGROUP, ZMETADATA, is_metadata_key, is_temporary, split_key, validate_name
from .nodes import Getter
from .validate import validate_data_key, validate_metadata

# Past this many differences per consolidated document, one summary line says how many more.
MAX_REPORTED_PER_DOCUMENT = 50
# The get() memo holds metadata values only; it is dropped when it grows past this.
_MEMO_LIMIT = 200_000


def _memoized(get: Getter) -> Getter:
    """Cache ``get`` for metadata keys: chunk checks look the same few documents up for every
    chunk of an array, and the store does not change during a check."""
    memo: dict[str, bytes | None] = {}

    def cached(key: str) -> bytes | None:
        if not is_metadata_key(key):
            return get(key)
        try:
            return memo[key]
        except KeyError:
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            value = memo[key] = get(key)
            return value

    return cached


def _canonical(doc: Any) -> str:
    # Compare as canonical JSON text: NaN never equals itself as a float.
    return json.dumps(doc, sort_keys=True, allow_nan=True)


def _compare(
    doc_key: str, rule: str, consolidated: dict[str, Any], actual: dict[str, Any], ahead: bool = False
) -> Iterator[Problem]:
    """Errors for entries of a consolidated map that differ from the documents in the store
    (a reader that trusts the document sees other metadata than the store holds); with
    ``ahead``, entries whose documents are not stored (yet) are not errors."""
    found = []
    for k in sorted(set(consolidated) | set(actual)):
        if k not in actual:
            if not ahead:
                found.append(f"entry {k!r} has no document in the store")
        elif k not in consolidated:
            found.append(f"{k!r} is missing from it")
        elif _canonical(consolidated[k]) != _canonical(actual[k]):
            found.append(f"entry {k!r} differs from the stored document")
    for message in found[:MAX_REPORTED_PER_DOCUMENT]:
        yield error(doc_key, rule, f"consolidated metadata is stale: {message}")
    if len(found) > MAX_REPORTED_PER_DOCUMENT:
        yield error(doc_key, rule, f"... and {len(found) - MAX_REPORTED_PER_DOCUMENT} more stale entries")


def _v2_entry(key: str, doc: Any) -> Any:
    # zarr-python 3 adds a consolidated_metadata member to .zgroup entries; only zarr_format
    # is meaningful in a .zgroup.
    if split_key(key)[1] == ZGROUP and isinstance(doc, dict):
        return {"zarr_format": doc.get("zarr_format")}
    return doc


def consolidated_findings(documents: dict[str, Any], ahead: bool = False) -> Iterator[Problem]:
    """Compare every consolidated document against the metadata documents seen (``ahead``:
    see :func:`_compare`)."""
    for key, doc in documents.items():
        prefix, name = split_key(key)
        under = prefix + "/" if prefix else ""
        if name == ZMETADATA and isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
            stored = {k: _v2_entry(k, v) for k, v in doc["metadata"].items()}
            actual = {
                k[len(under) :]: _v2_entry(k, v)
                for k, v in documents.items()
                if k.startswith(under) and is_consolidated_key(k)
            }
            yield from _compare(key, "zmetadata.stale", stored, actual, ahead)
        elif name == ZARR_JSON and isinstance(doc, dict):
            cm = doc.get("consolidated_metadata")
            if not isinstance(cm, dict) or not isinstance(cm.get("metadata"), dict):
                continue
            actual = {}
            for k, v in documents.items():
                p, n = split_key(k)
                if n == ZARR_JSON and p.startswith(under) and p != prefix:
                    actual[p[len(under) :]] = v3_entry(v)
            stored = dict(cm["metadata"])
            # Stand-ins for groups without their own zarr.json are not stale.
            for path in set(stored) - set(actual):
                if any(a.startswith(path + "/") for a in actual) and stored[path] == v3_entry(
                    {"attributes": {}, "zarr_format": 3, "node_type": "group"}
                ):
                    del stored[path]
            yield from _compare(key, "zarr.json.consolidated-stale", stored, actual, ahead)


def check_items(items: Iterable[tuple[str, bytes | None]], get: Getter) -> Iterator[Problem]:
    """Validate every key of a store: names, metadata documents, chunk keys, leftovers.

    ``items`` yields ``(key, value)`` for every key; values are read for metadata keys only, so
    the rest may come as ``None``. ``get`` reads any key. Yields errors and warnings as
    found, then errors for consolidated metadata that no longer matches the documents.
    """
    get = _memoized(get)
    documents: dict[str, Any] = {}
    for key, value in items:
        yield from validate_name(key)
        if is_temporary(key):
            yield warning(key, "key.temporary", "leftover temporary file (an interrupted write?)")
            continue
        if is_metadata_key(key):
            problems = validate_metadata(key, value, get)
            yield from problems
            if is_consolidated_key(key) or split_key(key)[1] in (ZMETADATA, ZARR_JSON):
                doc = parse_json_or_none(value)
                if doc is not None:
                    documents[key] = doc
        else:
            yield from validate_data_key(key, get)
    yield from consolidated_findings(documents)


def check_database(driver: Any, batch: int = 10_000) -> Iterator[Problem]:
    """:func:`check_items` over a driver (``zarrfs.backends.base.Driver``): for ``zarrfs check``.

    Keys are listed in batches of ``batch``, each in its own short read transaction, and values
    are read only for metadata keys; a check of a huge store neither holds one transaction open
    for its whole length nor reads its chunks.
    """

    def keys() -> Iterator[tuple[str, bytes | None]]:
        start = ""
        while True:
            page = driver.scan(start, None, fetch="keys", limit=batch)
            for key, _ in page:
                if not is_metadata_key(key):
                    yield key, None
                    continue
                value = driver.get(key)
                if value is not None:  # else it was deleted since the listing
                    yield key, value
            if len(page) < batch:
                return
            start = page[-1][0] + "\x00"  # the smallest key after the last one seen

    yield from check_items(keys(), driver.get)

"""Live consolidated metadata: keep ``.zmetadata`` (v2) and a v3 root ``zarr.json``'s
``consolidated_metadata`` in step with each metadata write.

Cost per change matters when a hierarchy has thousands of arrays and a client writes their
metadata one by one (xarray does). So:

* documents are copied on write, shallowly: the caller may keep a parsed document cached and
  a failed transaction never leaves that cache modified;
* serialising re-uses the text of every unchanged entry. Documents returned by this module are
  :class:`CachedDoc` (a ``dict``; ``json.dumps`` sees no difference) carrying those fragments,
  so a change costs one entry's ``json.dumps`` plus a join, not a full re-serialisation (which,
  with ``indent``, runs in pure Python).

Keys given to these functions are relative to the folder holding the consolidated document.
"""

from __future__ import annotations

import json
import unicodedata
import uuid
from collections.abc import Iterable
from typing import Any

from .errors import FormatError, error
from .json_docs import load_json
from .keys import ZARR_JSON, ZARRAY, ZATTRS, ZGROUP, split_key

CONSOLIDATED_NAMES = frozenset({ZARRAY, ZGROUP, ZATTRS})
# zarr-python 2's json_dumps; also what it expects back when reading.
V2_JSON = {"indent": 4, "sort_keys": True, "ensure_ascii": True, "separators": (",", ": ")}
# zarr-python 3 writes zarr.json with json.dumps(..., indent=2, allow_nan=True).
V3_JSON = {"indent": 2}
_V3_PATH = ("consolidated_metadata", "metadata")


class CachedDoc(dict):
    """A JSON document (a plain ``dict`` to every reader) that remembers the serialised text of
    the entries of its consolidated-metadata map, keyed by entry."""

    __slots__ = ("fragments",)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fragments: dict[str, tuple[Any, int, str]] = {}


def _entries_at(doc: dict, path: tuple[str, ...]) -> dict | None:
    node: Any = doc
    for p in path:
        node = node.get(p) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _replace_at(doc: dict, path: tuple[str, ...], value: Any, out: dict) -> dict:
    """Fill ``out`` (an empty dict-like) with a copy of ``doc`` whose member at ``path`` is
    ``value``; only the dicts on the path are copied."""
    out.update(doc)
    node = out
    for p in path[:-1]:
        node[p] = dict(node[p])
        node = node[p]
    node[path[-1]] = value
    return out


def _with_entries(doc: dict, path: tuple[str, ...], entries: dict) -> CachedDoc:
    """A new :class:`CachedDoc` like ``doc`` with the map at ``path`` replaced by ``entries``,
    keeping the fragments cached for ``doc`` (entries that did not change stay valid)."""
    out = _replace_at(doc, path, entries, CachedDoc())
    if isinstance(doc, CachedDoc):
        out.fragments = dict(doc.fragments)
    return out


def _dumps_spliced(doc: dict, path: tuple[str, ...], opts: dict, sort: bool) -> bytes:
    """``json.dumps(doc, **opts)``, byte for byte, re-using cached entry fragments."""
    entries = _entries_at(doc, path)
    if entries is None:
        return json.dumps(doc, **opts).encode("ascii")
    fragments = doc.fragments if isinstance(doc, CachedDoc) else {}
    sentinel = f"zarrfs-entries-{uuid.uuid4().hex}"
    text = json.dumps(_replace_at(doc, path, sentinel, {}), **opts)
    token = json.dumps(sentinel)
    at = text.index(token)
    line = text[text.rfind("\n", 0, at) + 1 : at]
    base = len(line) - len(line.lstrip(" "))
    inner = base + opts["indent"]
    key_sep = opts.get("separators", (",", ": "))[1]
    pad = "\n" + " " * inner
    parts = []
    for k in sorted(entries) if sort else entries:
        v = entries[k]
        cached = fragments.get(k)
        if cached is None or cached[0] is not v or cached[1] != inner:
            frag = " " * inner + json.dumps(k, **opts) + key_sep + json.dumps(v, **opts).replace("\n", pad)
            cached = (v, inner, frag)
            fragments[k] = cached
        parts.append(cached[2])
    body = "{\n" + ",\n".join(parts) + "\n" + " " * base + "}" if parts else "{}"
    return (text[:at] + body + text[at + len(token) :]).encode("ascii")


def _parse(key: str, value: bytes) -> Any:
    doc, problems = load_json(key, value)
    if doc is None:
        raise FormatError(problems[0], problems)
    return doc


# --- v2: .zmetadata ------------------------------------------------------------------------


def is_consolidated_key(key: str) -> bool:
    """True for keys a v2 ``.zmetadata`` holds: ``.zarray``, ``.zgroup`` and ``.zattrs``."""
    return split_key(key)[1] in CONSOLIDATED_NAMES


def load_consolidated(value: bytes) -> CachedDoc:
    """Parse stored consolidated metadata (``.zmetadata`` or a ``zarr.json``) for updating.

    Raises :class:`FormatError` when the bytes are not JSON.
    """
    doc = _parse(".zmetadata", value)
    if not isinstance(doc, dict):
        raise FormatError(
            error(".zmetadata", "json.not-object", "consolidated metadata is not a JSON object")
        )
    return CachedDoc(doc)


def consolidated_update(doc: dict | None, key: str, value: bytes | None) -> dict | None:
    """Apply one metadata change to a v2 ``.zmetadata`` document.

    ``doc`` is the parsed document (``{"metadata": {...}, "zarr_consolidated_format": 1}``, as
    zarr-python writes it), ``key`` the changed key relative to the document's folder and
    ``value`` its new bytes, or ``None`` when it was deleted. Returns the new document (``doc``
    itself is not modified), or ``None`` when nothing changes: no document, a key that is not
    consolidated, or an identical value. Raises :class:`FormatError` if ``value`` is not JSON.
    """
    if not isinstance(doc, dict) or not is_consolidated_key(key):
        return None
    entries = doc.get("metadata")
    if not isinstance(entries, dict):
        return None
    if value is None:
        if key not in entries:
            return None
        new = dict(entries)
        del new[key]
        return _with_entries(doc, ("metadata",), new)
    parsed = _parse(key, value)
    if key in entries and entries[key] == parsed:
        return None
    new = dict(entries)
    new[key] = parsed
    return _with_entries(doc, ("metadata",), new)


def build_consolidated(items: Iterable[tuple[str, bytes]]) -> dict:
    """Build a v2 ``.zmetadata`` document from ``(key, value)`` pairs (keys relative to its
    folder). Keys other than ``.zarray``/``.zgroup``/``.zattrs``, and values that are not
    JSON, are left out, as zarr-python leaves out what it cannot parse."""
    entries = {}
    for key, value in items:
        if is_consolidated_key(key):
            doc, _ = load_json(key, value)
            if doc is not None:
                entries[key] = doc
    return CachedDoc({"metadata": entries, "zarr_consolidated_format": 1})


def dumps_consolidated(doc: dict) -> bytes:
    """Serialise a ``.zmetadata`` document exactly as zarr-python 2 does (``indent=4``,
    sorted keys, ASCII), re-using the cached text of unchanged entries."""
    return _dumps_spliced(doc, ("metadata",), V2_JSON, sort=True)


# --- v3: consolidated_metadata inside the root zarr.json ----------------------------------


def _v3_order(path: str) -> tuple[int, str]:
    # zarr-python 3 writes entries shallowest first, then by case-folded NFKC name.
    return path.count("/"), unicodedata.normalize("NFKC", path).casefold()


def _empty_consolidated() -> dict:
    return {"kind": "inline", "must_understand": False, "metadata": {}}


def _implicit_group() -> dict:
    # What zarr-python 3 writes for a group entry; it stands in for a group whose own
    # zarr.json is not there (yet), because zarr-python's reader needs every ancestor entry.
    return {
        "attributes": {},
        "zarr_format": 3,
        "consolidated_metadata": _empty_consolidated(),
        "node_type": "group",
    }


def v3_entry(doc: Any) -> Any:
    """A ``zarr.json`` document as a v3 consolidated entry (groups get an empty map)."""
    if isinstance(doc, dict) and doc.get("node_type") == "group":
        # Flattened form: each group entry carries an empty map, its children sit at the root.
        doc = dict(doc)
        doc["consolidated_metadata"] = _empty_consolidated()
    return doc


def _node_path(key: str) -> str | None:
    prefix, name = split_key(key)
    return prefix if name == ZARR_JSON and prefix else None


def consolidated_update_v3(root_doc: dict | None, key: str, value: bytes | None) -> dict | None:
    """Apply one ``zarr.json`` change to the ``consolidated_metadata`` of a v3 root document.

    Mirrors :func:`consolidated_update`: ``key`` is relative to the root's folder (e.g.
    ``"a/b/zarr.json"``), ``value`` ``None`` for a deletion; returns the new root document or
    ``None`` when nothing changes (no consolidated metadata in ``root_doc``, not a
    ``zarr.json`` key, the root's own ``zarr.json``, an identical entry). Entries use
    zarr-python 3's flattened layout; a missing ancestor group gets a stand-in entry so that
    readers, which look every ancestor up, keep working; deleting a group that still has
    entries below it leaves such a stand-in.
    """
    path = _node_path(key)
    if path is None or not isinstance(root_doc, dict):
        return None
    entries = _entries_at(root_doc, _V3_PATH)
    if entries is None:
        return None
    prefix = path + "/"
    if value is None:
        if path not in entries:
            return None
        new = dict(entries)
        if any(k.startswith(prefix) for k in entries):
            if entries[path] == _implicit_group():
                return None
            new[path] = _implicit_group()
        else:
            del new[path]
        return _with_entries(root_doc, _V3_PATH, new)
    entry = v3_entry(_parse(key, value))
    if path in entries and entries[path] == entry:
        return None
    new = dict(entries)
    added = path not in new
    new[path] = entry
    parent = path.rpartition("/")[0]
    while parent:
        if parent not in new:
            new[parent] = _implicit_group()
            added = True
        parent = parent.rpartition("/")[0]
    if added:
        new = {k: new[k] for k in sorted(new, key=_v3_order)}
    return _with_entries(root_doc, _V3_PATH, new)


def build_consolidated_v3(items: Iterable[tuple[str, bytes]]) -> dict:
    """The ``consolidated_metadata`` member for a v3 root, from ``(key, value)`` pairs of the
    ``zarr.json`` keys below it (keys relative to the root; the root's own is ignored)."""
    entries = {}
    for key, value in items:
        path = _node_path(key)
        if path is not None:
            doc, _ = load_json(key, value)
            if isinstance(doc, dict):
                entries[path] = v3_entry(doc)
    for path in list(entries):
        parent = path.rpartition("/")[0]
        while parent and parent not in entries:
            entries[parent] = _implicit_group()
            parent = parent.rpartition("/")[0]
    cm = _empty_consolidated()
    cm["metadata"] = {k: entries[k] for k in sorted(entries, key=_v3_order)}
    return cm


def dumps_zarr_json(doc: dict) -> bytes:
    """Serialise a ``zarr.json`` document as zarr-python 3 does (``indent=2``, NaN allowed),
    re-using cached consolidated entries."""
    return _dumps_spliced(doc, _V3_PATH, V3_JSON, sort=False)

"""Rules for Zarr v3 ``zarr.json`` documents (arrays and groups).

Unknown top-level members are refused unless they are objects marked
``"must_understand": false`` (core spec, "Extensions"); unknown extensions *inside* known
extension points (a codec, a data type) only warn, because a newer writer may know them and
refusing would lose its data.
"""

from __future__ import annotations

from typing import Any

from .errors import Report
from .json_docs import is_int, short
from .keys import validate_name
from .v2_metadata import check_zarray, check_zgroup
from .v3_codecs import ChainContext, check_codecs
from .v3_dtypes import DataType, DataTypeError, check_fill_value, parse_data_type
from .v3_extensions import is_optional_extension, parse_extension

ARRAY_REQUIRED = (
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
)
ARRAY_OPTIONAL = ("attributes", "storage_transformers", "dimension_names")
GROUP_REQUIRED = ("zarr_format", "node_type")
GROUP_OPTIONAL = ("attributes",)


def _unknown_members(doc: dict, known: tuple[str, ...], r: Report) -> None:
    for k in sorted(set(doc) - set(known)):
        if not is_optional_extension(doc[k]):
            r.error("unknown-key", f'unknown member {k!r} without "must_understand": false')


def _check_attributes(doc: dict, r: Report) -> None:
    if "attributes" in doc and not isinstance(doc["attributes"], dict):
        r.error("attributes", f"attributes must be an object, got {short(doc['attributes'])}")


def _check_named(r: Report, rule: str, obj: Any) -> Any:
    """Parse an extension point that may not be marked optional (grid, key encoding)."""
    try:
        ext = parse_extension(obj)
    except ValueError as exc:
        r.error(rule, str(exc))
        return None
    if not ext.must_understand:
        r.error(rule, f"{ext.name}: must_understand: false is not allowed on {rule.replace('-', '_')}")
    return ext


def check_array(doc: dict, r: Report) -> DataType | None:
    """Check a v3 array document; return its parsed data type when the document is valid."""
    missing = [k for k in ARRAY_REQUIRED if k not in doc]
    if missing:
        r.error("missing-key", f"required member(s) missing: {', '.join(missing)}")
    _unknown_members(doc, ARRAY_REQUIRED + ARRAY_OPTIONAL, r)
    _check_attributes(doc, r)

    shape = doc.get("shape")
    shape_ok = isinstance(shape, list) and all(is_int(d) and d >= 0 for d in shape)
    if "shape" in doc and not shape_ok:
        r.error("shape", f"shape must be a list of non-negative integers, got {short(shape)}")
    ndim = len(shape) if shape_ok else None

    dt: DataType | None = None
    if "data_type" in doc:
        try:
            dt = parse_data_type(doc["data_type"])
        except DataTypeError as exc:
            r.error(exc.rule, str(exc))
        else:
            if not dt.known:
                r.warn(
                    "data-type-unknown",
                    f"unknown data type {dt.name!r}: it cannot be checked or decoded here",
                )

    chunk_shape = None
    if "chunk_grid" in doc:
        grid = _check_named(r, "chunk-grid", doc["chunk_grid"])
        if grid is not None and grid.name == "regular":
            cs = grid.configuration.get("chunk_shape")
            if not isinstance(cs, list) or not all(is_int(d) and d >= 0 for d in cs):
                r.error("chunk-grid", f"regular chunk_shape must be a list of integers, got {short(cs)}")
            elif ndim is not None and len(cs) != ndim:
                r.error("chunk-shape-length", f"chunk_shape has {len(cs)} dimensions but shape has {ndim}")
            elif any(c == 0 and (ndim is None or shape[i] != 0) for i, c in enumerate(cs)):
                r.error(
                    "chunk-grid", f"chunk_shape {cs}: a chunk length may be 0 only along an empty dimension"
                )
            else:
                chunk_shape = tuple(cs)
            extra = sorted(set(grid.configuration) - {"chunk_shape"})
            if extra:
                r.error("chunk-grid", f"regular grid: unknown configuration key(s) {', '.join(extra)}")
        elif grid is not None:
            r.warn("chunk-grid-unknown", f"unknown chunk grid {grid.name!r}: chunk keys cannot be checked")

    if "chunk_key_encoding" in doc:
        enc = _check_named(r, "chunk-key-encoding", doc["chunk_key_encoding"])
        if enc is not None and enc.name in ("default", "v2"):
            sep = enc.configuration.get("separator", "/" if enc.name == "default" else ".")
            if sep not in ("/", "."):
                r.error("chunk-key-encoding", f"{enc.name} separator must be '/' or '.', got {short(sep)}")
            extra = sorted(set(enc.configuration) - {"separator"})
            if extra:
                r.error("chunk-key-encoding", f"unknown configuration key(s) {', '.join(extra)}")
        elif enc is not None:
            r.warn(
                "chunk-key-encoding-unknown",
                f"unknown chunk key encoding {enc.name!r}: keys cannot be checked",
            )

    if dt is not None and "fill_value" in doc:
        found = check_fill_value(doc["fill_value"], dt)
        if found:
            r.add(found[0], "fill-value", f"fill_value {short(doc['fill_value'])} for {dt.name}: {found[1]}")

    if "codecs" in doc and dt is not None and ndim is not None:
        check_codecs(doc["codecs"], r, ChainContext(ndim, dt, chunk_shape))
    elif "codecs" in doc and (not isinstance(doc["codecs"], list) or not doc["codecs"]):
        r.error("codecs", f"codecs must be a non-empty list, got {short(doc['codecs'])}")

    names = doc.get("dimension_names")
    if names is not None:
        if not isinstance(names, list) or not all(n is None or isinstance(n, str) for n in names):
            r.error(
                "dimension-names", f"dimension_names must be a list of strings or nulls, got {short(names)}"
            )
        elif ndim is not None and len(names) != ndim:
            r.error(
                "dimension-names",
                f"dimension_names has {len(names)} entries but the array has {ndim} dimensions",
            )

    transformers = doc.get("storage_transformers")
    if transformers is not None:
        if not isinstance(transformers, list):
            r.error("storage-transformers", f"storage_transformers must be a list, got {short(transformers)}")
        else:
            for t in transformers:
                try:
                    ext = parse_extension(t)
                except ValueError as exc:
                    r.error("storage-transformers", str(exc))
                    continue
                if ext.must_understand:
                    r.warn(
                        "storage-transformer-unknown",
                        f"unknown storage transformer {ext.name!r}: keys are not checked",
                    )
    return None if r.has_errors else dt


def _check_consolidated(cm: Any, r: Report) -> None:
    """Check zarr-python 3's inline ``consolidated_metadata`` member of a group."""
    if cm is None:
        return
    if not is_optional_extension(cm):
        r.error("unknown-key", 'consolidated_metadata must be marked "must_understand": false')
    if not isinstance(cm, dict):
        return
    if cm.get("kind") != "inline":
        r.error("consolidated-metadata", f"only kind 'inline' exists, got {short(cm.get('kind'))}")
    meta = cm.get("metadata")
    if not isinstance(meta, dict):
        r.error("consolidated-metadata", f"'metadata' must map node paths to documents, got {short(meta)}")
        return
    for path, entry in meta.items():
        for p in validate_name(path):
            r.error("consolidated-metadata", f"entry {path!r}: {p.value}")
        if not isinstance(entry, dict):
            r.error("consolidated-metadata", f"entry {path!r} is not an object")
        elif entry.get("zarr_format") == 2:
            if "shape" in entry:
                check_zarray(entry, r.child("zarr.json.consolidated.zarray"))
            else:
                check_zgroup(entry, r.child("zarr.json.consolidated.zgroup"), lenient=True)
        else:
            check_zarr_json(entry, r.child("zarr.json.consolidated"))


def check_group(doc: dict, r: Report) -> None:
    """Check a v3 group document, including any consolidated metadata inside it."""
    _unknown_members(doc, GROUP_REQUIRED + GROUP_OPTIONAL + ("consolidated_metadata",), r)
    _check_attributes(doc, r)
    _check_consolidated(doc.get("consolidated_metadata"), r)


def check_zarr_json(doc: Any, r: Report) -> None:
    """Check a ``zarr.json`` document of either node type."""
    if not isinstance(doc, dict):
        r.error("not-object", f"metadata must be a JSON object, got {short(doc)}")
        return
    if doc.get("zarr_format") != 3 or isinstance(doc.get("zarr_format"), bool):
        r.error("zarr-format", f"zarr_format must be 3, got {short(doc.get('zarr_format'))}")
    node_type = doc.get("node_type")
    if node_type == "array":
        check_array(doc, r)
    elif node_type == "group":
        check_group(doc, r)
    else:
        r.error("node-type", f"node_type must be 'array' or 'group', got {short(node_type)}")

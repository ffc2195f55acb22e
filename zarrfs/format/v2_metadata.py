"""Rules for Zarr v2 metadata documents: ``.zarray``, ``.zgroup``, ``.zattrs``, ``.zmetadata``.

Each ``check_*`` function takes an already parsed JSON document and a :class:`Report`, and
records what is wrong; they never raise. Rule ids start with the document name without its
dot (``zarray.shape``, ``zgroup.keys``...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import Report
from .json_docs import is_int, short
from .keys import ZARRAY, ZATTRS, ZGROUP, split_key, validate_name
from .numcodecs_configs import check_codec_config
from .v2_dtypes import DtypeError, SimpleType, check_fill_value
from .v2_dtypes import check_dtype as check_dtype_value
from .v3_extensions import is_optional_extension

if TYPE_CHECKING:
    import numpy as np

ZARRAY_REQUIRED = ("zarr_format", "shape", "chunks", "dtype", "compressor", "fill_value", "order", "filters")
ZARRAY_OPTIONAL = ("dimension_separator",)


def check_shape(r: Report, shape: Any, chunks: Any, min_chunk: int = 1) -> bool:
    """Check ``shape``/``chunks`` lists (shared by v1 and v2); True when both are usable."""
    ok = True
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        r.error("shape", f"shape {short(shape)} is not a list of non-negative integers")
        ok = False
    if not isinstance(chunks, list) or not all(is_int(d) and d >= min_chunk for d in chunks):
        r.error("chunks", f"chunks {short(chunks)} is not a list of integers >= {min_chunk}")
        ok = False
    if ok and len(shape) != len(chunks):
        r.error("shape-chunks-length", f"shape has {len(shape)} dimensions but chunks has {len(chunks)}")
        ok = False
    return ok


def check_dtype(r: Report, obj: Any) -> SimpleType | np.dtype | None:
    """Check a v2/v1 ``dtype`` value, recording ``<prefix>.dtype*`` errors; return it if valid
    (a simple type without NumPy, ``v2_dtypes.check_dtype``)."""
    try:
        return check_dtype_value(obj)
    except DtypeError as exc:
        r.error(exc.rule, str(exc))
        return None


def check_array_header(doc: dict, r: Report, required: Any, version: int) -> SimpleType | np.dtype | None:
    """The checks v1 ``meta`` and v2 ``.zarray`` share: required keys, ``zarr_format``,
    ``shape``/``chunks`` and ``dtype``; returns the dtype when it parses."""
    missing = [k for k in required if k not in doc]
    if missing:
        r.error("missing-key", f"required key(s) missing: {', '.join(missing)}")
    fmt = doc.get("zarr_format", version)  # a missing one is reported above
    if fmt != version or isinstance(fmt, bool):
        r.error("zarr-format", f"zarr_format must be {version}, got {short(fmt)}")
    if "shape" in doc and "chunks" in doc:
        check_shape(r, doc["shape"], doc["chunks"])
    return check_dtype(r, doc["dtype"]) if "dtype" in doc else None


def check_zarray(doc: Any, r: Report) -> None:
    """Check a ``.zarray`` document (``v2_dtypes.parse_dtype`` makes its NumPy dtype)."""
    if not isinstance(doc, dict):
        r.error("not-object", f"metadata must be a JSON object, got {short(doc)}")
        return
    dtype = check_array_header(doc, r, ZARRAY_REQUIRED, 2)
    if "compressor" in doc and doc["compressor"] is not None:
        found = check_codec_config(doc["compressor"])
        if found:
            r.add(found[0], "compressor", found[1])
    if "filters" in doc:
        filters = doc["filters"]
        if filters is not None:
            if not isinstance(filters, list) or not filters:
                r.error(
                    "filters",
                    f"filters must be null or a non-empty list of codec objects, got {short(filters)}",
                )
            else:
                for f in filters:
                    found = check_codec_config(f)
                    if found:
                        r.add(found[0], "filters", found[1])
        if dtype is not None and dtype.hasobject and not filters:
            r.error("object-codec", "an object ('|O') array needs its object codec as the first filter")
    if dtype is not None and "fill_value" in doc:
        found = check_fill_value(doc["fill_value"], dtype)
        if found:
            r.add(found[0], "fill-value", f"fill_value {short(doc['fill_value'])} for {dtype}: {found[1]}")
    if "order" in doc and doc["order"] not in ("C", "F"):
        r.error("order", f"order must be 'C' or 'F', got {short(doc['order'])}")
    sep = doc.get("dimension_separator")
    if sep is not None and sep not in (".", "/"):
        r.error("dimension-separator", f"dimension_separator must be '.' or '/', got {short(sep)}")
    extra = sorted(set(doc) - set(ZARRAY_REQUIRED) - set(ZARRAY_OPTIONAL))
    if extra:
        r.warn("unknown-key", f"keys the spec says SHOULD NOT be present: {', '.join(extra)}")


def check_zgroup(doc: Any, r: Report, lenient: bool = False) -> None:
    """Check a ``.zgroup`` document: ``{"zarr_format": 2}`` and nothing else.

    Two known writers add members, and zarr-python reads their groups regardless, so those
    members only warn: netCDF-C's NCZarr 2.0 (``_nczarr_superblock``, ``_nczarr_group``) and,
    in ``.zmetadata`` entries (``lenient``), zarr-python 3 (``consolidated_metadata``, which
    passes silently). Any other member is refused, as the spec says MUST NOT.
    """
    if not isinstance(doc, dict):
        r.error("not-object", f"group metadata must be a JSON object, got {short(doc)}")
        return
    if doc.get("zarr_format") != 2 or isinstance(doc.get("zarr_format"), bool):
        r.error("zarr-format", f"zarr_format must be 2, got {short(doc.get('zarr_format'))}")
    extra = sorted(set(doc) - {"zarr_format"})
    if lenient and is_optional_extension(doc.get("consolidated_metadata")):
        extra.remove("consolidated_metadata")
    nczarr = [k for k in extra if k.lower().startswith("_nczarr")]
    others = [k for k in extra if k not in nczarr]
    if nczarr or (others and lenient):
        r.warn("keys", f"members the spec forbids in .zgroup: {', '.join(nczarr + others)}")
    if others and not lenient:
        r.error("keys", f"members the spec forbids in .zgroup: {', '.join(others)}")


def check_zattrs(doc: Any, r: Report, ndim: int | None) -> None:
    """Check a ``.zattrs`` document; ``ndim`` is the dimension count of the array it belongs to.

    xarray's ``_ARRAY_DIMENSIONS`` must be a list of strings, one per array dimension (when the
    array is known, i.e. ``ndim`` is not ``None``).
    """
    if not isinstance(doc, dict):
        r.error("not-object", f"attributes must be a JSON object, got {short(doc)}")
        return
    if "_ARRAY_DIMENSIONS" in doc:
        dims = doc["_ARRAY_DIMENSIONS"]
        if not isinstance(dims, list) or not all(isinstance(d, str) for d in dims):
            r.error("array-dimensions", f"_ARRAY_DIMENSIONS must be a list of strings, got {short(dims)}")
        elif ndim is not None and len(dims) != ndim:
            r.error(
                "array-dimensions-length",
                f"_ARRAY_DIMENSIONS names {len(dims)} dimensions but the array has {ndim}",
            )


def zarray_ndim(doc: Any) -> int | None:
    """The dimension count a (possibly broken) ``.zarray`` document declares, if it says."""
    if isinstance(doc, dict) and isinstance(doc.get("shape"), list):
        return len(doc["shape"])
    return None


def check_zmetadata(doc: Any, r: Report) -> None:
    """Check a ``.zmetadata`` (consolidated metadata) document and every entry in it."""
    if not isinstance(doc, dict):
        r.error("not-object", f"consolidated metadata must be a JSON object, got {short(doc)}")
        return
    fmt = doc.get("zarr_consolidated_format")
    if fmt != 1 or isinstance(fmt, bool):
        r.error("format", f"zarr_consolidated_format must be 1, got {short(fmt)}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        r.error("metadata", f"'metadata' must be an object mapping keys to documents, got {short(meta)}")
        return
    extra = sorted(set(doc) - {"zarr_consolidated_format", "metadata"})
    if extra:
        r.warn("unknown-key", f"unexpected keys: {', '.join(extra)}")
    for key, entry in meta.items():
        for p in validate_name(key):
            r.error("entry-name", f"entry {key!r}: {p.value}")
        prefix, name = split_key(key)
        if name == ZARRAY:
            check_zarray(entry, r.child("zmetadata.zarray"))
        elif name == ZGROUP:
            check_zgroup(entry, r.child("zmetadata.zgroup"), lenient=True)
        elif name == ZATTRS:
            sibling = meta.get(f"{prefix}/{ZARRAY}" if prefix else ZARRAY)
            check_zattrs(entry, r.child("zmetadata.zattrs"), zarray_ndim(sibling))
        else:
            r.warn("unknown-entry", f"entry {key!r} is not a .zarray, .zgroup or .zattrs key")

"""Rules for Zarr v1 metadata: the ``meta`` and ``attrs`` keys of a single-array store.

v1 has no hierarchy: one store holds one array as the keys ``meta``, ``attrs`` and chunk keys
like ``0.0``. Compression is named by ``compression`` with options in ``compression_opts``.
"""

from __future__ import annotations

from typing import Any

from .errors import Report
from .json_docs import is_int, short
from .numcodecs_configs import check_codec_config
from .v2_dtypes import check_fill_value
from .v2_metadata import check_array_header

V1_REQUIRED = (
    "zarr_format",
    "shape",
    "chunks",
    "dtype",
    "compression",
    "compression_opts",
    "fill_value",
    "order",
)
V1_COMPRESSIONS = ("none", "blosc", "zlib", "bz2", "lzma")


def v1_compressor_config(compression: Any, opts: Any) -> dict[str, Any] | None:
    """The numcodecs config matching v1 ``compression``/``compression_opts`` (``None``: raw).

    Raises ``ValueError`` when the pair names no compressor this layer can build.
    """
    if compression in (None, "none"):
        return None
    if compression == "blosc":
        opts = opts or {}
        if not isinstance(opts, dict):
            raise ValueError(f"blosc options must be an object, got {short(opts)}")
        return {"id": "blosc", **opts}
    if compression in ("zlib", "bz2"):
        if opts is None:
            return {"id": compression}
        if not is_int(opts):
            raise ValueError(f"{compression} options must be an integer level, got {short(opts)}")
        return {"id": compression, "level": opts}
    if compression == "lzma":
        if opts is None:
            return {"id": "lzma"}
        if not isinstance(opts, dict):
            raise ValueError(f"lzma options must be an object, got {short(opts)}")
        return {"id": "lzma", **opts}
    raise ValueError(f"unknown compression {short(compression)}; v1 knows {', '.join(V1_COMPRESSIONS)}")


def check_v1_meta(doc: Any, r: Report) -> None:
    """Check a v1 ``meta`` document against the v1 spec (extra keys MAY be present)."""
    if not isinstance(doc, dict):
        r.error("not-object", f"metadata must be a JSON object, got {short(doc)}")
        return
    dtype = check_array_header(doc, r, V1_REQUIRED, 1)
    if "compression" in doc:
        try:
            config = v1_compressor_config(doc["compression"], doc.get("compression_opts"))
        except ValueError as exc:
            r.error("compression", str(exc))
        else:
            found = check_codec_config(config) if config is not None else None
            if found:
                r.add(found[0], "compression-opts", found[1])
    if dtype is not None and "fill_value" in doc:
        found = check_fill_value(doc["fill_value"], dtype)
        if found:
            r.add(found[0], "fill-value", f"fill_value {short(doc['fill_value'])} for {dtype}: {found[1]}")
    if "order" in doc and doc["order"] not in ("C", "F"):
        r.error("order", f"order must be 'C' or 'F', got {short(doc['order'])}")


def check_v1_attrs(doc: Any, r: Report) -> None:
    """Check a v1 ``attrs`` document: a JSON object."""
    if not isinstance(doc, dict):
        r.error("not-object", f"attributes must be a JSON object, got {short(doc)}")

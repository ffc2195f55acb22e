"""Rules for a v3 ``codecs`` list: kinds, order and each known codec's configuration.

A valid chain is zero or more array->array codecs, exactly one array->bytes codec, then zero or
more bytes->bytes codecs. Unknown codecs get a warning (a newer writer may know them) and, since
their kind is unknown, relax the ordering checks around them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .errors import Report
from .json_docs import is_int, short
from .numcodecs_configs import check_codec_config
from .v3_dtypes import CORE_TYPES, DataType, parse_data_type
from .v3_extensions import Extension, parse_extension

AA = "array->array"
AB = "array->bytes"
BB = "bytes->bytes"

CORE_CODECS = {
    "transpose": AA,
    "bytes": AB,
    "endian": AB,  # the name zarr-python 3 previews used for "bytes"; it still registers it
    "sharding_indexed": AB,
    "vlen-utf8": AB,
    "vlen-bytes": AB,
    "gzip": BB,
    "zstd": BB,
    "blosc": BB,
    "crc32c": BB,
}
# The numcodecs codecs zarr-python 3 exposes as "numcodecs.<id>", by kind.
NUMCODECS_KINDS = {
    **dict.fromkeys(("delta", "bitround", "fixedscaleoffset", "quantize", "packbits", "astype"), AA),
    **dict.fromkeys(("pcodec", "zfpy"), AB),
    **dict.fromkeys(
        ("blosc", "lz4", "zstd", "zlib", "gzip", "bz2", "lzma", "shuffle")
        + ("crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3"),
        BB,
    ),
}
# Codecs whose output size depends only on their input size: the only ones a shard index
# (read before anything else, at a fixed offset) may use.
FIXED_SIZE_CODECS = frozenset(
    {"bytes", "endian", "transpose", "crc32c"}
    | {f"numcodecs.{c}" for c in ("crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3")}
)
BLOSC_CNAMES = frozenset({"blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd"})
BLOSC_SHUFFLES = frozenset({"noshuffle", "shuffle", "bitshuffle"})
_UINT64 = parse_data_type("uint64")


def codec_kind(name: str) -> str | None:
    """The kind of a codec name (``AA``, ``AB``, ``BB``), or ``None`` when unknown."""
    if name in CORE_CODECS:
        return CORE_CODECS[name]
    if name.startswith("numcodecs."):
        return NUMCODECS_KINDS.get(name[len("numcodecs.") :])
    return None


@dataclass(frozen=True)
class ChainContext:
    """What a codec chain encodes: ``ndim`` dimensions of ``data_type`` in chunks of
    ``chunk_shape`` (``None`` when unknown). ``dtype_changed`` turns on once a numcodecs
    array->array codec may have changed the data type, which disables type-based checks."""

    ndim: int
    data_type: DataType
    chunk_shape: tuple[int, ...] | None
    dtype_changed: bool = False


def _only_keys(r: Report, ext: Extension, allowed: set[str], rule: str) -> None:
    extra = sorted(set(ext.configuration) - allowed)
    if extra:
        r.error(rule, f"{ext.name}: unknown configuration key(s) {', '.join(extra)}")


def _check_bytes(r: Report, ext: Extension, ctx: ChainContext) -> None:
    _only_keys(r, ext, {"endian"}, "codec-bytes")
    endian = ext.configuration.get("endian")
    if endian is not None and endian not in ("little", "big"):
        r.error("codec-bytes", f"endian must be 'little' or 'big', got {short(endian)}")
    if ctx.dtype_changed:
        return
    dt = ctx.data_type
    if dt.variable_length:
        r.error(
            "codec-bytes",
            f"the bytes codec cannot encode variable-length {dt.name}; use vlen-utf8/vlen-bytes",
        )
    elif endian is None and dt.name in CORE_TYPES and (dt.itemsize or 0) > 1:
        r.error(
            "codec-bytes-endian", f"{dt.name} has {dt.itemsize}-byte items: the bytes codec needs 'endian'"
        )


def _check_transpose(r: Report, ext: Extension, ctx: ChainContext) -> None:
    _only_keys(r, ext, {"order"}, "codec-transpose")
    order = ext.configuration.get("order")
    if order in ("C", "F"):
        r.warn(
            "codec-transpose", f"order {order!r} is the old string form; the spec wants a permutation list"
        )
        return
    if (
        not isinstance(order, list)
        or sorted(x for x in order if is_int(x)) != list(range(ctx.ndim))
        or len(order) != ctx.ndim
    ):
        r.error("codec-transpose", f"order must be a permutation of 0..{ctx.ndim - 1}, got {short(order)}")


def _check_gzip(r: Report, ext: Extension, ctx: ChainContext) -> None:
    _only_keys(r, ext, {"level"}, "codec-gzip")
    level = ext.configuration.get("level")
    if not (is_int(level) and 0 <= level <= 9):
        r.error("codec-gzip", f"level must be an integer 0-9, got {short(level)}")


def _check_zstd(r: Report, ext: Extension, ctx: ChainContext) -> None:
    _only_keys(r, ext, {"level", "checksum"}, "codec-zstd")
    level = ext.configuration.get("level", 0)
    if not (is_int(level) and -131072 <= level <= 22):
        r.error("codec-zstd", f"level must be an integer -131072..22, got {short(level)}")
    if not isinstance(ext.configuration.get("checksum", False), bool):
        r.error("codec-zstd", f"checksum must be true or false, got {short(ext.configuration['checksum'])}")


def _check_blosc(r: Report, ext: Extension, ctx: ChainContext) -> None:
    c = ext.configuration
    _only_keys(r, ext, {"cname", "clevel", "shuffle", "typesize", "blocksize"}, "codec-blosc")
    if c.get("cname") not in BLOSC_CNAMES:
        r.error(
            "codec-blosc",
            f"cname must be one of {', '.join(sorted(BLOSC_CNAMES))}, got {short(c.get('cname'))}",
        )
    if not (is_int(c.get("clevel")) and 0 <= c["clevel"] <= 9):
        r.error("codec-blosc", f"clevel must be an integer 0-9, got {short(c.get('clevel'))}")
    if c.get("shuffle") not in BLOSC_SHUFFLES:
        r.error(
            "codec-blosc",
            f"shuffle must be one of {', '.join(sorted(BLOSC_SHUFFLES))}, got {short(c.get('shuffle'))}",
        )
    if "typesize" in c and not (is_int(c["typesize"]) and c["typesize"] >= 1):
        r.error("codec-blosc", f"typesize must be a positive integer, got {short(c['typesize'])}")
    if c.get("shuffle") in ("shuffle", "bitshuffle") and "typesize" not in c:
        r.error("codec-blosc", "typesize is required when shuffle is on")
    if "blocksize" in c and not (is_int(c["blocksize"]) and c["blocksize"] >= 0):
        r.error("codec-blosc", f"blocksize must be a non-negative integer, got {short(c['blocksize'])}")


def _check_crc32c(r: Report, ext: Extension, ctx: ChainContext) -> None:
    _only_keys(r, ext, set(), "codec-crc32c")


def _check_vlen(r: Report, ext: Extension, ctx: ChainContext) -> None:
    _only_keys(r, ext, set(), "codec-vlen")
    dt = ctx.data_type
    if not ctx.dtype_changed and dt.known and not dt.variable_length:
        r.error("codec-vlen", f"{ext.name} encodes variable-length strings/bytes, not {dt.name}")


def _check_sharding(r: Report, ext: Extension, ctx: ChainContext) -> None:
    c = ext.configuration
    _only_keys(r, ext, {"chunk_shape", "codecs", "index_codecs", "index_location"}, "codec-sharding")
    inner = c.get("chunk_shape")
    inner_ok = isinstance(inner, list) and len(inner) == ctx.ndim and all(is_int(d) and d >= 1 for d in inner)
    if not inner_ok:
        r.error("codec-sharding", f"chunk_shape must be {ctx.ndim} positive integers, got {short(inner)}")
    elif ctx.chunk_shape is not None and any(o % i for o, i in zip(ctx.chunk_shape, inner, strict=True)):
        r.error(
            "codec-sharding-chunk-shape",
            f"inner chunk_shape {inner} does not evenly divide the shard shape {list(ctx.chunk_shape)}",
        )
    if c.get("index_location", "end") not in ("start", "end"):
        r.error(
            "codec-sharding", f"index_location must be 'start' or 'end', got {short(c.get('index_location'))}"
        )
    if "codecs" not in c:
        r.error("codec-sharding", "sharding_indexed needs 'codecs'")
    else:
        check_codecs(
            c["codecs"],
            r,
            replace(ctx, chunk_shape=tuple(inner) if inner_ok else None),
            "codec-sharding-codecs",
        )
    if "index_codecs" not in c:
        r.error("codec-sharding", "sharding_indexed needs 'index_codecs'")
    else:
        index_ctx = ChainContext(ctx.ndim + 1, _UINT64, None)
        check_codecs(c["index_codecs"], r, index_ctx, "codec-sharding-index")
        for obj in c["index_codecs"] if isinstance(c["index_codecs"], list) else ():
            name = obj if isinstance(obj, str) else obj.get("name") if isinstance(obj, dict) else None
            if isinstance(name, str) and codec_kind(name) is not None and name not in FIXED_SIZE_CODECS:
                r.error("codec-sharding-index", f"index codec {name} does not produce a fixed-size index")


_CHECKS = {
    "bytes": _check_bytes,
    "endian": _check_bytes,
    "transpose": _check_transpose,
    "gzip": _check_gzip,
    "zstd": _check_zstd,
    "blosc": _check_blosc,
    "crc32c": _check_crc32c,
    "vlen-utf8": _check_vlen,
    "vlen-bytes": _check_vlen,
    "sharding_indexed": _check_sharding,
}


def check_codecs(codecs: Any, r: Report, ctx: ChainContext, rule: str = "codecs") -> None:
    """Check a codec list: each codec's configuration, then the kinds and their order."""
    if not isinstance(codecs, list) or not codecs:
        r.error(rule, f"codecs must be a non-empty list, got {short(codecs)}")
        return
    state = "array"  # what the next codec receives
    saw_unknown = False
    array_bytes = 0
    for i, obj in enumerate(codecs):
        try:
            ext = parse_extension(obj)
        except ValueError as exc:
            r.error(rule, f"codec {i}: {exc}")
            saw_unknown = True
            continue
        if ext.extra_keys:
            r.warn(rule, f"codec {ext.name}: unexpected key(s) {', '.join(ext.extra_keys)}")
        kind = codec_kind(ext.name)
        if kind is None:
            saw_unknown = True
            if ext.must_understand:
                r.warn("codec-unknown", f"unknown codec {ext.name!r}: it cannot be checked or decoded here")
            continue
        if ext.name in _CHECKS:
            _CHECKS[ext.name](r, ext, ctx)
        else:  # numcodecs.<id>
            found = check_codec_config({"id": ext.name[len("numcodecs.") :], **ext.configuration})
            if found:
                r.add(found[0], "codec-numcodecs", found[1])
            if kind == AA and ext.name != "numcodecs.delta":
                ctx = replace(ctx, dtype_changed=True)
        if kind == AA and state != "array":
            r.error(f"{rule}-order", f"array->array codec {ext.name} comes after the array->bytes codec")
        elif kind == AB:
            array_bytes += 1
            if array_bytes > 1:
                r.error(
                    f"{rule}-array-bytes", f"a second array->bytes codec ({ext.name}); exactly one is allowed"
                )
            state = "bytes"
        elif kind == BB and state != "bytes" and not saw_unknown:
            r.error(f"{rule}-order", f"bytes->bytes codec {ext.name} comes before the array->bytes codec")
    if array_bytes == 0 and not saw_unknown:
        r.error(f"{rule}-array-bytes", "no array->bytes codec (such as 'bytes'); exactly one is required")

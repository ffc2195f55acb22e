"""Chunk codec pipelines: stored chunk bytes <-> the raw bytes of the full chunk.

v2 (and v1): the raw chunk, laid out in the array's ``order``, goes through the filters then the
compressor (numcodecs). v3: array->array codecs (``transpose`` only here), the ``bytes`` codec,
then bytes->bytes codecs (``gzip``, ``zstd``, ``blosc``, ``crc32c`` and ``numcodecs.*``
compressors and checksums), all through numcodecs. Anything else raises
:class:`UnsupportedArray` when the pipeline is built, with the reason in words.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numcodecs.abc import Codec

from .errors import UnsupportedArray, error
from .numcodecs_configs import make_codec
from .v3_codecs import AB, BB, codec_kind
from .v3_dtypes import DataType
from .v3_extensions import parse_extension


def _as_bytes(x: Any) -> bytes:
    """Flatten whatever a numcodecs codec returned into bytes, in memory order."""
    if isinstance(x, bytes):
        return x
    if isinstance(x, np.ndarray):
        return x.tobytes(order="A")
    return bytes(memoryview(x).cast("B"))


def unsupported(key: str, reason: str) -> UnsupportedArray:
    """Build the :class:`UnsupportedArray` for the array whose metadata is ``key``."""
    return UnsupportedArray(error(key, "array.unsupported", reason))


class V2Pipeline:
    """Filters then compressor, as zarr v2 applies them to a chunk in ``order`` layout."""

    def __init__(
        self, filters: list[Codec], compressor: Codec | None, dtype: np.dtype, chunks: tuple, order: str
    ):
        self.filters = filters
        self.compressor = compressor
        self.dtype = dtype
        self.chunks = chunks
        self.order = order

    def decode(self, encoded: bytes) -> bytes:
        """Stored bytes -> raw chunk bytes (array order, the dtype's byte order)."""
        data: Any = encoded
        if self.compressor is not None:
            data = self.compressor.decode(data)
        for f in reversed(self.filters):
            data = f.decode(data)
        return _as_bytes(data)

    def encode(self, raw: bytes) -> bytes:
        """Raw chunk bytes -> stored bytes."""
        data: Any = np.frombuffer(raw, dtype=self.dtype).reshape(self.chunks, order=self.order)
        for f in self.filters:
            data = f.encode(data)
        if self.compressor is not None:
            data = self.compressor.encode(data)
        return _as_bytes(data)


def v2_pipeline(
    metadata_key: str, filters: Any, compressor: Any, dtype: np.dtype, chunks: tuple, order: str
) -> V2Pipeline:
    """Build a :class:`V2Pipeline` from v2 JSON configs; raise :class:`UnsupportedArray`."""
    if dtype.hasobject:
        raise unsupported(metadata_key, "object ('|O') arrays hold variable-size items: no raw chunk layout")
    try:
        built = [make_codec(f) for f in filters or []]
        comp = make_codec(compressor) if compressor is not None else None
    except Exception as exc:
        raise unsupported(
            metadata_key, f"codec cannot be instantiated: {type(exc).__name__}: {exc}"
        ) from None
    return V2Pipeline(built, comp, dtype, chunks, order)


class _Blosc:
    """The v3 ``blosc`` codec through numcodecs, with the typesize the metadata names."""

    _SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}

    def __init__(self, config: dict[str, Any]):
        self.typesize = config.get("typesize", 1)
        args = {
            "cname": config["cname"],
            "clevel": config["clevel"],
            "shuffle": self._SHUFFLE[config["shuffle"]],
            "blocksize": config.get("blocksize", 0),
        }
        try:
            self.codec = make_codec({"id": "blosc", **args, "typesize": self.typesize})
            self.view = False
        except TypeError:
            # numcodecs < 0.16 has no typesize argument: blosc then takes it from the
            # item size of the buffer, so hand it a view with items of that size.
            self.codec = make_codec({"id": "blosc", **args})
            self.view = True

    def encode(self, data: bytes) -> bytes:
        if self.view and self.typesize in (2, 4, 8) and len(data) % self.typesize == 0:
            return _as_bytes(self.codec.encode(np.frombuffer(data, dtype=f"u{self.typesize}")))
        return _as_bytes(self.codec.encode(data))

    def decode(self, data: bytes) -> bytes:
        return _as_bytes(self.codec.decode(data))


class V3Pipeline:
    """transpose* -> bytes -> bytes->bytes*, the subset of v3 this layer implements."""

    def __init__(
        self,
        transposes: list[tuple[int, ...]],
        endian_dtype: np.dtype,
        bytes_codecs: list[Any],
        chunks: tuple,
    ):
        self.transposes = transposes
        self.dtype = endian_dtype
        self.bytes_codecs = bytes_codecs
        self.chunks = chunks

    def decode(self, encoded: bytes) -> bytes:
        """Stored bytes -> raw chunk bytes (C order, the ``bytes`` codec's byte order)."""
        data: Any = encoded
        for c in reversed(self.bytes_codecs):
            data = _as_bytes(c.decode(data))
        shape = list(self.chunks)
        for order in self.transposes:
            shape = [shape[i] for i in order]
        arr = np.frombuffer(data, dtype=self.dtype)
        if arr.size != math.prod(shape):
            return _as_bytes(data)  # the caller reports the size mismatch
        arr = arr.reshape(shape)
        for order in reversed(self.transposes):
            arr = arr.transpose(np.argsort(order))
        return np.ascontiguousarray(arr).tobytes()

    def encode(self, raw: bytes) -> bytes:
        """Raw chunk bytes (C order) -> stored bytes."""
        arr = np.frombuffer(raw, dtype=self.dtype).reshape(self.chunks)
        for order in self.transposes:
            arr = arr.transpose(order)
        data = np.ascontiguousarray(arr).tobytes()
        for c in self.bytes_codecs:
            data = _as_bytes(c.encode(data))
        return data


def _bytes_codec(metadata_key: str, name: str, config: dict[str, Any]) -> Any:
    try:
        if name == "gzip":
            return make_codec({"id": "gzip", "level": config.get("level", 5)})
        if name == "zstd":
            return make_codec(
                {"id": "zstd", "level": config.get("level", 0), "checksum": config.get("checksum", False)}
            )
        if name == "blosc":
            return _Blosc(config)
        if name == "crc32c":
            return make_codec({"id": "crc32c"})
        return make_codec({"id": name[len("numcodecs.") :], **config})
    except Exception as exc:
        raise unsupported(
            metadata_key, f"codec {name} cannot be instantiated: {type(exc).__name__}: {exc}"
        ) from None


def v3_pipeline(
    metadata_key: str, codecs: list[Any], dt: DataType, chunks: tuple
) -> tuple[V3Pipeline, np.dtype]:
    """Build a :class:`V3Pipeline`; return it with the dtype of the raw chunk bytes.

    Raises :class:`UnsupportedArray` for sharding, variable-length types and codecs outside the
    supported subset.
    """
    if dt.dtype is None:
        what = "variable-length" if dt.variable_length else "no NumPy equivalent"
        raise unsupported(metadata_key, f"data type {dt.name} has {what}: no raw chunk layout here")
    transposes: list[tuple[int, ...]] = []
    endian_dtype = None
    bytes_codecs = []
    for obj in codecs:
        ext = parse_extension(obj)
        if not ext.must_understand and codec_kind(ext.name) is None:
            continue  # explicitly ignorable
        kind = codec_kind(ext.name)
        if ext.name == "transpose":
            order = ext.configuration.get("order")
            if order == "C":
                order = list(range(len(chunks)))
            elif order == "F":
                order = list(reversed(range(len(chunks))))
            transposes.append(tuple(order))
        elif ext.name in ("bytes", "endian"):
            endian = ext.configuration.get("endian", "little")
            endian_dtype = dt.dtype.newbyteorder("<" if endian == "little" else ">")
        elif ext.name == "sharding_indexed":
            raise unsupported(
                metadata_key,
                "sharded array (sharding_indexed): each stored key holds many chunks plus an index, "
                "so there is no one-chunk-per-key view",
            )
        elif ext.name in ("vlen-utf8", "vlen-bytes"):
            raise unsupported(metadata_key, f"{ext.name} encodes variable-length items: no raw chunk layout")
        elif kind == BB:
            bytes_codecs.append(_bytes_codec(metadata_key, ext.name, ext.configuration))
        elif kind == AB:
            raise unsupported(metadata_key, f"array->bytes codec {ext.name} is not supported here")
        else:
            raise unsupported(metadata_key, f"codec {ext.name} is not supported here")
    if endian_dtype is None:
        raise unsupported(metadata_key, "no bytes codec in the chain")
    return V3Pipeline(transposes, endian_dtype, bytes_codecs, chunks), endian_dtype

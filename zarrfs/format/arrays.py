"""What an array is, for a decoded view: shape, chunks, dtype, fill value, chunk codecs.

:func:`array_info` reads the metadata at a folder (v3 ``zarr.json``, v2 ``.zarray`` or the v1
root ``meta``); :func:`find_array` finds the array enclosing a key. An :class:`ArrayInfo` can
always name and parse its chunk keys; decoding and encoding chunks raises
:class:`UnsupportedArray` for arrays outside the supported subset (see :attr:`unsupported`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .array_grid import ArrayGrid
from .chunk_codecs import V2Pipeline, V3Pipeline, unsupported, v2_pipeline, v3_pipeline
from .chunk_keys import ChunkGrid, grid_from_v2, grid_from_v3
from .errors import ChunkSizeError, FormatError, Report, UnsupportedArray, error
from .nodes import ARRAY, UNKNOWN, GetMany, Getter, Node, enclosing_node, node_at
from .v1_metadata import check_v1_meta, v1_compressor_config
from .v2_dtypes import decode_fill_value as decode_v2_fill
from .v2_dtypes import parse_dtype
from .v2_metadata import check_zarray
from .v3_dtypes import decode_fill_value as decode_v3_fill
from .v3_dtypes import parse_data_type
from .v3_metadata import check_zarr_json


@dataclass
class ArrayInfo:
    """One array as the decoded view sees it.

    ``dtype`` is the NumPy dtype of the raw chunk bytes (for v3, little-endian unless the
    ``bytes`` codec says big; ``None`` when the type has no NumPy form), ``order`` the layout of
    those bytes (``"C"`` for v3, whose ``transpose`` codec is undone by decoding), ``fill_value``
    the decoded NumPy scalar or ``None``. ``unsupported`` holds the reason chunks cannot be
    decoded, or ``None``.
    """

    prefix: str
    zarr_format: int
    metadata_key: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype | None
    order: str
    fill_value: Any
    separator: str
    key_encoding: str
    unsupported: str | None = None
    _pipeline: V2Pipeline | V3Pipeline | None = field(default=None, repr=False)

    @property
    def grid(self) -> ChunkGrid:
        """The chunk grid and key spelling of this array."""
        return ChunkGrid(self.shape, self.chunks, self.separator, self.key_encoding)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of chunks along each dimension."""
        return self.grid.grid_shape

    def _require_supported(self) -> None:
        if self.unsupported is not None:
            raise unsupported(self.metadata_key, self.unsupported)

    def chunk_nbytes(self) -> int:
        """Size of one full raw chunk: ``prod(chunks) * itemsize``."""
        self._require_supported()
        return math.prod(self.chunks) * self.dtype.itemsize

    def decode_chunk(self, encoded: bytes) -> bytes:
        """Stored chunk bytes -> the raw bytes of the full chunk, in :attr:`order`.

        Raises :class:`UnsupportedArray` for unsupported arrays and :class:`FormatError` when the
        stored bytes do not decode to a chunk of the right size (corrupt or foreign data).
        """
        self._require_supported()
        try:
            raw = self._pipeline.decode(bytes(encoded))
        except Exception as exc:
            raise FormatError(
                error(
                    self.metadata_key,
                    "chunk.decode",
                    f"stored chunk does not decode: {type(exc).__name__}: {exc}",
                )
            ) from None
        if len(raw) != self.chunk_nbytes():
            raise FormatError(
                error(
                    self.metadata_key,
                    "chunk.decoded-size",
                    f"chunk decodes to {len(raw)} bytes, expected {self.chunk_nbytes()}",
                )
            )
        return raw

    def encode_chunk(self, raw: bytes) -> bytes:
        """The raw bytes of one full chunk -> the bytes to store (filters + compressor).

        Raises :class:`ChunkSizeError` when ``len(raw) != chunk_nbytes()``.
        """
        self._require_supported()
        n = self.chunk_nbytes()
        if len(raw) != n:
            raise ChunkSizeError(
                error(self.metadata_key, "chunk.raw-size", f"a raw chunk has {n} bytes, got {len(raw)}")
            )
        return self._pipeline.encode(bytes(raw))

    def fill_chunk(self) -> bytes:
        """The raw bytes of a chunk that was never written (all ``fill_value``, or zeros)."""
        self._require_supported()
        count = math.prod(self.chunks)
        if self.fill_value is None:
            return bytes(count * self.dtype.itemsize)
        return np.full(count, self.fill_value, dtype=self.dtype).tobytes()

    @property
    def layout(self) -> ArrayGrid:
        """Where this array's chunks are (what the mount's read-ahead uses)."""
        return ArrayGrid(self.prefix, self.grid)

    def chunk_coords(self, key: str) -> tuple[int, ...] | None:
        """Grid coordinates of the store key ``key``, or ``None`` if it is not one of our chunks."""
        return self.layout.chunk_coords(key)

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The store key of the chunk at ``coords``."""
        return self.layout.chunk_key(coords)


def _invalid(problems: list) -> FormatError:
    first = next(p for p in problems if p.is_error)
    return FormatError(first, problems)


def _from_v2(node: Node) -> ArrayInfo:
    doc = node.doc
    if node.zarr_format == 2:
        r = Report(node.metadata_key, "zarray")
        check_zarray(doc, r)
    else:
        r = Report(node.metadata_key, "meta")
        check_v1_meta(doc, r)
    dtype = None if r.has_errors else parse_dtype(doc["dtype"])
    if r.has_errors:
        raise _invalid(r.problems)
    grid = grid_from_v2(doc)
    if node.zarr_format == 1:
        filters, compressor = None, v1_compressor_config(doc["compression"], doc.get("compression_opts"))
    else:
        filters, compressor = doc["filters"], doc["compressor"]
    info = ArrayInfo(
        prefix=node.prefix,
        zarr_format=node.zarr_format,
        metadata_key=node.metadata_key,
        shape=grid.shape,
        chunks=grid.chunks,
        dtype=dtype,
        order=doc["order"],
        fill_value=decode_v2_fill(doc["fill_value"], dtype),
        separator=grid.separator,
        key_encoding=grid.encoding,
    )
    try:
        info._pipeline = v2_pipeline(node.metadata_key, filters, compressor, dtype, grid.chunks, doc["order"])
    except UnsupportedArray as exc:
        info.unsupported = exc.problem.value
    return info


def _from_v3(node: Node) -> ArrayInfo:
    doc = node.doc
    r = Report(node.metadata_key, "zarr.json")
    check_zarr_json(doc, r)
    if r.has_errors:
        raise _invalid(r.problems)
    dt = parse_data_type(doc["data_type"])
    grid = grid_from_v3(doc)
    if grid is None:
        raise unsupported(node.metadata_key, "unknown chunk grid, chunk key encoding or storage transformer")
    info = ArrayInfo(
        prefix=node.prefix,
        zarr_format=3,
        metadata_key=node.metadata_key,
        shape=grid.shape,
        chunks=grid.chunks,
        dtype=dt.dtype,
        order="C",
        fill_value=decode_v3_fill(doc["fill_value"], dt),
        separator=grid.separator,
        key_encoding=grid.encoding,
    )
    try:
        info._pipeline, info.dtype = v3_pipeline(node.metadata_key, doc["codecs"], dt, grid.chunks)
    except UnsupportedArray as exc:
        info.unsupported = exc.problem.value
    return info


def info_from_node(node: Node) -> ArrayInfo:
    """Build the :class:`ArrayInfo` of an array node already read by :mod:`nodes`."""
    if node.kind != ARRAY:
        raise FormatError(
            error(node.metadata_key, "array.metadata-invalid", "metadata is not readable array metadata")
        )
    return _from_v3(node) if node.zarr_format == 3 else _from_v2(node)


def array_info(array_prefix: str, get: Getter) -> ArrayInfo | None:
    """The array whose metadata is in folder ``array_prefix``; ``None`` if it is not an array.

    Raises :class:`FormatError` when the metadata is there but invalid, and
    :class:`UnsupportedArray` when not even the chunk grid is known (a v3 grid, key encoding or
    storage transformer this layer does not implement). Arrays whose chunks cannot be decoded
    are returned with :attr:`ArrayInfo.unsupported` set; their ``decode_chunk``/``encode_chunk``
    raise :class:`UnsupportedArray`.
    """
    node = node_at(array_prefix, get)
    if node is None or node.kind not in (ARRAY, UNKNOWN):
        return None
    return info_from_node(node)


def find_array(key: str, get: Getter, get_many: GetMany | None = None) -> tuple[str, ArrayInfo] | None:
    """The array enclosing ``key`` (its folder or any folder above, up to the first group).

    Returns ``(prefix, info)`` or ``None``; raises like :func:`array_info` for that array's
    metadata. Whether ``key`` is one of its chunks is :meth:`ArrayInfo.chunk_coords`'s call.
    ``get_many`` batches the lookups (see :func:`zarrfs.format.nodes.enclosing_node`).
    """
    node = enclosing_node(key, get, get_many)
    if node is None or node.kind not in (ARRAY, UNKNOWN):
        return None
    return node.prefix, info_from_node(node)

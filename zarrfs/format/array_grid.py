"""Where an array's chunks are: its folder and chunk grid, read without its codecs.

The mount's read-ahead needs of an array only the key of the chunk after another. The whole
:class:`zarrfs.format.arrays.ArrayInfo` brings numpy and numcodecs (a fifth of a second to
import on an idle machine, a second on a busy one), which a fresh mount would pay at its
second chunk read; the grid parsers need neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chunk_keys import ChunkGrid, ChunkKeyError, grid_from_v2, grid_from_v3
from .keys import is_metadata_key, is_temporary, relative_to
from .nodes import ARRAY, GetMany, Getter, enclosing_node


@dataclass(frozen=True)
class ArrayGrid:
    """The chunk grid of the array in folder :attr:`prefix`, and its chunks' keys."""

    prefix: str
    grid: ChunkGrid

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of chunks along each dimension."""
        return self.grid.grid_shape

    def chunk_coords(self, key: str) -> tuple[int, ...] | None:
        """Grid coordinates of the store key ``key``, or ``None`` if it is not one of our chunks."""
        rel = relative_to(key, self.prefix)
        if rel is None or is_metadata_key(key) or is_temporary(key):
            return None
        try:
            return self.grid.parse(rel)
        except ChunkKeyError:
            return None

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The store key of the chunk at ``coords``."""
        rel = self.grid.key(tuple(coords))
        return f"{self.prefix}/{rel}" if self.prefix else rel


def find_grid(key: str, get: Getter, get_many: GetMany | None = None) -> ArrayGrid | None:
    """The grid of the array enclosing ``key`` (as :func:`zarrfs.format.arrays.find_array`
    finds it), or ``None``: no array, or metadata without a usable grid."""
    node = enclosing_node(key, get, get_many)
    if node is None or node.kind != ARRAY:
        return None
    grid = grid_from_v3(node.doc) if node.zarr_format == 3 else grid_from_v2(node.doc)
    return None if grid is None else ArrayGrid(node.prefix, grid)

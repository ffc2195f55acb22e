"""Read-ahead of chunks for readers that open a Zarr array's chunks in grid order: the next chunks
come in the batch of an open, dropped when the change feed names them (their values on Redis,
names and sizes elsewhere; docs/architecture.md, "Design notes by module")."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

ARRAYS = 64  # arrays whose grid and last chunk read are remembered
DEPTH = 8  # chunks read ahead of a reader in grid order
MAX_BYTES = 32 << 20  # bytes held in all
MAX_VALUE = 4 << 20  # the largest chunk held
MAX_NODES = 4096  # entries held in all (names and sizes only: no bytes to bound them)


#: Chunks read ahead where the mount reads ahead by default (``-o chunks_ahead=``).
DEFAULT_CHUNKS_AHEAD = 8

class Readahead:
    """Chunks read ahead of a reader in grid order, and what tells such a reader (see
    docs/architecture.md). ``find_array(key)`` is the enclosing array of ``key``
    (:class:`zarrfs.format.arrays.ArrayInfo`, or None), asked once per folder; ``values``:
    whether the chunks' content is read ahead and serves opens, or only their nodes."""

    def __init__(
        self,
        find_array: Callable[[str], Any],
        depth: int = DEPTH,
        max_bytes: int = MAX_BYTES,
        max_value: int = MAX_VALUE,
        values: bool = True,
    ) -> None:
        self.find_array = find_array
        self.values = values
        self.depth = depth
        self.max_bytes = max_bytes
        self.max_value = max_value
        # key -> (node, value); the value is None where only nodes are read ahead
        self.entries: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self.held = 0  # bytes of the values in entries
        # folder -> (array or None, coordinates of the chunk last opened in it)
        self.folders: OrderedDict[str, list[Any]] = OrderedDict()
        self.served = 0  # opens answered from here (for tests and stats)

    # ------------------------------------------------------------------ answers
    def node(self, key: str) -> Any:
        """The node of ``key`` if it was read ahead (a lookup), else None."""
        entry = self.entries.get(key)
        return None if entry is None else entry[0]

    def take(self, key: str) -> tuple[Any, Any] | None:
        """``(node, value)`` of ``key`` if its value was read ahead, for its open (served
        once)."""
        entry = self.entries.get(key)
        if entry is None or entry[1] is None:
            return None
        del self.entries[key]
        self.held -= len(entry[1])
        self.served += 1
        self._opened(key)
        return entry

    def opening(self, key: str) -> list[str]:
        """Where only nodes are read ahead: ``key`` is being opened (its open reads it, so its
        entry goes); the chunks whose nodes to probe in the same batch (:meth:`plan`)."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.served += 1
        return self.plan(key)

    # ------------------------------------------------------------------ reading ahead
    def plan(self, key: str) -> list[str]:
        """The chunks to read with ``key``, which is being opened: the next ones in grid order
        when the chunk opened before it in its array was the one before it; else none."""
        folder = key.rpartition("/")[0]
        state = self.folders.get(folder)
        if state is None:
            state = [None, None, False]  # array, last coordinates, array looked up
            self.folders[folder] = state
            while len(self.folders) > ARRAYS:
                self.folders.popitem(last=False)
        else:
            self.folders.move_to_end(folder)
        last = state[1]
        if state[2] and state[0] is None:
            return []  # not in an array
        if last is None:
            state[1] = ()  # the first open here: look the array up at the second
            return []
        if not state[2]:
            state[2] = True
            try:
                state[0] = self.find_array(key)
            except Exception:  # noqa: BLE001 - metadata this layer cannot read: no readahead
                state[0] = None
            if state[0] is None:
                return []
        array = state[0]
        coords = array.chunk_coords(key)
        state[1] = coords
        if coords is None or last == () or _next(last, array.grid_shape) != coords:
            return []
        out = []
        nxt: tuple[int, ...] | None = coords
        for _ in range(self.depth):
            nxt = _next(nxt, array.grid_shape)
            if nxt is None:
                break
            chunk = array.chunk_key(nxt)
            if chunk not in self.entries:
                out.append(chunk)
        return out

    def keep(self, found: Iterable[tuple[str, Any, Any]]) -> None:
        """Hold ``(key, node, value)`` read ahead: reading values, one whose value is None or
        too large is not held; reading nodes only, the value is not kept."""
        for key, node, value in found:
            if self.values and (value is None or len(value) > self.max_value):
                continue
            if node is None:
                continue
            old = self.entries.pop(key, None)
            if old is not None and old[1] is not None:
                self.held -= len(old[1])
            if self.values:
                self.entries[key] = (node, value)
                self.held += len(value)
            else:
                self.entries[key] = (node, None)
        while (self.held > self.max_bytes or len(self.entries) > MAX_NODES) and self.entries:
            _, (_, value) = self.entries.popitem(last=False)
            if value is not None:
                self.held -= len(value)

    def _opened(self, key: str) -> None:
        """Note ``key`` as the last chunk opened in its array (an open answered from here)."""
        state = self.folders.get(key.rpartition("/")[0])
        if state is not None and state[0] is not None:
            state[1] = state[0].chunk_coords(key)

    # ------------------------------------------------------------------ dropping
    def forget(self, keys: Iterable[str] | None = None) -> None:
        """Drop what was read of ``keys`` (None: everything, and the arrays' grids)."""
        if keys is None:
            self.entries.clear()
            self.held = 0
            self.folders.clear()
            return
        for key in keys:
            entry = self.entries.pop(key, None)
            if entry is not None and entry[1] is not None:
                self.held -= len(entry[1])
            name = key.rpartition("/")[2]
            if name in (".zarray", "zarr.json", ".zgroup", ".zmetadata"):  # a grid may change
                self.folders.clear()


def _next(coords: tuple[int, ...] | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The chunk after ``coords`` in C order over a grid of ``shape``; None after the last."""
    if coords is None or len(coords) != len(shape):
        return None
    out = list(coords)
    for i in range(len(out) - 1, -1, -1):
        out[i] += 1
        if out[i] < shape[i]:
            return tuple(out)
        out[i] = 0
    return None

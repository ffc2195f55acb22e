"""What a mount's writers changed in an open file since it was last brought up to date.

An open file is the version it was read at (its base) with this mount's pending writes on top. A
commit lays those changes on the newest stored version rather than storing that private copy, so
nothing another mount committed since the base is lost outside the ranges written here.
:class:`Extents` records them; the same ranges tell which parts of a large file a commit touches:

* ``ranges``: the byte ranges written (an extension by ``ftruncate`` or ``fallocate`` writes
  zeros), sorted, disjoint;
* ``cut``: the smallest size a truncation left since the base; from there on the file is this
  mount's alone, so after a truncation to 0 (``O_TRUNC``, as Zarr clients, ``cp`` and ``rsync``
  do) the commit needs no read;
* ``append_from``: where ``O_APPEND`` writes begin; they go at the end of the newest version.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any


class Extents:
    """The changes this mount made to one open file since its base version (see the module)."""

    __slots__ = ("ranges", "cut", "append_from")

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.cut: int | None = None
        self.append_from: int | None = None

    def clear(self) -> None:
        """Nothing changed since the base (a commit or a refresh made it the newest version)."""
        self.ranges = []
        self.cut = None
        self.append_from = None

    @property
    def whole(self) -> bool:
        """Whether the file is this mount's alone (truncated to 0 since the base)."""
        return self.cut == 0

    @property
    def empty(self) -> bool:
        """Whether nothing was changed."""
        return not self.ranges and self.cut is None and self.append_from is None

    def wrote(self, start: int, end: int, append: bool = False) -> None:
        """Bytes ``[start, end)`` were written (``append``: by an ``O_APPEND`` write, at the
        end of the file as this mount saw it)."""
        if end <= start:
            return
        if append and (self.append_from is None or start >= self.append_from):
            if self.append_from is None:
                self.append_from = start
            return
        self._settle_appends(start)
        self._add(start, end)

    def truncated(self, length: int, size: int) -> None:
        """The file of ``size`` bytes was cut or extended to ``length``."""
        self._settle_appends(min(length, size))
        if length < size:
            self.cut = length if self.cut is None else min(self.cut, length)
            self.ranges = [(s, min(e, length)) for s, e in self.ranges if s < length]
        elif length > size:
            self._add(size, length)

    def _settle_appends(self, at: int) -> None:
        """A change at ``at`` or beyond the appended bytes: they stay where they are now."""
        if self.append_from is not None and at >= self.append_from:
            self._add(self.append_from, 1 << 62)  # clipped to the size by lay()
            self.append_from = None

    def _add(self, start: int, end: int) -> None:
        ranges = self.ranges
        i = bisect.bisect_left(ranges, (start, start))
        if i and ranges[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(ranges) and ranges[j][0] <= end:
            start, end = min(start, ranges[j][0]), max(end, ranges[j][1])
            j += 1
        ranges[i:j] = [(start, end)]

    def lay(self, newest: Any, size: int, read: Callable[[int, int], Any]) -> tuple[bytearray, int | None]:
        """The content this mount's changes make of ``newest`` (the newest stored version):
        ``size`` and ``read(offset, count)`` are this mount's copy. Returns it, and where the
        appended bytes begin in it (None: no append)."""
        body = size if self.append_from is None else min(self.append_from, size)
        if self.cut is not None:
            out = bytearray(memoryview(newest)[: self.cut])
            if len(out) < self.cut:
                out += bytes(self.cut - len(out))
            if body > self.cut:
                out += read(self.cut, body - self.cut)
        else:
            out = bytearray(newest)
        for start, end in self.ranges:
            end = min(end, body)
            if start >= end:
                continue
            if start > len(out):
                out += bytes(start - len(out))
            out[start:end] = read(start, end - start)
        appended = None
        if self.append_from is not None:
            appended = len(out)
            if size > self.append_from:
                out += read(self.append_from, size - self.append_from)
        return out, appended

    def moved_appends(self, appended: int | None) -> None:
        """After a rebase: the appended bytes now begin at ``appended``."""
        self.append_from = appended

"""A streaming folder listing for ``readdir`` with offsets.

The kernel reads a folder in several calls, each resuming at the offset of the last entry it
kept. A :class:`DirListing` holds one window of entries fetched from the tree and a resume
token, so a folder of a million keys is never built as one list; a rewind (``rewinddir``,
``seekdir`` backwards) starts over.
"""

from __future__ import annotations

from collections.abc import Iterator

from zarrfs.fs.namespace import DIR, FILE, Tree

FIRST_BATCH = 128
_EXTRA = "\0extra"  # a resume token no key can produce: the stored entries are done
MAX_BATCH = 4096


class DirListing:
    """The entries of one open folder, with offsets: ``.`` is 1, ``..`` is 2, then 3, 4, ..."""

    def __init__(self, tree: Tree, key: str, extra: list[str] | None = None) -> None:
        self.tree = tree
        self.key = key
        # Files created through the mount and not stored yet: listed after the stored ones.
        self.extra = [(name, FILE, name) for name in extra or ()]
        self._reset()

    def _reset(self) -> None:
        self.window: list[tuple[str, int, str]] = []
        self.window_start = 0
        self.token: str | None = None
        self.exhausted = False
        self.batch = FIRST_BATCH

    def _fetch(self) -> bool:
        if self.exhausted:
            return False
        if self.token is _EXTRA:
            self.window_start += len(self.window)
            self.window = self.extra
            self.exhausted = True
            return bool(self.extra)
        got = self.tree.list_dir(self.key, after=self.token, limit=self.batch)
        self.window_start += len(self.window)
        self.window = got
        if got:
            self.token = got[-1][2]
        if len(got) < self.batch:
            if self.extra:
                self.token = _EXTRA
                return bool(got) or self._fetch()
            self.exhausted = True
        self.batch = min(self.batch * 4, MAX_BATCH)
        return bool(got)

    def entries(self, offset: int) -> Iterator[tuple[str, int, int]]:
        """Yield ``(name, kind, offset)`` for every entry after ``offset``."""
        if offset < 1:
            yield ".", DIR, 1
        if offset < 2:
            yield "..", DIR, 2
        want = max(0, offset - 2)
        if want < self.window_start:
            self._reset()
        while True:
            i = want - self.window_start
            if i < len(self.window):
                name, kind, _ = self.window[i]
                want += 1
                yield name, kind, want + 2
            elif not self._fetch():
                return

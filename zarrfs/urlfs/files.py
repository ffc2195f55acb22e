"""A key opened as a file (``fsspec.open("lmdb:///x.lmdb/t/zarr.json")``): read by byte ranges,
written whole at close in one transaction."""

from __future__ import annotations

from typing import Any

from fsspec.spec import AbstractBufferedFile


class KeyFile(AbstractBufferedFile):
    """One key's value: reads fetch byte ranges; a write keeps the bytes and stores them at
    close, as one value (nothing is stored if the writer never closes)."""

    def __init__(self, fs: Any, path: str, mode: str, block_size: Any, autocommit: bool, **kw: Any):
        self._pieces: list[bytes] = []
        super().__init__(fs, path, mode=mode, block_size=block_size, autocommit=autocommit, **kw)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start, end)

    def _initiate_upload(self) -> None:
        self._pieces = []

    def _upload_chunk(self, final: bool = False) -> bool:
        self._pieces.append(self.buffer.getvalue())
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self) -> None:
        """Store what was written."""
        self.fs.pipe_file(self.path, b"".join(self._pieces))
        self._pieces = []

    def discard(self) -> None:
        """Drop what was written."""
        self._pieces = []

"""The zip driver's declaration (``zip://``): :data:`ABOUT`, and what a zip archive is on disk
(:class:`ZipFiles`): a file starting with a member's local header or, empty, with the end of
its central directory."""

from __future__ import annotations

import os

from ..about import About
from ..dbfiles import DatabaseFiles


class ZipFiles(DatabaseFiles):
    """A zip archive on disk; see the module docstring."""

    def holds(self, path: str) -> bool:
        return os.path.isfile(path) and self.head(path, 4) in (b"PK\x03\x04", b"PK\x05\x06")


ABOUT = About(
    driver="zarrfs.backends.zip.driver:ZipDriver",
    schemes=("zip",),
    kind="a zip archive",
    files=ZipFiles(),
    secrets=(),
    path_options=(),
)

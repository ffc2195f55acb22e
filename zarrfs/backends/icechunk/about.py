"""The Icechunk driver's declaration (``icechunk://``): :data:`ABOUT`, and what an Icechunk
repository is on local storage (:class:`IcechunkFiles`): a folder holding ``snapshots``; a URL's
``repo@tag.v1`` (ZEP 8's version names) names the repository ``repo``."""

from __future__ import annotations

import os

from ..about import About
from ..dbfiles import DatabaseFiles
from ..versionpath import split_version


class IcechunkFiles(DatabaseFiles):
    """An Icechunk repository on disk; see the module docstring."""

    def holds(self, path: str) -> bool:
        return os.path.isdir(os.path.join(path, "snapshots"))

    def where(self, path: str) -> str:
        return split_version(path)[0]


ABOUT = About(
    driver="zarrfs.backends.icechunk.driver:IcechunkDriver",
    schemes=("icechunk",),
    kind="an Icechunk repository",
    files=IcechunkFiles(),
    options=("branch", "tag", "snapshot"),
    secrets=(),
    path_options=(),
    pip={"icechunk": "zarrfs[icechunk]"},
)

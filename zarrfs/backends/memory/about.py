"""The in-process driver's declaration (``memory://name``, for tests): :data:`ABOUT`."""

from __future__ import annotations

from ..about import About

ABOUT = About(
    driver="zarrfs.backends.memory.driver:MemoryDriver",
    schemes=("memory",),
    kind="an in-process store",
    secrets=(),
    path_options=(),
)

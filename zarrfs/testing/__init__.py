"""Conformance kits: the tests that zarrfs runs on its own drivers and filesystem, for a
third-party driver (or another implementation) to run on its own.

``DriverConformance`` (``zarrfs.testing.driver``) checks a driver against the contract of
``zarrfs.backends.base``; ``FilesystemConformance`` (``zarrfs.testing.filesystem``) checks a
mounted filesystem. Both are pytest classes to subclass; see their docstrings.
"""

from __future__ import annotations

from typing import Any

from .driver import DriverConformance

__all__ = ["DriverConformance", "FilesystemConformance"]


def __getattr__(name: str) -> Any:
    # FilesystemConformance is imported on first use, not with the package: its module needs
    # the FUSE side of zarrfs, which a driver's tests do not, and it may be absent from a tree
    # that has only the driver kit.
    if name == "FilesystemConformance":
        from .filesystem import FilesystemConformance

        return FilesystemConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Zip archives as folders: ``zip:///path/data.zip`` (see ``driver``)."""

from .driver import ZipDriver

__all__ = ["ZipDriver"]

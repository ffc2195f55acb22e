"""Icechunk repositories as folders: ``icechunk:///path/repo?branch=main`` (see ``driver``)."""

from .driver import IcechunkDriver

__all__ = ["IcechunkDriver"]

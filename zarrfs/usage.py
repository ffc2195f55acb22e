"""The error of a bad command line or mount option, in a module of its own so that every
command can name it without importing what the options configure."""

from __future__ import annotations


class UsageError(Exception):
    """A bad command line or mount option: reported as one line, exit status 2."""

"""The command line: ``zarrfs`` and its commands (the parser in :mod:`zarrfs.cli.main`, each
command in a module of its own). ``main`` is imported when called, so that a module of the
package (``python -m zarrfs.cli.helptext``) does not bring in the whole command line."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the command line: the ``zarrfs`` console script and ``python -m zarrfs``."""
    from zarrfs.cli.main import main as run

    return run(argv)

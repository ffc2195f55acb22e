"""The layout of the source tree: every module of ``zarrfs`` stays under 500 lines, and the drivers
(``zarrfs.backends``) never reach up into the filesystem or FUSE layers."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "zarrfs"
MODULE_LIMIT = 500  # lines, below


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_every_module_is_under_500_lines():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 20
    long = {str(p.relative_to(PACKAGE)): lines(p) for p in modules if lines(p) >= MODULE_LIMIT}
    assert long == {}, f"modules of {MODULE_LIMIT} lines or more"


def imported(path: Path, package: str) -> set[str]:
    """The absolute names of the modules (and of the names in them) that ``path``, a module of
    ``package``, imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def test_the_backends_import_neither_the_filesystem_nor_fuse():
    for path in sorted((PACKAGE / "backends").rglob("*.py")):
        for name in imported(path, "zarrfs.backends"):
            assert name.split(".")[:2] not in (["zarrfs", "fs"], ["zarrfs", "fuse"]), (path.name, name)

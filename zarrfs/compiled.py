"""The listing's loop compiled: which of zarrfs's modules ``scripts/build_compiled.py`` builds
with Cython, and the choice, at import, between a module's build and its source.

A built module is an extension file beside its source (``dirreq.cpython-311-...so`` beside
``dirreq.py``), which Python's import prefers. It is used only while it is the build of the
source beside it: the build records each source's SHA-256 in ``compiled.json``, and a module
whose source changed since (or every module, with ``ZARRFS_PURE=1`` in the environment) is
imported from its source; so is a module no longer listed whose old build is still there (a
checkout updated without the build run again). Without a build (no compiler, a wheel, a
checkout never set up) every module runs from its source. The modules are compiled as they are
written, with no C types of their own. Only the listing's modules are: they run one loop over
thousands of names, where compiled code pays; the rest of a request's road ran slower compiled
through a mount than interpreted, its larger code missing the caches between requests
(docs/performance.md, "Compiled where it loops")."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

#: The modules compiled: those of a listing's loop over its names (a folder request's replies,
#: the listing's windows, LMDB's cursor pages, attribute records, names), named from the
#: package's root.
MODULES = (
    "fuse.dirreq",
    "fs.listing",
    "fs.names",
    "fs.sidedata",
    "backends.lmdb.scan",
    "backends.lmdb.leaf",
)
#: Set (to anything but "" or "0") to import every module from its source.
PURE_ENV = "ZARRFS_PURE"
PACKAGE = Path(__file__).resolve().parent
#: What the build wrote: the compiler's module suffix and each compiled source's SHA-256.
MANIFEST = PACKAGE / "compiled.json"
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def source_of(module: str) -> Path:
    """The source file of ``module`` (named from the package's root, as in :data:`MODULES`)."""
    return PACKAGE.joinpath(*module.split(".")).with_suffix(".py")


def digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def pure() -> bool:
    """Whether the environment asks for the sources alone."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def loaded() -> list[str]:
    """The modules of :data:`MODULES` imported so far from their builds."""
    out = []
    for module in MODULES:
        found = sys.modules.get(f"{__package__}.{module}")
        origin = getattr(found, "__file__", None) or ""
        if found is not None and not origin.endswith(".py"):
            out.append(module)
    return out


class _Choice:
    """A finder ahead of Python's own: it answers for the modules of :data:`MODULES` whose build
    is not to be used (the environment asks for sources, no build, or a build of another
    source) with their source; for the others it answers nothing and Python's finder picks
    the build."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.names = {f"{package}.{module}": module for module in MODULES}
        self.built: dict[str, str] = {}
        self._decided: dict[str, bool] = {}  # uses_build's answers: a source is hashed once
        try:
            manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
            if manifest.get("suffix") == importlib.machinery.EXTENSION_SUFFIXES[0]:
                self.built = dict(manifest.get("sources", {}))
        except (OSError, ValueError, AttributeError):
            pass

    def uses_build(self, module: str) -> bool:
        """Whether ``module`` is imported from its build: one of this source (as it was when
        first asked: what this process imported), and no ``ZARRFS_PURE``."""
        if pure() or module not in self.built:
            return False
        decided = self._decided.get(module)
        if decided is None:
            try:
                decided = digest(source_of(module).read_bytes()) == self.built[module]
            except OSError:
                decided = False
            self._decided[module] = decided
        return decided

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        module = self.names.get(fullname)
        if module is None:
            return self._unlisted(fullname)
        if self.uses_build(module):
            return None  # the build is of this source: Python's finder takes it
        return importlib.util.spec_from_file_location(fullname, source_of(module))

    def _unlisted(self, fullname: str):
        """A module of the package not compiled (any more) whose old build still sits beside
        its source: the source (an old build of another source is never run); else nothing."""
        if not fullname.startswith(self.package + "."):
            return None
        source = source_of(fullname[len(self.package) + 1 :])
        if not source.exists() or not source.with_name(source.stem + _SUFFIX).exists():
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def summary() -> str:
    """What runs, in a few words (the daemon's log at each mount)."""
    if pure():
        return f"pure Python ({PURE_ENV}=1)"
    choice = next((f for f in sys.meta_path if isinstance(f, _Choice)), None)
    built = 0 if choice is None else sum(choice.uses_build(m) for m in MODULES)
    if not built:
        return "pure Python (not built: scripts/build_compiled.py)"
    if built < len(MODULES):
        changed = len(MODULES) - built
        return f"compiled, {changed} of {len(MODULES)} modules from sources changed since the build"
    return f"compiled ({built} modules)"


def install(package: str) -> None:
    """Put the choice ahead of Python's finders (once; ``zarrfs/__init__`` calls it)."""
    if not any(isinstance(f, _Choice) for f in sys.meta_path):
        sys.meta_path.insert(0, _Choice(package))

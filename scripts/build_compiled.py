"""Build the listing's loop with Cython: each module of ``zarrfs.compiled.MODULES`` compiled from a
copy of its source (in ``build/compiled``) and put beside the source, with ``zarrfs/compiled.json``
naming the sources built (``zarrfs/compiled.py`` says how a build is chosen at import).

    python scripts/build_compiled.py            build what changed since the last build
    python scripts/build_compiled.py --remove   remove the build: zarrfs runs as pure Python

``scripts/setup.sh`` runs it. A machine without a C compiler or Cython keeps the pure-Python
modules: the script says so in one line and succeeds (``--require``: it fails instead)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zarrfs import compiled  # noqa: E402

BUILD = ROOT / "build" / "compiled"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def built_file(module: str) -> Path:
    return compiled.source_of(module).with_name(module.rpartition(".")[2] + SUFFIX)


def remove() -> None:
    """Every build of a zarrfs module (also of modules no longer compiled) and the manifest."""
    for path in compiled.PACKAGE.rglob("*" + SUFFIX):
        path.unlink()
    compiled.MANIFEST.unlink(missing_ok=True)


def up_to_date(sources: dict[str, str]) -> bool:
    try:
        manifest = json.loads(compiled.MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        manifest.get("suffix") == SUFFIX
        and manifest.get("sources") == sources
        and all(built_file(m).exists() for m in sources)
    )


def build(texts: dict[str, bytes]) -> None:
    """Compile ``texts`` (module -> source) in ``build/compiled`` and put each beside its source."""
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    shutil.rmtree(BUILD, ignore_errors=True)
    extensions = []
    for module, text in texts.items():
        copy = BUILD / "src" / compiled.source_of(module).relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(text)
        extensions.append(Extension(f"zarrfs.{module}", [str(copy)], extra_compile_args=["-O2", "-g0"]))
    here = os.getcwd()
    os.chdir(BUILD / "src")
    try:
        # annotation_typing off: an annotation is a hint here, never a C type (node IDs and
        # offsets are Python integers of any size).
        extensions = cythonize(
            extensions,
            language_level=3,
            quiet=True,
            nthreads=os.cpu_count() or 1,
            compiler_directives={"annotation_typing": False, "binding": True},
        )
        command = Distribution({"ext_modules": extensions}).get_command_obj("build_ext")
        command.build_lib, command.build_temp = str(BUILD / "lib"), str(BUILD / "tmp")
        command.parallel = os.cpu_count() or 1
        command.ensure_finalized()
        command.run()
    finally:
        os.chdir(here)
    for module in texts:
        made = BUILD / "lib" / "zarrfs" / Path(*module.split(".")).with_suffix(SUFFIX)
        shutil.copyfile(made, built_file(module))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remove", action="store_true", help="remove the build: zarrfs runs as pure Python")
    parser.add_argument("--require", action="store_true", help="fail when the modules cannot be built")
    args = parser.parse_args(argv)
    if args.remove:
        remove()
        print("build_compiled: removed; zarrfs runs as pure Python")
        return 0
    texts = {m: compiled.source_of(m).read_bytes() for m in compiled.MODULES}
    sources = {m: compiled.digest(text) for m, text in texts.items()}
    if up_to_date(sources):
        return 0
    started = time.monotonic()
    remove()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            build(texts)
    except (Exception, SystemExit) as exc:  # no Cython, no compiler, a failed build
        remove()
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        BUILD.mkdir(parents=True, exist_ok=True)
        (BUILD / "build.log").write_text(log.getvalue())
        print(f"build_compiled: not built ({reason}; build/compiled/build.log): zarrfs runs as pure Python")
        return 1 if args.require else 0
    compiled.MANIFEST.write_text(json.dumps({"suffix": SUFFIX, "sources": sources}, indent=1) + "\n")
    n = len(texts)
    print(f"build_compiled: {n} module{'s' * (n != 1)} compiled in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

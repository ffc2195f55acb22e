"""The listing's loop compiled (``scripts/build_compiled.py``, ``zarrfs/compiled.py``): where it is
built every listed module runs from its build; ``ZARRFS_PURE=1`` and a source changed since the
build run the source. The pure-Python road itself is tested by the quick tier run with
``ZARRFS_PURE=1`` (scripts/test.sh)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.mounting import unavailable
from zarrfs import compiled

ROOT = Path(__file__).resolve().parents[2]
_IMPORT_ALL = (
    "import importlib, json\n"
    "from zarrfs import compiled\n"
    "mods = {m: importlib.import_module('zarrfs.' + m) for m in compiled.MODULES}\n"
    "print(json.dumps({'loaded': compiled.loaded(), 'files': {m: mods[m].__file__ for m in mods},"
    " 'changed': hasattr(mods.get('fuse.dirreq'), 'CHANGED')}))\n"
)


def _imports(path: Path, **env: str) -> dict:
    """What a fresh interpreter with ``path`` first on its path imports of the listed modules."""
    environ = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    environ.update(env, PYTHONPATH=str(path))
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL], env=environ, capture_output=True, text=True, check=True, cwd=path
    )
    return json.loads(out.stdout)


def _built() -> None:
    if not compiled.MANIFEST.exists():
        unavailable("the compiled modules are not built (scripts/build_compiled.py)")


def test_where_built_every_listed_module_runs_from_its_build() -> None:
    _built()
    seen = _imports(ROOT)
    assert seen["loaded"] == list(compiled.MODULES)
    assert not any(f.endswith(".py") for f in seen["files"].values())


def test_pure_in_the_environment_imports_every_source() -> None:
    seen = _imports(ROOT, **{compiled.PURE_ENV: "1"})
    assert seen["loaded"] == []
    assert seen["files"] == {m: str(compiled.source_of(m)) for m in compiled.MODULES}


def test_a_source_changed_since_the_build_runs_as_written(tmp_path: Path) -> None:
    """A build of an older source is never run: the module changed is imported from its source,
    the others from their builds."""
    _built()
    shutil.copytree(ROOT / "zarrfs", tmp_path / "zarrfs", ignore=shutil.ignore_patterns("__pycache__"))
    changed = tmp_path / "zarrfs" / "fuse" / "dirreq.py"
    changed.write_text(changed.read_text() + "\nCHANGED = True\n")
    seen = _imports(tmp_path)
    assert seen["changed"]
    assert seen["loaded"] == [m for m in compiled.MODULES if m != "fuse.dirreq"]
    assert seen["files"]["fuse.dirreq"] == str(changed)


def test_an_old_build_of_a_module_no_longer_compiled_is_never_run(tmp_path: Path) -> None:
    """A checkout updated without the build run again keeps the builds of modules taken off
    the list: their sources run (here the old build is not even a module: importing it would
    fail)."""
    shutil.copytree(ROOT / "zarrfs", tmp_path / "zarrfs", ignore=shutil.ignore_patterns("__pycache__"))
    assert "fuse.session" not in compiled.MODULES
    source = tmp_path / "zarrfs" / "fuse" / "session.py"
    source.with_name("session" + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"not a module")
    probe = "import zarrfs.fuse.session as m; print(m.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(source)


def _checkout(tmp_path: Path, modules: tuple[str, ...]) -> Path:
    """A copy of the package and the build script, compiling ``modules`` alone."""
    left_out = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "zarrfs", tmp_path / "zarrfs", ignore=left_out)
    (tmp_path / "zarrfs" / "compiled.json").unlink(missing_ok=True)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "build_compiled.py", tmp_path / "scripts")
    listed = tmp_path / "zarrfs" / "compiled.py"
    text = listed.read_text()
    start, end = text.index("MODULES = ("), text.index(")\n", text.index("MODULES = ("))
    listed.write_text(text[:start] + f"MODULES = {modules!r}" + text[end + 1 :])
    return tmp_path


def test_without_a_compiler_the_build_says_so_in_one_line_and_zarrfs_runs_as_written(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, ("fs.node",))
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    run = [sys.executable, "scripts/build_compiled.py"]
    out = subprocess.run(run, cwd=checkout, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and len(out.stdout.splitlines()) == 1
    assert "not built" in out.stdout and "pure Python" in out.stdout
    assert not list((checkout / "zarrfs").rglob("*.so"))
    assert not (checkout / "zarrfs" / "compiled.json").exists()
    assert _imports(checkout)["loaded"] == []
    required = subprocess.run([*run, "--require"], cwd=checkout, env=env, capture_output=True, text=True)
    assert required.returncode == 1 and len(required.stdout.splitlines()) == 1


def test_a_build_is_made_once_and_then_used(tmp_path: Path) -> None:
    """One small module built in a copy: a second run builds nothing; the build is what the
    package imports; --remove leaves the sources alone."""
    checkout = _checkout(tmp_path, ("fs.node",))
    run = [sys.executable, "scripts/build_compiled.py", "--require"]
    first = subprocess.run(run, cwd=checkout, capture_output=True, text=True)
    if first.returncode != 0 and "not built" in first.stdout:
        unavailable(f"no C compiler or Cython: {first.stdout.strip()}")
    assert first.returncode == 0 and "1 module compiled" in first.stdout
    again = subprocess.run(run, cwd=checkout, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout == ""
    assert _imports(checkout)["loaded"] == ["fs.node"]
    subprocess.run([*run[:2], "--remove"], cwd=checkout, check=True, capture_output=True)
    assert _imports(checkout)["loaded"] == []

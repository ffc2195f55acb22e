"""A second virtual environment with zarr-python 2.18, for interoperability tests.

zarr 2 and zarr 3 cannot share an environment, so the tests run small scripts in a venv created
once per machine under ``~/.cache/zarrfs-tests/zarr2-venv`` (``$XDG_CACHE_HOME`` respected), or
use the interpreter named by ``$ZARRFS_ZARR2_PYTHON``. Creating it needs PyPI; when that fails
the tests fail with the installer's output (a CI run must not skip them silently).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

# zarr 2.18.7 refuses numcodecs 0.14.0/0.14.1 and >= 0.16.
REQUIREMENTS = ["zarr==2.18.*", "numcodecs>=0.10,<0.16,!=0.14.0,!=0.14.1", "lmdb", "redis"]
CHECK = "import zarr, lmdb, redis; assert zarr.__version__.startswith('2.18'), zarr.__version__"


class Zarr2Unavailable(RuntimeError):
    """The zarr-2 environment could not be created; the message says why."""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zarrfs-tests" / "zarr2-venv"


def _works(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", CHECK], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def zarr2_python() -> str:
    """Return the path of a Python interpreter that imports zarr 2.18, lmdb and redis,
    creating the cached venv when needed; raise :class:`Zarr2Unavailable` if impossible."""
    override = os.environ.get("ZARRFS_ZARR2_PYTHON")
    if override:
        if not _works(override):
            raise Zarr2Unavailable(f"$ZARRFS_ZARR2_PYTHON={override} cannot import zarr 2.18, lmdb and redis")
        return override
    venv = _cache_dir()
    python = venv / "bin" / "python"
    stamp = venv / "zarrfs-requirements.txt"
    wanted = "\n".join(REQUIREMENTS)
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test runs (or two checkouts) must not build the same venv at once.
    with open(venv.parent / "zarr2-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == wanted and _works(str(python)):
            return str(python)
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
        ]
        for cmd in steps:
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise Zarr2Unavailable(f"creating the zarr-2 venv failed: {' '.join(cmd)}: {exc}") from exc
            if res.returncode != 0:
                raise Zarr2Unavailable(
                    f"creating the zarr-2 venv at {venv} failed (needs PyPI, or set $ZARRFS_ZARR2_PYTHON):\n"
                    f"$ {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                )
        if not _works(str(python)):
            raise Zarr2Unavailable(f"the venv at {venv} was built but cannot import zarr 2.18")
        stamp.write_text(wanted)
        return str(python)


def run(python: str, script: str, *args: str, timeout: float = 300) -> str:
    """Run ``script`` with the zarr-2 interpreter and return its stdout; raise with its stderr
    when it fails."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run(
        [python, "-c", script, *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if res.returncode != 0:
        raise AssertionError(f"zarr-2 script failed ({res.returncode}):\n{res.stderr[-5000:]}")
    return res.stdout

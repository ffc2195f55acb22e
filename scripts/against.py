"""``--against REV`` of the benchmark scripts: the same script run on an earlier commit's zarrfs,
then on this tree's, back to back, and each figure's change. ``--alternate N`` runs the two
N times each, taking turns, each round in the other order from the last (REV, this tree, this
tree, REV, ...), and compares each figure's median over its runs: a machine whose speed drifts
within minutes moves both sides alike, where one run of each puts the drift between them, and
being second in a pair (measured slower here) falls on both.

REV's files are exported (``git archive``) to a scratch folder, its modules byte-compiled and,
where this tree runs compiled modules and REV has some (``zarrfs/compiled.py``, REV's list), built
with Cython as ``scripts/build_compiled.py`` builds this tree's, and this
tree's ``scripts/`` (with the helper modules of ``tests/`` they import) copied over REV's, so
both runs are the same script; each run imports the zarrfs of its folder (``PYTHONPATH``, and
the folder as the working directory, where the daemons started by ``python -m zarrfs`` find it
too) with this interpreter and its packages.
Each run writes its figures as JSON (``--json``); the table at the end compares them.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
Rows = Callable[[dict], dict[str, tuple[float, str]]]  # a run's JSON -> name: (value, "higher"/"lower")


def query(mountpoint: str) -> dict:
    """A mount's ``zarrfs status`` figures, from this run's zarrfs (REV's too: the control
    module lived beside the daemon module before the daemon was a package)."""
    try:
        from zarrfs.daemon.control import query as ask
    except ImportError:
        from zarrfs.control import query as ask
    return ask(mountpoint)


def without_against(argv: list[str]) -> list[str]:
    """``argv`` less ``--against REV`` (or ``--against=REV``), ``--alternate N`` and any ``--json``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--against", "--json", "--alternate"):
            skip = True
        elif not arg.startswith(("--against=", "--json=", "--alternate=")):
            out.append(arg)
    return out


def medians(runs: list[dict[str, tuple[float, str]]]) -> dict[str, tuple[float, str]]:
    """Each figure's median over ``runs`` (a figure some run lacks: over those that have it)."""
    names = list(dict.fromkeys(name for run in runs for name in run))
    out = {}
    for name in names:
        values = [run[name] for run in runs if name in run]
        out[name] = (statistics.median(v for v, _ in values), values[0][1])
    return out


def export(rev: str, where: Path) -> str:
    """REV's tree in ``where`` with this tree's scripts; returns REV's short commit name."""
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", rev],
                            capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(HERE), "archive", commit], capture_output=True, check=True)
    where.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    for path in (HERE / "scripts").iterdir():
        if path.suffix in (".py", ".c"):
            shutil.copy2(path, where / "scripts" / path.name)
    # The tests' server helpers the scripts import (bench.py's PostgreSQL), as this tree has them.
    for path in (HERE / "tests").glob("*.py"):
        if not path.name.startswith(("test_", "conftest")):
            shutil.copy2(path, where / "tests" / path.name)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "zarrfs"], cwd=where, check=True,
                   stdout=subprocess.DEVNULL)
    # REV's modules built as this tree's are (``git archive`` has no builds): REV's list compiled
    # where this tree runs compiled modules and REV has some, else pure like this tree.
    if (HERE / "zarrfs" / "compiled.json").exists() and (where / "zarrfs" / "compiled.py").exists():
        built = subprocess.run([sys.executable, "scripts/build_compiled.py"], cwd=where,
                               capture_output=True, text=True)
        print(f"{commit}: {(built.stdout or built.stderr).strip().splitlines()[-1]}", flush=True)
    return commit


def run_side(code: Path, script: str, argv: list[str], out: Path) -> dict:
    """The figures of ``script`` run on the zarrfs in ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, str(code / "scripts" / script), *argv, "--json", str(out)]
    subprocess.run(cmd, cwd=code, env=env, check=True)
    return json.loads(out.read_text())


def turns(rounds: int) -> list[str]:
    """The order of the runs of ``rounds`` rounds: REV ("rev") and this tree ("new"), each
    round in the other order from the last, as a run second in a pair was slower here by
    1-11% (bf58a55 against itself, ``bench_ops.py --alternate 3``)."""
    return [side for turn in range(rounds) for side in (("rev", "new") if turn % 2 == 0 else ("new", "rev"))]


def compare(rev: str, script: str, argv: list[str], rows: Rows, rounds: int = 1) -> int:
    """Run ``script`` with ``argv`` on REV, then on this tree, ``rounds`` times taking turns;
    print the figures ``rows`` picks out of each run's JSON (name -> (value, "higher" or
    "lower" is better)) side by side, each the median of its side's runs."""
    argv = without_against(argv)
    scratch = Path(tempfile.mkdtemp(prefix="zarrfs-against-"))
    olds, news = [], []
    try:
        commit = export(rev, scratch / "rev")
        labels = {"rev": f"{rev} ({commit})", "new": f"this tree ({HERE})"}
        for i, side in enumerate(turns(rounds)):
            of = f", round {i // 2 + 1} of {rounds}" if rounds > 1 else ""
            print(f"\n== {script} on {labels[side]}{of} ==", flush=True)
            code = scratch / "rev" if side == "rev" else HERE
            figures = rows(run_side(code, script, argv, scratch / f"{side}.json"))
            (olds if side == "rev" else news).append(figures)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    old, new = medians(olds), medians(news)
    width = max(map(len, new), default=10)
    how = f"taking turns, medians of {rounds} runs each" if rounds > 1 else "back to back"
    print(f"\n{rev} ({commit}) against this tree, {how}: 'better' says which way it moved")
    print(f"| {'figure':<{width}} | {commit:>12} | {'this tree':>12} | {'change':>8} |")
    print(f"|{'-' * (width + 2)}|{'-' * 14}|{'-' * 14}|{'-' * 10}|")
    for name, (value, better) in new.items():
        before = old.get(name, (None, better))[0]
        if before is None or not before or not value:
            change = ""
        else:
            ratio = value / before
            good = ratio > 1 if better == "higher" else ratio < 1
            change = f"{ratio:.2f}x" + (" +" if good and abs(ratio - 1) > 0.05 else "")
        shown = "" if before is None else f"{before:.4g}"
        print(f"| {name:<{width}} | {shown:>12} | {value:>12.4g} | {change:>8} |")
    print("(+: better by more than 5%)")
    return 0

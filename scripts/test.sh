#!/usr/bin/env bash
# The test command: set up (scripts/setup.sh), lint, then the whole suite, real mounts included.
# scripts/test.sh --quick runs the quick tier instead (tests marked quick: tests/conftest.py,
# QUICK), every layer and every kind of driver in a few minutes, in this process.
# The whole run ends with the quick tier again under ZARRFS_PURE=1: the modules setup.sh compiled
# (zarrfs/compiled.py) run from their sources, as on a machine without a C compiler.
# Two pytest workers (pytest-xdist; ZARRFS_TEST_JOBS=N changes it, 0 runs in this process): a
# mount test keeps one core busy at a time (the test, then its daemon), so two keep both cores
# of a small machine busy. Every worker starts its own servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
.venv/bin/ruff check zarrfs tests scripts
if [ "$quick" = 1 ]; then
  exec .venv/bin/python -m pytest -ra --durations=10 -m quick "$@"
fi
# Tests marked serial (they make every mount of the machine forget its caches) run after the
# others, alone; pytest's status 5 (none of them selected) is no failure.
jobs="${ZARRFS_TEST_JOBS:-2}"
if [ "$jobs" = 0 ]; then
  exec .venv/bin/python -m pytest -ra "$@"
fi
status=0
.venv/bin/python -m pytest -ra --durations=25 -n "$jobs" -m "not serial" "$@" || status=$?
rest=0
.venv/bin/python -m pytest -ra -m serial "$@" || rest=$?
[ "$status" = 5 ] && status=0  # every test selected was a serial one
if [ "$rest" != 0 ] && [ "$rest" != 5 ]; then
  status=$rest
fi
pure=0
ZARRFS_PURE=1 .venv/bin/python -m pytest -ra -n "$jobs" -m "quick and not serial" "$@" || pure=$?
if [ "$pure" != 0 ] && [ "$pure" != 5 ]; then
  status=$pure
fi
exit "$status"

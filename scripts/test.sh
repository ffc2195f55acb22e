#!/usr/bin/env bash
# The test command: set up (scripts/setup.sh), lint, then the whole suite, real mounts included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check zarrfs tests scripts
exec .venv/bin/python -m pytest -ra "$@"

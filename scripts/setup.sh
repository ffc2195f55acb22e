#!/usr/bin/env bash
# Install what zarrfs needs on a fresh Debian/Ubuntu machine: fuse3, redis-server, PostgreSQL's
# server (the tests start their own on 127.0.0.1, as they do Redis servers and a Redis Cluster) and the
# command-line tools the tests use, then a virtualenv in .venv with zarrfs and its test extras.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v rsync >/dev/null || need+=(rsync)
command -v tar >/dev/null || need+=(tar)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import zarrfs, lmdb, redis, zarr" >/dev/null

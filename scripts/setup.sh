#!/usr/bin/env bash
# Install what zarrfs needs on a fresh Debian/Ubuntu machine: fuse3, redis-server, PostgreSQL's
# server (the tests start their own on 127.0.0.1, as they do Redis servers and a Redis Cluster) and the
# command-line tools the tests use (GDAL's gdal-bin and netCDF-C's ncdump read mounts as clients; acl's setfacl sets POSIX ACLs), bash-completion (which loads zarrfs's completion), then a virtualenv in .venv with zarrfs and its test extras.
# Safe to run again: it only installs what is missing. Then the manual page (man zarrfs) and the
# bash and zsh completion, generated from the command line itself, and the systemd service
# template zarrfs@.service (docs/operations.md).
#
#   scripts/setup.sh            everything above; zarrfs is .venv/bin/zarrfs
#   scripts/setup.sh --on-path  also link /usr/local/bin/zarrfs to it: /etc/fstab and
#                               mount -t fuse.zarrfs run "zarrfs" from the standard PATH
set -euo pipefail
cd "$(dirname "$0")/.."
on_path=0
for arg in "$@"; do
  case "$arg" in
    --on-path) on_path=1 ;;
    *) echo "setup.sh: unknown option $arg (--on-path)" >&2; exit 2 ;;
  esac
done
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v rsync >/dev/null || need+=(rsync)
command -v tar >/dev/null || need+=(tar)
command -v gdal_translate >/dev/null || need+=(gdal-bin)
command -v ncdump >/dev/null || need+=(netcdf-bin)
command -v setfacl >/dev/null || need+=(acl)
command -v openssl >/dev/null || need+=(openssl)  # the tests' certificates of a TLS redis-server
# A C compiler for scripts/build_compiled.py (the listing's loop compiled; without one zarrfs runs as pure Python).
command -v cc >/dev/null || need+=(gcc)
# The completion installed below is loaded by bash-completion: without it a new shell completes nothing.
[ -f /usr/share/bash-completion/bash_completion ] || need+=(bash-completion)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e ".[test,compiled]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import zarrfs, lmdb, redis, zarr" >/dev/null
# The listing's loop compiled with Cython and the machine's C compiler, when both are there (and
# the sources changed since the last build); without them zarrfs runs as pure Python
# (zarrfs/compiled.py, docs/performance.md "Compiled where it loops").
.venv/bin/python scripts/build_compiled.py
# zarrfs is installed editable, so pip compiled none of its modules; where Python writes no
# bytecode of its own (PYTHONDONTWRITEBYTECODE, a read-only checkout) every daemon and CLI
# call compiled all of them again: 0.35 s more for each mount.
.venv/bin/python -m compileall -q -j 0 zarrfs >/dev/null

# The manual page and the completion: into the venv, and where man and the shells look.
share=.venv/share
mkdir -p "$share/man/man1" "$share/bash-completion/completions" "$share/zsh/site-functions"
.venv/bin/python -m zarrfs.cli.manpage > "$share/man/man1/zarrfs.1"
.venv/bin/python -m zarrfs.cli.completion bash > "$share/bash-completion/completions/zarrfs"
.venv/bin/python -m zarrfs.cli.completion zsh > "$share/zsh/site-functions/_zarrfs"
if [ "$(id -u)" = 0 ]; then
  system=/usr/local/share
else
  system="${XDG_DATA_HOME:-$HOME/.local/share}"
fi
install -D -m 644 "$share/man/man1/zarrfs.1" "$system/man/man1/zarrfs.1"
install -D -m 644 "$share/bash-completion/completions/zarrfs" "$system/bash-completion/completions/zarrfs"
install -D -m 644 "$share/zsh/site-functions/_zarrfs" "$system/zsh/site-functions/_zarrfs"

here="$(pwd)/.venv/bin/zarrfs"
# The systemd service template zarrfs@.service, running this zarrfs (docs/operations.md).
scripts/install_unit.sh "$here"
if [ "$on_path" = 1 ]; then
  $sudo ln -sf "$here" /usr/local/bin/zarrfs
  echo "zarrfs: /usr/local/bin/zarrfs -> $here"
elif [ "$(command -v zarrfs || true)" != "$here" ] && [ "$(readlink -f "$(command -v zarrfs || echo /nonexistent)")" != "$(readlink -f "$here")" ]; then
  echo "zarrfs is $here; for /etc/fstab and mount -t fuse.zarrfs put it on the standard PATH:"
  echo "  scripts/setup.sh --on-path    (links /usr/local/bin/zarrfs to it)"
fi

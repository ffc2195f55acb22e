#!/usr/bin/env bash
# Install the systemd service template zarrfs@.service (docs/operations.md) running the zarrfs
# command ZARRFS, into each FOLDER given; by default, for root, the system's and every user's
# service manager's folders of local units, else this user's (~/.config/systemd/user).
#
#   scripts/install_unit.sh ZARRFS [FOLDER...]
set -euo pipefail
cd "$(dirname "$0")"
if [ $# -lt 1 ]; then
  echo "install_unit.sh: give the zarrfs command's path (then, optionally, folders)" >&2
  exit 2
fi
zarrfs=$1
shift
folders=("$@")
if [ ${#folders[@]} = 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    folders=(/usr/local/lib/systemd/system /usr/local/lib/systemd/user)
  else
    folders=("${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user")
  fi
fi
for folder in "${folders[@]}"; do
  mkdir -p "$folder"
  sed "s|/usr/local/bin/zarrfs|$zarrfs|g" zarrfs@.service > "$folder/zarrfs@.service.tmp"
  chmod 644 "$folder/zarrfs@.service.tmp"
  mv "$folder/zarrfs@.service.tmp" "$folder/zarrfs@.service"
done
if [ $# = 0 ] && [ -d /run/systemd/system ]; then  # systemd runs this machine: it reads it now
  if [ "$(id -u)" = 0 ]; then systemctl daemon-reload || true; else systemctl --user daemon-reload || true; fi
fi

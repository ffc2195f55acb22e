#!/usr/bin/env bash
# From a fresh machine to a mounted Zarr database: install (scripts/setup.sh), create a small
# LMDB database holding a sample Zarr hierarchy, mount it at demo/mnt, and use it with ls, find
# and zarr-python through the mount. Unmount with: .venv/bin/zarrfs umount demo/mnt
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
zarrfs=.venv/bin/zarrfs
mnt=demo/mnt
if mountpoint -q "$mnt" 2>/dev/null; then $zarrfs umount "$mnt"; fi
rm -rf demo && mkdir -p "$mnt"

echo "== writing a sample hierarchy (zarr-python 3) into demo/sample.lmdb"
.venv/bin/python scripts/make_sample.py demo/sample-dir
$zarrfs copy demo/sample-dir "lmdb://$PWD/demo/sample.lmdb"
rm -rf demo/sample-dir

echo "== zarrfs mount lmdb://$PWD/demo/sample.lmdb $mnt"
$zarrfs mount "lmdb://$PWD/demo/sample.lmdb" "$mnt" --log-file demo/zarrfs.log
echo "== ls -la $mnt/weather"
ls -la "$mnt/weather"
echo "== find $mnt | head"
find "$mnt" | sort | head -n 15
echo "== du -sb $mnt"
du -sb "$mnt"
echo "== zarr-python reads through the mount"
.venv/bin/python - "$mnt" <<'PY'
import sys
import zarr
root = zarr.open_group(sys.argv[1], mode="r")
print(root.tree())
t = root["weather/temperature"]
print("temperature", t.shape, t.dtype, "mean =", float(t[:].mean()))
PY
echo "== mounted at $mnt; unmount with: $zarrfs umount $mnt"

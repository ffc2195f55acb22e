"""Standard tools on Zarr hierarchies through real mounts of every driver (cp, rsync, tar, find,
du, diff, md5sum, mv, rm), and the daemon's life: SIGTERM with files open, umount and remount,
and the one-line failures of ``zarrfs mount``."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import zarr
import zarr.codecs
from mounting import needs_fuse, zarrfs

from zarrfs.backends import open_driver
from zarrfs.backends.base import SIDE, prefix_stop
from zarrfs.cli.main import daemon_pids
from zarrfs.fs.sidedata import ATTR, ENTRY

pytestmark = needs_fuse


# --- a sample hierarchy ----------------------------------------------------------------------


def write_sample(base: Path) -> dict[str, np.ndarray]:
    """Write a small hierarchy with zarr-python 3 under ``base`` and return ``{array path: values}``.

    ``sample/`` is a v3 group (nested ``c/i/j`` chunk keys, a flat ``c.i`` array, subgroups);
    ``legacy/`` a v2 group whose array uses the '/' dimension separator (nested folders).
    Compression is deterministic, so two calls write byte-identical files."""
    rng = np.random.default_rng(7)
    arrays = {
        "sample/temp": rng.normal(size=(30, 40)).astype("f4"),
        "sample/flat": np.arange(50, dtype="i2") - 25,
        "sample/grp/counts": np.arange(25, dtype="i8") ** 2,
        "sample/grp/sub/mask": rng.random((6, 6)) > 0.3,
        "legacy/nested": rng.normal(size=(12, 12)),
    }
    g = zarr.open_group(base / "sample", mode="w", zarr_format=3, attributes={"title": "sample", "v": 1})
    g.create_array(
        "temp", data=arrays["sample/temp"], chunks=(10, 10), compressors=zarr.codecs.ZstdCodec(level=3)
    )
    g.create_array(
        "flat",
        data=arrays["sample/flat"],
        chunks=(8,),
        chunk_key_encoding={"name": "default", "separator": "."},
    )
    grp = g.create_group("grp", attributes={"kind": "group"})
    grp.create_array("counts", data=arrays["sample/grp/counts"], chunks=(10,))
    grp.create_group("sub").create_array("mask", data=arrays["sample/grp/sub/mask"], chunks=(4, 4))
    legacy = zarr.open_group(base / "legacy", mode="w", zarr_format=2)
    legacy.create_array(
        "nested",
        data=arrays["legacy/nested"],
        chunks=(5, 5),
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    assert (base / "sample/temp/c/2/3").is_file()
    assert (base / "sample/flat/c.6").is_file()
    assert (base / "legacy/nested/2/2").is_file()
    return arrays


def check_sample(base: Path, arrays: dict[str, np.ndarray]) -> None:
    """zarr-python 3 reads every array of the sample under ``base`` with the expected values."""
    for name, want in arrays.items():
        got = zarr.open_array(base / name, mode="r")[:]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert dict(zarr.open_group(base / "sample", mode="r").attrs) == {"title": "sample", "v": 1}


def entries(root: Path) -> list[tuple[str, Path]]:
    """Every folder and file below ``root`` (``root`` itself as '.'), sorted, bottom-up order."""
    out = []
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            full = Path(dirpath, name)
            out.append((str(full.relative_to(root)), full))
        rel = os.path.relpath(dirpath, root)
        out.append((rel, Path(dirpath)))
    return out


def vary_metadata(root: Path) -> None:
    """Give entries distinct modes and old, nanosecond mtimes, the same for the same tree
    whatever order the folder lists in (folders last, as cp/tar do)."""
    base_ns = 1_500_000_000_000_000_000
    index = {rel: i for i, rel in enumerate(sorted(rel for rel, _p in entries(root)))}
    for rel, path in entries(root):
        i = index[rel]
        if path.is_dir():
            os.chmod(path, 0o750 if i % 2 else 0o755)
        else:
            os.chmod(path, 0o600 if i % 3 == 0 else 0o640 if i % 3 == 1 else 0o644)
        t = base_ns + i * 1_000_000_123
        os.utime(path, ns=(t, t))


def tree_meta(root: Path) -> dict[str, tuple]:
    """``{relative path: (st_mode, st_mtime_ns, size of a file)}`` of everything below ``root``."""
    out = {}
    for rel, path in entries(root):
        st = os.lstat(path)
        out[rel] = (
            stat.filemode(st.st_mode),
            st.st_mtime_ns,
            st.st_size if stat.S_ISREG(st.st_mode) else None,
        )
    return out


def sh(cmd: str, cwd: Path | None = None) -> str:
    """Run a shell pipeline; fail with its stderr when it fails."""
    res = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}): {res.stderr}"
    return res.stdout


def run(*args: str | Path) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{' '.join(map(str, args))} failed ({res.returncode}): {res.stderr}"
    return res


def native_sample(tmp_path: Path, name: str = "native") -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / name
    root.mkdir()
    return root, write_sample(root)


# --- cp, rsync, tar --------------------------------------------------------------------------


def test_cp_a_in_and_out_keeps_modes_and_mtimes(mounted, tmp_path):
    native, arrays = native_sample(tmp_path)
    vary_metadata(native)
    want = tree_meta(native)

    run("cp", "-a", native, mounted.path / "in")
    assert tree_meta(mounted.path / "in") == want
    check_sample(mounted.path / "in", arrays)

    run("cp", "-a", mounted.path / "in", tmp_path / "out")
    assert tree_meta(tmp_path / "out") == want
    check_sample(tmp_path / "out", arrays)

    # a hierarchy written through the mount by zarr, with modes and times set there, copied out
    direct = mounted.path / "direct"
    write_sample(direct)
    vary_metadata(direct)
    run("cp", "-a", direct, tmp_path / "direct-out")
    assert tree_meta(tmp_path / "direct-out") == tree_meta(direct) == want


ITEM = re.compile(r"^[<>ch.*][fdLDS]\S{9} (.*)$")


def rsync(src: Path, dst: Path) -> tuple[list[str], int]:
    """``rsync -a`` with itemized changes: ``(changed items, regular files transferred)``."""
    out = run("rsync", "-a", "--itemize-changes", "--stats", f"{src}/", f"{dst}/").stdout
    items = [line for line in out.splitlines() if ITEM.match(line)]
    m = re.search(r"^Number of regular files transferred: ([\d,]+)", out, re.M)
    assert m, out
    return items, int(m.group(1).replace(",", ""))


@pytest.mark.slow
def test_rsync_twice_transfers_nothing_the_second_time(mounted, tmp_path):
    native, arrays = native_sample(tmp_path)
    vary_metadata(native)
    n_files = sum(1 for _rel, p in entries(native) if p.is_file())

    items, sent = rsync(native, mounted.path / "r")
    assert sent == n_files and len(items) == len(entries(native))
    items, sent = rsync(native, mounted.path / "r")
    assert (items, sent) == ([], 0)  # sizes, mtimes and modes all kept: nothing to do
    assert tree_meta(mounted.path / "r") == tree_meta(native)
    check_sample(mounted.path / "r", arrays)

    # and out of the mount, twice
    items, sent = rsync(mounted.path / "r", tmp_path / "back")
    assert sent == n_files
    items, sent = rsync(mounted.path / "r", tmp_path / "back")
    assert (items, sent) == ([], 0)
    assert subprocess.run(["diff", "-r", native, tmp_path / "back"]).returncode == 0


def test_tar_out_of_and_into_the_mount(mounted, tmp_path):
    src = mounted.path / "src"
    arrays = write_sample(src)
    vary_metadata(src)
    archive = tmp_path / "a.tar"
    run("tar", "--format=posix", "-cf", archive, "-C", mounted.path, "src")

    native, _ = native_sample(tmp_path)
    run("tar", "--format=posix", "-cf", tmp_path / "native.tar", "-C", native.parent, native.name)
    names = sorted(n.split("/", 1)[1] for n in run("tar", "tf", archive).stdout.split() if "/" in n)
    native_names = sorted(
        n.split("/", 1)[1] for n in run("tar", "tf", tmp_path / "native.tar").stdout.split() if "/" in n
    )
    assert names == native_names

    os.mkdir(mounted.path / "restore")
    run("tar", "-xf", archive, "-C", mounted.path / "restore")
    restored = mounted.path / "restore/src"
    assert subprocess.run(["diff", "-r", src, restored]).returncode == 0
    assert tree_meta(restored) == tree_meta(src)  # pax keeps nanoseconds; tar x sets folder times last
    check_sample(restored, arrays)


# --- find, du, diff, md5sum ------------------------------------------------------------------


def test_find_du_diff_md5sum_match_native(mounted, tmp_path):
    native, arrays = native_sample(tmp_path)
    mnt = mounted.path / "data"
    write_sample(mnt)  # the same zarr writes, through the mount: byte-identical files

    assert sh(f"find '{native}' | wc -l") == sh(f"find '{mnt}' | wc -l")
    assert int(sh(f"find '{mnt}' -type f | wc -l")) == sum(1 for _r, p in entries(native) if p.is_file())

    # apparent sizes: every file is the same size; folders count what each filesystem says
    def du_sb(root: Path) -> int:
        return int(sh(f"du -sb '{root}'").split()[0])

    def dir_sizes(root: Path) -> int:
        return sum(os.stat(p).st_size for _r, p in entries(root) if p.is_dir())

    assert du_sb(mnt) - dir_sizes(mnt) == du_sb(native) - dir_sizes(native)

    def du_ab_files(root: Path) -> dict[str, int]:
        out = {}
        for line in sh(f"du -ab '{root}'").splitlines():
            size, path = line.split("\t", 1)
            if os.path.isfile(path):
                out[os.path.relpath(path, root)] = int(size)
        return out

    assert du_ab_files(mnt) == du_ab_files(native)

    diff = subprocess.run(["diff", "-r", native, mnt], capture_output=True, text=True)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout

    md5 = "find . -type f -print0 | sort -z | xargs -0 md5sum"
    sums = sh(md5, cwd=mnt)
    assert sums == sh(md5, cwd=native)
    assert len(sums.splitlines()) == len(du_ab_files(native))
    check_sample(mnt, arrays)


# --- mv, rm -rf ------------------------------------------------------------------------------


def data_keys(url: str, prefix: str) -> list[str]:
    with open_driver(url, readonly=True) as d:
        return [k for k, _ in d.scan(prefix, prefix_stop(prefix))]


def side_keys(url: str, path: str) -> list[str]:
    with open_driver(url, readonly=True) as d:
        return [
            k for kind in (ATTR, ENTRY) for k, _ in d.scan(kind + path, prefix_stop(kind + path), space=SIDE)
        ]


def test_mv_array_folder(mounted):
    base = mounted.path / "d"
    arrays = write_sample(base)
    run("mv", base / "sample/temp", base / "sample/grp/moved")
    assert not os.path.exists(base / "sample/temp")
    np.testing.assert_array_equal(
        zarr.open_array(base / "sample/grp/moved", mode="r")[:], arrays["sample/temp"]
    )
    g = zarr.open_group(base / "sample", mode="r")
    assert sorted(g.array_keys()) == ["flat"]
    assert sorted(g["grp"].array_keys()) == ["counts", "moved"]
    assert data_keys(mounted.url, "d/sample/temp/") == []
    assert "d/sample/grp/moved/c/2/3" in data_keys(mounted.url, "d/sample/grp/moved/")

    # a v2 array with nested chunk folders, to another top-level folder
    os.mkdir(mounted.path / "elsewhere")
    run("mv", base / "legacy/nested", mounted.path / "elsewhere/")
    np.testing.assert_array_equal(
        zarr.open_array(mounted.path / "elsewhere/nested", mode="r")[:], arrays["legacy/nested"]
    )
    assert "nested" not in os.listdir(base / "legacy")
    assert list(zarr.open_group(base / "legacy", mode="r", zarr_format=2).array_keys()) == []


def test_rm_rf_group(mounted):
    base = mounted.path / "d"
    arrays = write_sample(base)
    os.mkdir(base / "sample/grp/empty-folder")
    run("rm", "-rf", base / "sample/grp")
    assert not os.path.exists(base / "sample/grp")
    assert sorted(os.listdir(base / "sample")) == ["flat", "temp", "zarr.json"]
    g = zarr.open_group(base / "sample", mode="r")
    assert sorted(g.keys()) == ["flat", "temp"]
    np.testing.assert_array_equal(g["temp"][:], arrays["sample/temp"])
    assert data_keys(mounted.url, "d/sample/grp") == []
    assert side_keys(mounted.url, "d/sample/grp") == []  # no stale modes, times or folder markers
    walked = 1 + sum(len(dirs) + len(files) for _d, dirs, files in os.walk(base / "sample"))
    assert int(sh(f"find '{base}/sample' | wc -l")) == walked == len(entries(base / "sample"))


# --- the daemon's life -----------------------------------------------------------------------

HOLDER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
payload = bytes(range(256)) * int(sys.argv[2])
for i in range(0, len(payload), 65536):
    os.write(fd, payload[i:i + 65536])
print("written", flush=True)
time.sleep(120)
"""


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"the daemon {pid} still runs {timeout} s after SIGTERM")


@pytest.mark.slow
def test_sigterm_commits_open_files_and_leaves_no_dead_mountpoint(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    arrays = write_sample(m.path / "d")
    (m.path / "closed.txt").write_bytes(b"closed before the signal")
    repeats = 3000  # 768000 bytes, more than one FUSE write
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(m.path / "held.bin"), str(repeats)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "written"
        pids = daemon_pids(str(m.path))
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGTERM)
        wait_gone(pids[0])
    finally:
        holder.kill()
        holder.wait()
    # the mountpoint is a plain folder again, not "Transport endpoint is not connected"
    assert not os.path.ismount(m.path)
    assert stat.S_ISDIR(os.stat(m.path).st_mode)
    assert os.listdir(m.path) == []
    # what the open file had written is committed
    with open_driver(db_url, readonly=True) as d:
        assert d.get("held.bin") == bytes(range(256)) * repeats
        assert d.get("closed.txt") == b"closed before the signal"
    m.start()  # the same mountpoint again
    assert (m.path / "held.bin").read_bytes() == bytes(range(256)) * repeats
    assert stat.S_IMODE(os.stat(m.path / "held.bin").st_mode) == 0o640
    check_sample(m.path / "d", arrays)


@pytest.mark.slow
@pytest.mark.parametrize("options", ["create", "create,workers=16"])
def test_sigterm_is_a_clean_exit(db_url, tmp_path, options):
    """SIGTERM unmounts and exits 0, also when it comes the moment the mount is answered:
    with several request threads, these answered INIT before the stop signals were caught
    (a dead mount, now and then on a busy machine)."""
    mnt = tmp_path / "fg"
    mnt.mkdir()
    log = tmp_path / "fg.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zarrfs",
            "mount",
            db_url,
            str(mnt),
            "-f",
            "-o",
            options,
            "--log-file",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        (mnt / "f").write_bytes(b"x")
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
    assert not os.path.ismount(mnt)
    assert "unmounted" in log.read_text()
    assert (proc.returncode, err) == (0, "")


@pytest.mark.slow
def test_umount_then_remount_shows_everything(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    arrays = write_sample(m.path / "d")
    vary_metadata(m.path / "d")
    os.makedirs(m.path / "d/empty/folder")
    before = tree_meta(m.path / "d")
    sums = sh("find . -type f -print0 | sort -z | xargs -0 md5sum", cwd=m.path)
    pids = daemon_pids(str(m.path))

    zarrfs("umount", str(m.path))
    assert not os.path.ismount(m.path) and os.listdir(m.path) == []
    assert pids and not any(running(p) for p in pids)  # umount waits for the daemon

    m.start()
    assert tree_meta(m.path / "d") == before
    assert sh("find . -type f -print0 | sort -z | xargs -0 md5sum", cwd=m.path) == sums
    check_sample(m.path / "d", arrays)


# --- zarrfs mount failures: one clear line, non-zero exit -------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line_failure(args: list[str], *words: str) -> str:
    res = zarrfs("mount", *args, check=False, timeout=90)
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0, res
    assert len(lines) == 1 and lines[0].startswith("zarrfs: "), res.stderr
    assert res.stdout == ""
    low = lines[0].lower()
    assert any(w in low for w in words), f"none of {words} in {lines[0]!r}"
    return lines[0]


def test_mount_failures_are_one_clear_line(db_url, mount_factory, tmp_path):
    scheme = urlsplit(db_url).scheme
    free = tmp_path / "free"
    free.mkdir()
    db_path = urlsplit(db_url).path if scheme in ("lmdb", "sqlite") else None

    # missing database, without -o create (for Redis: no server where the URL points)
    if db_path is not None:
        assert_one_line_failure([db_url, str(free)], "does not exist")
        assert not os.path.exists(db_path)
    else:
        gone = f"redis://127.0.0.1:{free_port()}/0?prefix=x"
        assert_one_line_failure([gone, str(free), "-o", "create"], "refused", "connect")
    # a URL scheme no driver serves
    assert_one_line_failure(["nosuch" + db_url[len(scheme) :], str(free), "-o", "create"], "nosuch")
    # a mountpoint that does not exist: nothing is created
    assert_one_line_failure([db_url, str(tmp_path / "absent"), "-o", "create"], "absent")
    assert not os.path.exists(tmp_path / "absent")
    if db_path is not None:
        assert not os.path.exists(db_path)
    # a busy mountpoint: the first mount goes on working
    m = mount_factory(db_url, ["create"], name="busy")
    (m.path / "f").write_bytes(b"1")
    assert_one_line_failure([db_url, str(m.path)], "busy", "already mounted")
    assert os.path.ismount(m.path) and (m.path / "f").read_bytes() == b"1"
    assert len(daemon_pids(str(m.path))) == 1
    for where in (free, tmp_path / "absent"):
        assert not os.path.ismount(where) and not daemon_pids(str(where))


def test_mount_failure_names_a_bad_fuse_option(db_url, tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    assert_one_line_failure([db_url, str(mnt), "-o", "create,bogusopt"], "bogusopt")
    assert not os.path.ismount(mnt) and not daemon_pids(str(mnt))


def test_a_killed_daemons_mountpoint_is_named_and_cleared_by_umount(db_url, mount_factory):
    m = mount_factory(db_url, ["create"])
    (m.path / "kept.txt").write_bytes(b"committed before the kill")
    pids = daemon_pids(str(m.path))
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    wait_gone(pids[0])
    with pytest.raises(OSError) as dead:
        os.stat(m.path)
    assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    line = assert_one_line_failure([db_url, str(m.path)], "daemon is gone")
    assert f"zarrfs umount {m.path}" in line
    zarrfs("umount", str(m.path))
    assert not m.mounted() and os.listdir(m.path) == []
    m.start()
    assert (m.path / "kept.txt").read_bytes() == b"committed before the kill"

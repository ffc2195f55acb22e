"""The benchmarks' own parts: ``--against REV`` runs the same scripts on REV's zarrfs
(``scripts/against.py``), the C floor of ``scripts/bench_ops.py`` mounts, answers and
counts what the kernel asks (``scripts/fuse_ops_floor.c``), and the Python floor
(``scripts/python_floor.py``) answers through zarrfs' loop and through its session."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(CHECKOUT / "scripts"))

import against  # noqa: E402


def test_against_leaves_out_its_own_options():
    argv = ["--drivers", "lmdb", "--against", "HEAD~2", "--json", "x.json", "--repeats=1", "--against=v1"]
    assert against.without_against(argv) == ["--drivers", "lmdb", "--repeats=1"]


def test_against_leaves_out_alternate_and_compares_medians_of_the_turns():
    argv = ["--alternate", "3", "--drivers", "lmdb", "--alternate=2", "--repeats", "1"]
    assert against.without_against(argv) == ["--drivers", "lmdb", "--repeats", "1"]
    runs = [
        {"a": (5.0, "lower"), "b": (1.0, "higher")},
        {"a": (9.0, "lower")},
        {"a": (7.0, "lower"), "b": (3.0, "higher")},
    ]
    assert against.medians(runs) == {"a": (7.0, "lower"), "b": (2.0, "higher")}
    # REV first, then this tree first: being second in a pair falls on both sides alike.
    assert against.turns(1) == ["rev", "new"]
    assert against.turns(3) == ["rev", "new", "new", "rev", "rev", "new"]


def test_against_exports_rev_with_this_trees_scripts(tmp_path):
    if not (CHECKOUT / ".git").exists():
        pytest.skip("not a git checkout")
    commit = against.export("HEAD", tmp_path / "rev")
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert commit == head
    assert (tmp_path / "rev/zarrfs/fuse/session.py").exists()
    for name in ("bench.py", "bench_ops.py", "against.py", "fuse_ops_floor.c"):
        assert (tmp_path / "rev/scripts" / name).read_bytes() == (CHECKOUT / "scripts" / name).read_bytes()
    assert list((tmp_path / "rev/zarrfs").rglob("*.pyc"))  # compiled once, not by each daemon
    # REV's modules built like this tree's: compiled where this tree's are, else pure.
    built = (CHECKOUT / "zarrfs/compiled.json").exists()
    assert (tmp_path / "rev/zarrfs/compiled.json").exists() == built
    assert bool(list((tmp_path / "rev/zarrfs/fuse").glob("dirreq.*.so"))) == built


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
@pytest.mark.parametrize("spin", [None, "200"])
def test_the_c_floor_serves_and_counts_what_the_kernel_asks(tmp_path, spin):
    """Sleeping in read() or spinning (its fourth argument), as bench_ops.py runs it; a
    spinning floor asleep in poll() still hears SIGUSR1."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    binary, mnt, counts = tmp_path / "floor", tmp_path / "mnt", tmp_path / "counts"
    subprocess.run(["gcc", "-O2", str(CHECKOUT / "scripts/fuse_ops_floor.c"), "-o", str(binary)], check=True)
    mnt.mkdir()
    proc = subprocess.Popen([str(binary), str(mnt), "100", str(counts), *([spin] if spin else [])])
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, "the floor did not mount"
            time.sleep(0.01)
        assert os.stat(mnt / "e1").st_size == 4096 and not os.path.exists(mnt / "missing")
        assert sorted(os.listdir(mnt / "big"), key=int) == [str(i) for i in range(100)]
        fd = os.open(mnt / "new", os.O_WRONLY | os.O_CREAT, 0o644)
        assert os.write(fd, b"x" * 4096) == 4096
        os.close(fd)
        assert (mnt / "e2").read_bytes() == b"e" * 4096
        time.sleep(0.05)  # past a spinning floor's window: asleep in poll()
        os.kill(proc.pid, signal.SIGUSR1)
        os.stat(mnt)
        while not counts.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        seen = dict(map(int, line.split()) for line in counts.read_text().split("\n") if line)
        create, write, readdirplus, lookup = seen[35], seen[16], seen[44], seen[1]
        assert create == 1 and write == 1 and readdirplus >= 1 and lookup >= 3
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        proc.wait(timeout=10)


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_bench_ops_times_each_operation_on_zarrfs_the_floor_and_a_native_folder(tmp_path):
    """A small run of ``scripts/bench_ops.py``: each operation's wall time on the three sides
    and the speeds of the floor and of zarrfs against the native folder, in one run."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    out = tmp_path / "ops.json"
    argv = [sys.executable, str(CHECKOUT / "scripts/bench_ops.py"), "--ops", "20", "--entries", "50",
            "--repeats", "1", "--only", "stat missing,ls -f", "--workdir", str(tmp_path), "--json", str(out),
            "--native-warm"]  # no caches dropped under the other tests
    shown = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=300, check=True).stdout
    doc = json.loads(out.read_text())["lmdb"]
    assert sorted(doc) == ["ls -f", "stat missing"]
    for op, row in doc.items():
        assert {"zarrfs", "floor", "native"} <= set(row)
        assert all(row[side]["wall_us"] > 0 for side in ("zarrfs", "floor", "native"))
        assert row["native"]["fstype"] and row["native"]["cold"] is False
        line = [x for x in shown.splitlines() if x.startswith(f"| {op} ")][-1]  # the wall-time table's
        floor_speed, zarrfs_speed = (float(c.strip().rstrip("x")) for c in line.strip("|").split("|")[4:6])
        native = row["native"]["wall_us"]
        assert floor_speed == pytest.approx(native / row["floor"]["wall_us"], abs=0.006)
        assert zarrfs_speed == pytest.approx(native / row["zarrfs"]["wall_us"], abs=0.006)


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
@pytest.mark.parametrize("how", [[], ["--session"]])
def test_the_python_floor_answers_through_the_loop_and_through_the_session(how):
    """``scripts/python_floor.py`` mounts its dict and ``stat``s it: through the session it
    stands in for the filesystem's operations, so it must follow what the session asks of
    them (it had fallen behind: every lookup failed with EIO)."""
    argv = [sys.executable, str(CHECKOUT / "scripts/python_floor.py"), "--files", "300", *how]
    shown = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    line = shown.stdout.strip()
    assert re.fullmatch(r"existing [\d,]+ lookups/s, missing [\d,]+ lookups/s", line), shown.stdout


def test_bench_ops_refuses_a_driver_it_cannot_mount_in_one_line(tmp_path):
    """A server's driver is ``bench_network.py``'s: ``--drivers redis`` is one line saying
    so and exit status 2, not a traceback (before, a KeyError)."""
    script = str(CHECKOUT / "scripts/bench_ops.py")
    argv = [sys.executable, script, "--drivers", "lmdb,redis", "--workdir", str(tmp_path)]
    done = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert "--drivers redis" in done.stderr and "bench_network.py" in done.stderr


"""A folder of one mount stays on its path while other writers change the database around it.

A process sitting in a folder of mount B (its current folder, an open descriptor) keeps
``getcwd()``, ``..`` and relative paths while mount A creates, renames and removes files and
folders beside it and elsewhere, and while a writer that keeps no change log writes: B's change
feed may drop what the kernel caches, never unhash a folder that is still there
(``zarrfs.fuse.coherence``). The process is a child of the test, asked to check after each
change once B shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mounting import eventually, make_url, needs_fuse

pytestmark = needs_fuse

ROUNDS = 8

# The process sitting in the folder: on each line read, it checks its current folder's path,
# ``..``, a relative path and the paths of two open folder descriptors; "ok" or what failed.
SITTER = r"""
import os, sys
home, other = sys.argv[1], sys.argv[2]
here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
there = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
print("ready", flush=True)
for _ in sys.stdin:
    problems = []
    try:
        if os.getcwd() != home:
            problems.append(f"getcwd() {os.getcwd()!r}")
    except OSError as exc:
        problems.append(f"getcwd(): {exc}")
    try:
        if os.path.basename(home) not in os.listdir(".."):
            problems.append("'..' lacks the folder")
        with open("mine", "rb") as fh:
            if fh.read() != b"mine":
                problems.append("'mine' changed")
    except OSError as exc:
        problems.append(f"relative path: {exc}")
    for fd, path in ((here, home), (there, other)):
        link = os.readlink(f"/proc/self/fd/{fd}")
        if link != path:
            problems.append(f"descriptor of {path!r} at {link!r}")
    print("; ".join(problems) or "ok", flush=True)
"""


class Sitter:
    """A child process whose current folder is ``home``, holding ``home`` and ``other`` open."""

    def __init__(self, home: Path, other: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SITTER, str(home), str(other)],
            cwd=home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def check(self) -> str:
        """What the child found wrong, or "ok"."""
        self.proc.stdin.write("check\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture
def sitter():
    """Start :class:`Sitter` processes (``sitter(home, other)``), ended after the test."""
    started: list[Sitter] = []

    def start(home: Path, other: Path) -> Sitter:
        started.append(Sitter(home, other))
        return started[-1]

    yield start
    for s in started:
        s.close()


def _prepare(a: Path, b: Path) -> None:
    (a / "d" / "sub").mkdir(parents=True)
    (a / "d" / "sub" / "mine").write_bytes(b"mine")
    (a / "other").mkdir()
    eventually(lambda: (b / "d" / "sub" / "mine").exists() and (b / "other").is_dir(), "b shows a's folders")


def test_a_folder_a_process_is_in_stays_reachable_while_another_mount_writes(db_url, mount_factory, sitter):
    a = mount_factory(db_url, ["create"], name="a").path
    b = mount_factory(db_url, [], name="b").path
    _prepare(a, b)
    child = sitter(b / "d" / "sub", b / "other")
    assert child.check() == "ok"
    for i in range(ROUNDS):
        # Beside the folder, in an unrelated one, and a sibling folder made, renamed, removed.
        (a / "d" / "sub" / f"f{i}").write_bytes(b"x")
        (a / "other" / f"g{i}").write_bytes(b"y")
        (a / "d" / f"x{i}").mkdir()
        (a / "d" / f"x{i}" / "k").write_bytes(b"z")
        os.rename(a / "d" / f"x{i}", a / "d" / f"y{i}")
        os.rename(a / "d" / "sub" / f"f{i}", a / "d" / "sub" / f"r{i}")
        (a / "other" / f"g{i}").unlink()
        (a / "d" / f"y{i}" / "k").unlink()
        (a / "d" / f"y{i}").rmdir()
        (a / "d" / "sub" / f"done{i}").write_bytes(b"")
        eventually(lambda i=i: (b / "d" / "sub" / f"done{i}").exists(), f"b shows round {i}")
        assert child.check() == "ok", f"round {i}"
    assert sorted(os.listdir(b / "d" / "sub")) == sorted(
        ["mine"] + [f"r{i}" for i in range(ROUNDS)] + [f"done{i}" for i in range(ROUNDS)]
    )


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_folder_a_process_is_in_stays_reachable_when_not_known_what_changed(
    kind, request, tmp_path, mount_factory, sitter
):
    """The feed cannot say what changed ("something changed": a writer that keeps no change
    log, zarr-python 2's ``LMDBStore``; a commit of more keys than SQLite's log keeps): the
    mount drops everything the kernel holds, but no folder that is still there."""
    url = make_url(kind, tmp_path, request)
    a = mount_factory(url, ["create"], name="a").path
    b = mount_factory(url, [], name="b").path
    _prepare(a, b)
    child = sitter(b / "d" / "sub", b / "other")
    assert child.check() == "ok"
    for i in range(2):
        key = f"other/raw{i}"
        if kind == "lmdb":
            import lmdb

            env = lmdb.open(str(tmp_path / "db.lmdb"), max_dbs=0)
            with env.begin(write=True) as txn:  # what LMDBStore.__setitem__ does
                txn.put(key.encode(), b"raw")
            env.close()
        else:
            import sqlite3

            from zarrfs.backends.sqlite.feed import KEEP

            conn = sqlite3.connect(tmp_path / "db.sqlite")  # what SQLiteStore does
            filler = [(f"fill{i}/{n}", b"") for n in range(KEEP + 1)]  # the log trimmed past b
            conn.executemany("REPLACE INTO zarr VALUES (?, ?)", [*filler, (key, b"raw")])
            conn.commit()
            conn.close()
        eventually(lambda key=key: (b / key).exists(), f"b shows {key}")
        assert child.check() == "ok", f"write {i}"

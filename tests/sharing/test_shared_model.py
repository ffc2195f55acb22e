"""A stateful property test of writes from two mounts of one database under locks: descriptors
opened on either mount at any time and kept open, each in turn taking a lock (``flock``,
``lockf``, OFD), then writing, ``pwrite``, appending, truncating, ``fsync``-ing and reading,
then unlocking and maybe closing, checked against a model of the README's Guarantees: under a
lock a descriptor reads and writes the newest committed content, whatever it read before, and
what it changed is committed at the unlock (or fsync), on top of what the others committed.

``ZARRFS_LONG_MODEL=1`` runs many more examples (a soak run)."""

from __future__ import annotations

import fcntl
import os
import struct
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from mounting import eventually, make_url, needs_fuse

pytestmark = needs_fuse

LONG = bool(os.environ.get("ZARRFS_LONG_MODEL"))
EXAMPLES = 300 if LONG else 15
STEPS = 60 if LONG else 25


def _lock(fd: int, how: str, kind: str) -> None:
    if how == "flock":
        fcntl.flock(fd, {"ex": fcntl.LOCK_EX, "sh": fcntl.LOCK_SH, "un": fcntl.LOCK_UN}[kind] | fcntl.LOCK_NB)
    elif how == "lockf":
        code = {"ex": fcntl.LOCK_EX, "sh": fcntl.LOCK_SH, "un": fcntl.LOCK_UN}[kind]
        fcntl.lockf(fd, code if kind == "un" else code | fcntl.LOCK_NB, 0, 0, os.SEEK_SET)
    else:
        type_ = {"ex": fcntl.F_WRLCK, "sh": fcntl.F_RDLCK, "un": fcntl.F_UNLCK}[kind]
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hh4xqqi4x", type_, os.SEEK_SET, 0, 0, 0))


data = st.binary(min_size=1, max_size=300)
offsets = st.integers(0, 2000)


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis", "cluster", "postgres"])
def test_locked_writes_from_two_mounts_follow_the_model(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    mounts = [mount_factory(url, ["create"]), mount_factory(url)]

    class Shared(RuleBasedStateMachine):
        """``stored``: the newest committed content; ``fds``: descriptors open on either mount
        (mount, fd, O_APPEND); ``held``: the one holding the write lock now, and ``view``:
        what it reads (the content with its changes)."""

        @initialize(first=st.binary(max_size=500))
        def start(self, first):
            self.name = uuid.uuid4().hex
            (mounts[0].path / self.name).write_bytes(first)
            self.stored = first
            self.fds: list[tuple[int, int, bool]] = []
            self.held: tuple[int, int, bool] | None = None
            self.how = "flock"
            self.view = first

        def teardown(self):
            for _, fd, _ in getattr(self, "fds", []):
                os.close(fd)

        def _path(self, m: int):
            path = mounts[m].path / self.name
            # A name made on one mount shows on the other within a poll: waited for with a
            # deadline, not a count of yields, which a busy machine ran through first.
            eventually(path.exists, "the name on the other mount")
            return path

        @rule(m=st.integers(0, 1), append=st.booleans())
        def open(self, m, append):
            fd = os.open(self._path(m), os.O_RDWR | (os.O_APPEND if append else 0))
            self.fds.append((m, fd, append))

        @precondition(lambda self: self.held is None and self.fds)
        @rule(i=st.integers(0, 100), how=st.sampled_from(["flock", "lockf", "ofd"]))
        def lock(self, i, how):
            self.held = self.fds[i % len(self.fds)]
            self.how = how
            _lock(self.held[1], how, "ex")
            self.view = self.stored

        @precondition(lambda self: self.held is not None)
        @rule(d=data)
        def write_at_end(self, d):
            _, fd, append = self.held
            if not append:
                os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, d)
            self.view += d

        @precondition(lambda self: self.held is not None and not self.held[2])
        @rule(d=data, offset=offsets)
        def pwrite(self, d, offset):
            os.pwrite(self.held[1], d, offset)
            v = self.view.ljust(offset, b"\0")
            self.view = v[:offset] + d + v[offset + len(d) :]

        @precondition(lambda self: self.held is not None)
        @rule(length=st.integers(0, 2000))
        def truncate(self, length):
            os.ftruncate(self.held[1], length)
            self.view = self.view[:length].ljust(length, b"\0")

        @precondition(lambda self: self.held is not None)
        @rule()
        def fsync(self):
            os.fsync(self.held[1])
            self.stored = self.view

        @precondition(lambda self: self.held is not None)
        @rule(close=st.booleans())
        def unlock(self, close):
            _, fd, _ = self.held
            _lock(fd, self.how, "un")
            self.stored = self.view
            if close:
                self.fds.remove(self.held)
                os.close(fd)
            self.held = None

        @precondition(lambda self: self.held is None and self.fds)
        @rule(i=st.integers(0, 100))
        def read_under_a_shared_lock(self, i):
            _, fd, _ = self.fds[i % len(self.fds)]
            _lock(fd, "flock", "sh")
            try:
                assert os.fstat(fd).st_size == len(self.stored)
                assert os.pread(fd, len(self.stored) + 10, 0) == self.stored
            finally:
                _lock(fd, "flock", "un")

        @invariant()
        def holder_reads_its_view(self):
            if getattr(self, "held", None) is not None:
                fd = self.held[1]
                assert os.fstat(fd).st_size == len(self.view)
                assert os.pread(fd, len(self.view) + 10, 0) == self.view

    Shared.TestCase.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    Shared.TestCase().runTest()

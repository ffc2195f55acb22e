"""The daemon's memory while a large file is edited in place: opening a stored file of
hundreds of MiB for writing reads it into the file's buffer (a temporary file) in pieces, so
the daemon's anonymous memory stays about what the driver's commit itself needs."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading

import pytest
from mounting import needs_fuse

pytestmark = [*needs_fuse, pytest.mark.slow]

SIZE = 512 << 20  # within SQLite's largest value (SQLITE_MAX_LENGTH, 10^9 bytes)


def _daemon_pid(mountpoint) -> int:
    out = subprocess.run(["pgrep", "-f", f"zarrfs.*{mountpoint}"], capture_output=True, text=True).stdout
    return int(out.split()[0])


class AnonPeak:
    """The largest ``RssAnon`` of a process, sampled every few ms while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            with open(f"/proc/{self.pid}/status") as fh:
                self.peak = max(self.peak, int(re.search(r"RssAnon:\s+(\d+)", fh.read()).group(1)) << 10)

    def __enter__(self) -> AnonPeak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_editing_the_middle_of_a_large_file_does_not_hold_it_in_memory(tmp_path, mount_factory, kind):
    m = mount_factory(f"{kind}://{tmp_path}/db.{kind}", ["create"])
    big = m.path / "big"
    data = bytearray(os.urandom(1 << 20)) * (SIZE >> 20)
    pid = _daemon_pid(m.path)
    with AnonPeak(pid) as written:  # what storing the value costs the driver
        with open(big, "wb") as fh:
            fh.write(data)
    with AnonPeak(pid) as peak:
        with open(big, "r+b") as fh:  # no O_TRUNC: the stored value is loaded, then changed
            fh.seek(SIZE // 2)
            fh.write(b"\0" * (1 << 20))
    data[SIZE // 2 : SIZE // 2 + (1 << 20)] = b"\0" * (1 << 20)
    os.posix_fadvise(os.open(big, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    with open(big, "rb") as fh:
        assert hashlib.sha256(fh.read()).digest() == hashlib.sha256(data).digest()
    # The commit needs what storing it needed (LMDB's dirty pages, SQLite's copies of the
    # bound value); the load held it twice more before (the value read whole, then its copy).
    assert peak.peak < written.peak + (128 << 20), (peak.peak >> 20, written.peak >> 20)

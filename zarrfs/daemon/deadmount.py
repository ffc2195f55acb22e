"""``-o auto_unmount`` that holds after ``kill -9``: a watcher process that clears the
mountpoint of a daemon that died without unmounting.

libfuse's own watcher (a ``fusermount3`` left running) misses some deaths: it may look at the
mount before the kernel has noticed the daemon is gone, and it dies with ``pkill -f zarrfs``
(its command line names the mount's type). This watcher runs in a session of its own with a
command line that names nothing of the mount: it holds the read end of a pipe whose write end
only the daemon has; when that end closes (the daemon exited, however) it waits until the
mountpoint either stops being a mount (a normal unmount) or its ``statfs`` says ``ENOTCONN``
(the daemon is gone), and then detaches it (``fusermount3 -u -z``, or ``umount -l`` where that is missing).
"""

from __future__ import annotations

import os
import subprocess
import sys

# The watcher's program: standard library only, so that it outlives any change to this package.
_WATCHER = r"""# auto_unmount watcher of a FUSE mount
import errno, os, shutil, subprocess, sys, time
said = b""
while chunk := os.read(0, 4096):  # the mountpoint's name, then nothing until the daemon ends
    said += chunk
mountpoint = os.fsdecode(said.split(b"\n")[0])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        if not os.path.ismount(mountpoint):
            break
        os.statvfs(mountpoint)  # asks the daemon (a stat may be answered from the kernel's cache)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            tool = shutil.which("fusermount3") or shutil.which("fusermount")
            cmd = [tool, "-u", "-z", mountpoint] if tool else ["umount", "-l", mountpoint]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            break
    time.sleep(0.1)
"""


def watch(mountpoint: str) -> subprocess.Popen:
    """Start the watcher of ``mountpoint``. The daemon keeps the returned process (and so the
    write end of its stdin, which no other child inherits) for as long as it lives."""
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )
    assert watcher.stdin is not None
    watcher.stdin.write(os.fsencode(mountpoint) + b"\n")
    watcher.stdin.flush()
    return watcher

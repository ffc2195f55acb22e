"""The mount table as the command line reads it (``/proc/self/mountinfo``), and the commands
that act on mounts made already: ``zarrfs umount`` and ``zarrfs status``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from zarrfs.oneline import fail
from zarrfs.urls import reason


def mounts() -> list[tuple[str, str, str, str]]:
    """``(mountpoint, fstype, source, options)`` of every mount this process sees."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 6 or len(tail) < 3:
                    continue
                found.append((_unescape(fields[4]), tail[0], _unescape(tail[1]), fields[5] + "," + tail[2]))
    except OSError:
        pass
    return found


def _unescape(text: str) -> str:
    for code in ("\\040", "\\011", "\\012", "\\134"):
        text = text.replace(code, chr(int(code[1:], 8)))
    return text


def mounted(mountpoint: str) -> bool:
    return any(mp == mountpoint for mp, *_ in mounts())


def daemon_pids(mountpoint: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"zarrfs" in b" ".join(argv[:3]) and b"mount" in argv and mountpoint.encode() in argv:
            pids.append(int(entry))
    return pids


def cmd_umount(args: argparse.Namespace) -> int:
    """``zarrfs umount``: unmount (open files were committed when closed) and wait for the
    daemon to finish."""
    mountpoint = os.path.abspath(args.mountpoint)
    if not mounted(mountpoint):
        if not os.path.exists(mountpoint):
            return fail(f"{mountpoint} does not exist")
        return fail(f"{mountpoint} is not mounted")
    if not any(mp == mountpoint for mp, _, _ in _zarrfsmounts()):
        fstype = next((t for mp, t, _, _ in reversed(mounts()) if mp == mountpoint), "?")
        return fail(f"{mountpoint} is not a zarrfs mount (it is {fstype}): use umount(8) for it")
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    pids = daemon_pids(mountpoint)
    cmd = [tool, "-u"] + (["-z"] if args.lazy else []) + [mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()
        message = said[-1] if said else "fusermount3 failed"
        if "not connected" in message:  # a daemon that died: clear the dead mountpoint
            result = subprocess.run([tool, "-u", "-z", mountpoint], capture_output=True, text=True)
            if result.returncode == 0:
                return 0
        if "busy" in message.lower():
            return fail(
                f"{mountpoint} is busy: files or folders in it are in use (close them, or "
                f"'zarrfs umount -z {mountpoint}' detaches it now and finishes once they are closed)"
            )
        reason = message.rpartition(": ")[2] if ": " in message else message
        return fail(f"cannot unmount {mountpoint}: {reason}")
    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        time.sleep(0.02)
    return 0


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _zarrfsmounts() -> list[tuple[str, str, str]]:
    """``(mountpoint, source, options)`` of the zarrfs mounts: type ``fuse.zarrfs``, or another
    FUSE type (``-o subtype=``) whose mountpoint has a zarrfs status socket."""
    from zarrfs.control import socket_path

    return [
        (mp, source, options)
        for mp, fstype, source, options in mounts()
        if fstype == "fuse.zarrfs"
        or (fstype.startswith("fuse.") and os.path.exists(socket_path(mp)))
    ]


def _alive(mountpoint: str) -> bool:
    """Whether the daemon of the mount at ``mountpoint`` is there: its status socket answers,
    or, without one, its statfs is answered (a dead daemon's mount says ENOTCONN)."""
    import errno
    import socket

    from zarrfs.control import socket_path

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(socket_path(mountpoint))
            return True
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:  # the socket of a daemon that was killed
                return False
    try:
        os.statvfs(mountpoint)  # asks the daemon (a stat may be answered from the kernel's cache)
    except OSError as exc:
        return exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED)
    return True


def cmd_status(args: argparse.Namespace) -> int:
    """``zarrfs status [MOUNTPOINT]``: the zarrfs mounts, or one mount's live figures."""
    from zarrfs.control import query, render_status

    mounts = _zarrfsmounts()
    if args.mountpoint is None:
        rows = [(mp, src, options, _alive(mp)) for mp, src, options in mounts]
        if args.json:
            doc = [{"mountpoint": mp, "url": src, "alive": alive} for mp, src, _, alive in rows]
            print(json.dumps(doc, indent=2))
            return 0
        for mp, source, options, alive in rows:
            mode = "ro" if "ro" in options.split(",") else "rw"
            state = "" if alive else f"\tdead: its daemon is gone (zarrfs umount {mp})"
            print(f"{mp}\t{source}\t{mode}{state}")
        if not mounts:
            print("no zarrfs mounts", file=sys.stderr)
        return 0
    mountpoint = os.path.abspath(args.mountpoint)
    if not any(mp == mountpoint for mp, _, _ in mounts):
        if not os.path.lexists(mountpoint):
            return fail(f"{mountpoint} does not exist")
        return fail(f"{mountpoint} is not a zarrfs mount (zarrfs status lists them)")
    if not _alive(mountpoint):
        return fail(f"the daemon of {mountpoint} is gone: 'zarrfs umount {mountpoint}' clears it")
    try:
        doc = query(os.path.realpath(mountpoint))
    except (OSError, ValueError) as exc:
        return fail(f"the daemon of {mountpoint} does not answer ({reason(exc)})")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(render_status(doc))
    return 0



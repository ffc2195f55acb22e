"""The mount table as the command line reads it (``/proc/self/mountinfo``), and the commands
that act on mounts made already: ``zarrfs umount`` and ``zarrfs status``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from zarrfs.cli.oneline import fail
from zarrfs.lines import one_line
from zarrfs.urls import reason
from zarrfs.usage import UsageError


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


def _field(text: str) -> str:
    """``text`` as one field of a tab-separated line: a backslash, tab or newline in it written
    as the mount table writes them (``\\134``, ``\\011``, ``\\012``), another control
    character as :func:`one_line` does (``\\x1b``)."""
    if "\\" in text or "\t" in text or "\n" in text:
        text = text.replace("\\", "\\134").replace("\t", "\\011").replace("\n", "\\012")
    return one_line(text)


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
    """``zarrfs umount MOUNTPOINT`` (``-a``: every zarrfs mount this user may unmount): unmount
    (open files were committed when closed) and wait for the daemons to finish; ``-z`` detaches
    now and returns at once (the daemon finishes once the last open file is closed)."""
    if args.all:
        if args.mountpoint is not None:
            raise UsageError("umount -a takes no MOUNTPOINT (it unmounts every zarrfs mount)")
        return _umount_all(args.lazy)
    if args.mountpoint is None:
        raise UsageError("umount takes a MOUNTPOINT, or -a for every zarrfs mount")
    mountpoint = os.path.abspath(args.mountpoint)
    if not mounted(mountpoint):
        if not os.path.exists(mountpoint):
            return fail(f"{mountpoint} does not exist")
        return fail(f"{mountpoint} is not mounted")
    if not any(mp == mountpoint for mp, _, _ in _zarrfsmounts()):
        fstype = next((t for mp, t, _, _ in reversed(mounts()) if mp == mountpoint), "?")
        return fail(f"{mountpoint} is not a zarrfs mount (it is {fstype}): use umount(8) for it")
    pids = daemon_pids(mountpoint)
    failure = _unmount(mountpoint, args.lazy)
    if failure is not None:
        return fail(failure)
    if not args.lazy:
        _wait_for({pid: mountpoint for pid in pids})
    return 0


def _umount_all(lazy: bool) -> int:
    """``zarrfs umount -a``: the zarrfs mounts of this user (root: all of them), each failure
    one line; the daemons are waited for together."""
    me = os.getuid()
    mine = [mp for mp, _, options in _zarrfsmounts() if me == 0 or owner(options) == me]
    daemons: dict[int, str] = {}
    status = 0
    for mountpoint in dict.fromkeys(reversed(mine)):  # a mount inside another first
        pids = daemon_pids(mountpoint)
        failure = _unmount(mountpoint, lazy)
        if failure is not None:
            status = fail(failure)
        else:
            daemons.update((pid, mountpoint) for pid in pids)
    if not lazy:
        _wait_for(daemons)
    return status


def _unmount(mountpoint: str, lazy: bool) -> str | None:
    """Unmount with fusermount3 (``-z``: lazily); the one line saying why not, or None."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode == 0:
        return None
    said = result.stderr.strip().splitlines()
    message = said[-1] if said else "fusermount3 failed"
    if "not connected" in message:  # a daemon that died: clear the dead mountpoint
        result = subprocess.run([tool, "-u", "-z", mountpoint], capture_output=True, text=True)
        if result.returncode == 0:
            return None
    if "busy" in message.lower():
        return (
            f"{mountpoint} is busy: files or folders in it are in use (close them, or "
            f"'zarrfs umount -z {mountpoint}' detaches it now and finishes once they are closed)"
        )
    why = message.rpartition(": ")[2] if ": " in message else message
    return f"cannot unmount {mountpoint}: {why}"


def _wait_for(daemons: dict[int, str]) -> None:
    """Wait until the daemons ``{pid: mountpoint}`` have ended (their last commits stored);
    after a second, say on stderr which ones are waited for. Ctrl-C stops the wait only."""
    said = False
    started = time.monotonic()
    try:
        while daemons:
            daemons = {p: mp for p, mp in daemons.items() if os.path.exists(f"/proc/{p}") and not _zombie(p)}
            if daemons and not said and time.monotonic() - started > 1:
                for pid, mp in daemons.items():
                    said_line = (f"zarrfs: unmounted {mp}; waiting for its daemon (pid {pid}) to store the "
                                 "last writes and end (Ctrl-C stops waiting, not the daemon)")
                    print(one_line(said_line), file=sys.stderr)
                said = True
            time.sleep(0.02)
    except KeyboardInterrupt:
        print("zarrfs: stopped waiting; the daemons end on their own", file=sys.stderr)


def _user(uid: int | None) -> str | None:
    """A user's name (their number when the system knows no name)."""
    import pwd

    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner(options: str) -> int | None:
    """The user who made a FUSE mount: ``user_id=`` of its options in the mount table."""
    for item in options.split(","):
        if item.startswith("user_id=") and item[8:].isdigit():
            return int(item[8:])
    return None


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _zarrfsmounts() -> list[tuple[str, str, str]]:
    """``(mountpoint, source, options)`` of the zarrfs mounts: type ``fuse.zarrfs``, or another
    FUSE type (``-o subtype=``) whose mountpoint has a zarrfs status socket."""
    from zarrfs.daemon.control import socket_path

    return [
        (mp, source, options)
        for mp, fstype, source, options in mounts()
        if fstype == "fuse.zarrfs"
        or (fstype.startswith("fuse.") and os.path.exists(socket_path(mp)))
    ]


def _alive(mountpoint: str) -> bool:
    """Whether the daemon of the mount at ``mountpoint`` is there: its status socket answers
    a ``ping`` (a request, answered: a probe that only connected and hung up made every daemon
    log a broken pipe), or, without one, its statfs is answered (a dead daemon's mount says
    ENOTCONN)."""
    import errno

    from zarrfs.daemon.control import query

    try:
        query(mountpoint, 2, {"op": "ping"})
        return True
    except TimeoutError:  # it took the connection: there, if slow (a statfs could hang)
        return True
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:  # the socket of a daemon that was killed
            return False
    except ValueError:  # it answered, but not in JSON: there all the same
        return True
    return _statfs_answers(mountpoint, 2)


def _statfs_answers(mountpoint: str, timeout: float) -> bool:
    """Whether the kernel does not say the mount's daemon is gone: a statfs asks the daemon (a
    stat may be answered from the kernel's cache). A daemon that is there but stopped never
    answers, so the call runs in a thread and a wait past ``timeout`` counts as there."""
    import errno
    import threading

    result: list[bool] = []

    def ask() -> None:
        try:
            os.statvfs(mountpoint)
            result.append(True)
        except OSError as exc:
            result.append(exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED))

    asker = threading.Thread(target=ask, name="statfs", daemon=True)
    asker.start()
    asker.join(timeout)
    return result[0] if result else True


def cmd_status(args: argparse.Namespace) -> int:
    """``zarrfs status [MOUNTPOINT]``: the zarrfs mounts, or one mount's live figures."""
    from zarrfs.daemon.control import query, render_status

    mounts = _zarrfsmounts()
    if args.mountpoint is None:
        rows = [(mp, src, options, _alive(mp)) for mp, src, options in mounts]
        if args.json:
            doc = [
                {"mountpoint": mp, "url": src, "alive": alive, "owner": _user(owner(options))}
                for mp, src, options, alive in rows
            ]
            print(json.dumps(doc, indent=2))
            return 0
        for mp, source, options, alive in rows:
            mode = "ro" if "ro" in options.split(",") else "rw"
            uid = owner(options)
            theirs = f"\tuser {_user(uid)}" if uid is not None and uid != os.getuid() else ""
            state = "" if alive else f"\tdead: its daemon is gone (zarrfs umount {_field(shlex.quote(mp))})"
            print(f"{_field(mp)}\t{_field(source)}\t{mode}{theirs}{state}")
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



"""``zarrfs stats``: a mount's live figures, a row a second as ``juicefs stats`` and ``vmstat``
print them (requests a second by kind, time per request, bytes, database transactions, folder
snapshot hits, errors), or once as Prometheus text for a scraper (``--prometheus``: every
mount this user can ask, when no mountpoint is given).

The figures are the counters of the daemon's status document (:mod:`zarrfs.daemon.control`); a row is
what changed since the row before, divided by the time between the two answers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from zarrfs.cli.oneline import fail
from zarrfs.usage import UsageError

# The kinds of requests a row shows, each the FUSE requests it counts; the rest is "other".
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lookup", ("lookup",)),
    ("attr", ("getattr",)),
    ("list", ("readdir", "readdirplus")),
    ("open", ("open", "opendir", "create")),
    ("read", ("read",)),
    ("write", ("write",)),
)
# The columns of a row, in groups: (title, column names).
COLUMNS = (
    ("requests/s", [name for name, _ in KINDS] + ["other"]),
    ("ms/req", ["all"]),
    ("MiB/s", ["read", "write"]),
    ("txns/s", ["read", "write"]),
    ("snapshot", ["hits/s"]),
    ("errors", ["/s"]),
)
WIDTH = 7  # of a column
HEADER_EVERY = 20  # rows between two headers on a terminal


def _groups(cells: list[str]) -> str:
    """``cells`` (one for each column) laid out in the groups of :data:`COLUMNS`."""
    out, at = [], 0
    for _, names in COLUMNS:
        out.append("".join(f"{cell:>{WIDTH}}" for cell in cells[at : at + len(names)]))
        at += len(names)
    return " ".join(out)


def header() -> str:
    """The two lines above the rows: the groups, then the columns."""
    titles = " ".join(f"{title:-^{WIDTH * len(names)}}" for title, names in COLUMNS)
    return titles + "\n" + _groups([name for _, names in COLUMNS for name in names])


def _figure(x: float) -> str:
    """A rate in at most 7 characters: 12, 3.4, 12.3K, 4.5M."""
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}K"
    if x >= 10 or x == 0:
        return f"{x:.0f}"
    return f"{x:.1f}"


def _counters(doc: dict[str, Any]) -> dict[str, float]:
    """The counters of one status document, flat: ``req.NAME``, ``busy``, ``bytes.read``..."""
    out: dict[str, float] = {}
    for name, count in (doc.get("requests") or {}).items():
        out[f"req.{name}"] = count
    out["busy"] = sum((doc.get("busy_ns") or {}).values())
    for side, n in (doc.get("bytes") or {}).items():
        out[f"bytes.{side}"] = n
    for side, n in (doc.get("transactions") or {}).items():
        out[f"txn.{side}"] = n
    out["hits"] = (doc.get("folder_snapshots") or {}).get("hits", 0)
    out["errors"] = sum((doc.get("errors") or {}).values())
    return out


def row(before: dict[str, Any], after: dict[str, Any], seconds: float) -> list[float]:
    """The figures of one row: what changed from status ``before`` to ``after`` in ``seconds``."""
    a, b = _counters(before), _counters(after)

    def delta(name: str) -> float:
        return max(0.0, b.get(name, 0) - a.get(name, 0))

    requests = {name[4:]: delta(name) for name in b if name.startswith("req.")}
    total = sum(requests.values())
    kinds = [sum(requests.get(op, 0) for op in ops) for _, ops in KINDS]
    per = max(seconds, 1e-9)
    return [
        *(n / per for n in kinds),
        (total - sum(kinds)) / per,
        delta("busy") / total / 1e6 if total else 0.0,
        delta("bytes.read") / per / 2**20,
        delta("bytes.written") / per / 2**20,
        delta("txn.read") / per,
        delta("txn.write") / per,
        delta("hits") / per,
        delta("errors") / per,
    ]


def row_text(figures: list[float]) -> str:
    """One row of figures under :func:`header`."""
    return _groups([_figure(x) for x in figures])


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# name, type, help: every family the exposition may hold, in this order.
FAMILIES = (
    ("zarrfs_up", "gauge", "Whether the daemon of the mount answered (0: it is gone or does not answer)."),
    ("zarrfs_mount_info", "gauge", "The database a mount serves (url, without credentials) and its mode."),
    ("zarrfs_uptime_seconds", "gauge", "Seconds since the mount was made."),
    ("zarrfs_requests_total", "counter", "FUSE requests answered, by kind."),
    ("zarrfs_request_errors_total", "counter", "FUSE requests answered with an error, by kind."),
    ("zarrfs_request_seconds_total", "counter", "Seconds spent answering FUSE requests, by kind."),
    ("zarrfs_read_bytes_total", "counter", "Bytes of files read through the mount."),
    ("zarrfs_written_bytes_total", "counter", "Bytes of files written through the mount."),
    ("zarrfs_transactions_total", "counter", "Database transactions begun, reading or writing."),
    ("zarrfs_folder_snapshot_hits_total", "counter", "Lookups a folder snapshot answered."),
    ("zarrfs_folder_snapshots_built_total", "counter", "Folder snapshots read from the database."),
    (
        "zarrfs_listing_windows_read_ahead_total",
        "counter",
        "Windows of folder listings read between requests, ahead of the program's next read.",
    ),
    (
        "zarrfs_listing_windows_taken_total",
        "counter",
        "Windows read ahead that a listing request took as read.",
    ),
    ("zarrfs_open_files", "gauge", "Files open through the mount."),
    ("zarrfs_resident_memory_bytes", "gauge", "Resident memory of the daemon."),
    ("zarrfs_database_bytes", "gauge", "Size of the database: its files, or the memory a Redis server uses."),
)


def prometheus_text(found: list[tuple[str, dict[str, Any] | None]]) -> str:
    """The Prometheus text exposition of ``(mountpoint, status document or None)`` pairs."""
    samples: dict[str, list[str]] = {name: [] for name, _, _ in FAMILIES}

    def add(name: str, mp: str, value: float, **labels: Any) -> None:
        extra = "".join(f',{key}="{_label(v)}"' for key, v in labels.items())
        number = str(value) if isinstance(value, int) else repr(float(value))
        samples[name].append(f'{name}{{mountpoint="{_label(mp)}"{extra}}} {number}')

    for mp, doc in found:
        add("zarrfs_up", mp, 0 if doc is None else 1)
        if doc is None:
            continue
        mode = "ro" if doc.get("readonly") else "rw"
        add("zarrfs_mount_info", mp, 1, url=doc.get("url", ""), mode=mode)
        add("zarrfs_uptime_seconds", mp, doc.get("uptime", 0))
        for op, n in sorted((doc.get("requests") or {}).items()):
            add("zarrfs_requests_total", mp, n, op=op)
        for op, n in sorted((doc.get("errors") or {}).items()):
            add("zarrfs_request_errors_total", mp, n, op=op)
        for op, ns in sorted((doc.get("busy_ns") or {}).items()):
            add("zarrfs_request_seconds_total", mp, ns / 1e9, op=op)
        sizes = doc.get("bytes") or {}
        add("zarrfs_read_bytes_total", mp, sizes.get("read", 0))
        add("zarrfs_written_bytes_total", mp, sizes.get("written", 0))
        for kind, n in sorted((doc.get("transactions") or {}).items()):
            add("zarrfs_transactions_total", mp, n, kind=kind)
        snapshots = doc.get("folder_snapshots")
        if snapshots is not None:
            add("zarrfs_folder_snapshot_hits_total", mp, snapshots.get("hits", 0))
            add("zarrfs_folder_snapshots_built_total", mp, snapshots.get("built", 0))
        ahead = doc.get("listings_read_ahead")
        if ahead is not None:
            add("zarrfs_listing_windows_read_ahead_total", mp, ahead.get("windows", 0))
            add("zarrfs_listing_windows_taken_total", mp, ahead.get("taken", 0))
        add("zarrfs_open_files", mp, doc.get("open_files", 0))
        memory = doc.get("memory") or {}
        if "VmRSS" in memory:
            add("zarrfs_resident_memory_bytes", mp, memory["VmRSS"])
        db = doc.get("database") or {}
        size = db.get("bytes", db.get("used_memory"))
        if size is not None:
            add("zarrfs_database_bytes", mp, size)
    lines = []
    for name, kind, text in FAMILIES:
        if samples[name]:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"


def _ask(mountpoint: str) -> dict[str, Any]:
    """The status document of the mount at ``mountpoint``, or a one-line :class:`LookupError`."""
    from zarrfs.cli.mounttable import _alive, _zarrfsmounts
    from zarrfs.daemon.control import query
    from zarrfs.urls import reason

    if not any(mp == mountpoint for mp, _, _ in _zarrfsmounts()):
        if not os.path.lexists(mountpoint):
            raise LookupError(f"{mountpoint} does not exist")
        raise LookupError(f"{mountpoint} is not a zarrfs mount (zarrfs status lists them)")
    try:
        return query(os.path.realpath(mountpoint))
    except (OSError, ValueError) as exc:
        if not _alive(mountpoint):
            gone = f"the daemon of {mountpoint} is gone: 'zarrfs umount {mountpoint}' clears it"
            raise LookupError(gone) from None
        raise LookupError(f"the daemon of {mountpoint} does not answer ({reason(exc)})") from None


def cmd_stats(args: argparse.Namespace) -> int:
    """``zarrfs stats [--prometheus] [MOUNTPOINT]``."""
    if args.prometheus:
        return _prometheus(args.mountpoint)
    if args.mountpoint is None:
        raise UsageError("stats takes a MOUNTPOINT (or --prometheus, for every zarrfs mount)")
    if not args.interval > 0:
        raise UsageError(f"stats --interval takes seconds, more than 0 (got {args.interval:g})")
    if args.count is not None and args.count < 1:
        raise UsageError(f"stats --count takes a number of rows, 1 or more (got {args.count})")
    mountpoint = os.path.abspath(args.mountpoint)
    terminal = sys.stdout.isatty()
    try:
        before, at = _ask(mountpoint), time.monotonic()
        shown = 0
        while args.count is None or shown < args.count:
            time.sleep(args.interval)
            after, now = _ask(mountpoint), time.monotonic()
            if shown == 0 or (terminal and shown % HEADER_EVERY == 0):
                print(header())
            print(row_text(row(before, after, now - at)), flush=True)
            before, at = after, now
            shown += 1
    except LookupError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 0
    return 0


def _prometheus(mountpoint: str | None) -> int:
    from zarrfs.cli.mounttable import _zarrfsmounts
    from zarrfs.daemon.control import query

    if mountpoint is not None:
        try:
            found = [(os.path.abspath(mountpoint), _ask(os.path.abspath(mountpoint)))]
        except LookupError as exc:
            return fail(str(exc))
    else:
        found = []
        for mp, _, _ in _zarrfsmounts():
            try:
                # The mount table's path as it is: resolving it would stat the mount, and a
                # hung daemon's mount would hang the scrape.
                found.append((mp, query(mp, timeout=2.0)))
            except (OSError, ValueError):
                found.append((mp, None))  # zarrfs_up 0
    sys.stdout.write(prometheus_text(found))
    return 0

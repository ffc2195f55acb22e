"""The status endpoint of a running mount: a unix socket answered by a small thread.

``zarrfs status MOUNTPOINT`` connects to it and reads one JSON document: the database URL (no
credentials), its size, requests and errors by type, open files, folder snapshots, the version
served (an Icechunk branch or tag, a snapshot held). A client sends one JSON request first
(``{"op": "status"}``; ``{"op": "ping"}``, whether it answers; ``{"op": "commit", "message":
...}`` for ``zarrfs commit``), then shuts its side down; the answer is one JSON document
(``{"error": ...}`` when refused). The socket lives in :func:`runtime_folder` (``/run/zarrfs``
for root, ``$XDG_RUNTIME_DIR/zarrfs`` or ``/tmp/zarrfs-UID`` for a user; the folder is 0700 and
the socket 0600: its owner and root only), named after the mountpoint; root finds every user's
(:func:`socket_path`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from zarrfs.lines import one_line

log = logging.getLogger("zarrfs.daemon.control")

_SUN_PATH_MAX = 107


def runtime_folder() -> str:
    """The folder of the status sockets of this user's mounts."""
    if os.geteuid() == 0:
        return "/run/zarrfs"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(runtime, "zarrfs") if runtime else f"/tmp/zarrfs-{os.geteuid()}"


def _socket_name(folder: str, mountpoint: str) -> str:
    from zarrfs.daemon.logs import escape_path

    path = os.path.join(folder, escape_path(mountpoint) + ".sock")
    if len(path.encode()) > _SUN_PATH_MAX:  # too long for a unix socket address
        digest = hashlib.sha256(os.fsencode(mountpoint)).hexdigest()[:32]
        path = os.path.join(folder, digest + ".sock")
    return path


def own_socket_path(mountpoint: str) -> str:
    """The status socket a daemon of this user makes for the mount at ``mountpoint``."""
    return _socket_name(runtime_folder(), mountpoint)


def _users_folders() -> list[str]:
    """The runtime folders of every user's daemons (what root looks through): the systemd
    one (``/run/user/UID/zarrfs``) and the fallback (``/tmp/zarrfs-UID``), each owned by its user."""
    import glob

    found = []
    for pattern, uid_at in (("/run/user/*/zarrfs", -2), ("/tmp/zarrfs-*", -1)):
        for folder in sorted(glob.glob(pattern)):
            uid = folder.split("/")[uid_at].removeprefix("zarrfs-")
            try:
                st = os.lstat(folder)
            except OSError:
                continue
            if uid.isascii() and uid.isdigit() and st.st_uid == int(uid):  # not another user's folder
                found.append(folder)
    return found


def socket_path(mountpoint: str) -> str:
    """The status socket of the mount at ``mountpoint`` (an absolute, resolved path): this
    user's; for root, another user's too when the mount is theirs."""
    path = own_socket_path(mountpoint)
    if os.geteuid() != 0 or os.path.exists(path):
        return path
    for folder in _users_folders():
        theirs = _socket_name(folder, mountpoint)
        if os.path.exists(theirs):
            return theirs
    return path


def query(mountpoint: str, timeout: float = 5.0, request: dict[str, Any] | None = None) -> dict[str, Any]:
    """The daemon's answer to ``request`` (default: the status document) from the mount at
    ``mountpoint`` (OSError when nothing answers)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path(mountpoint))
        sock.sendall(json.dumps(request or {"op": "status"}).encode())
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks))


class NoAnswer(Exception):
    """The daemon of a mount does not answer on its socket: one line saying so."""


def ask(mountpoint: str, request: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """:func:`query` for the command line: the mountpoint as given, a failure as :class:`NoAnswer`."""
    try:
        return query(os.path.realpath(mountpoint), timeout, request)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise NoAnswer(f"the daemon of {mountpoint} does not answer ({reason})") from None


def _copy(mapping: Any) -> dict[str, Any]:
    for _ in range(10):  # the serving thread may add a key meanwhile
        try:
            return dict(mapping)
        except RuntimeError:
            continue
    return {}


def databasesize_text(url: str, driver: Any) -> dict[str, Any]:
    """What the database holds: bytes on disk for a file database (its files as its driver
    declares them), else what its driver tells (keys and memory for Redis)."""
    from zarrfs.backends.registry import bare_path_scheme, files_of
    from zarrfs.backends.urls import database_path, url_scheme

    path = database_path(url)
    files_of_kind = None if path is None else files_of(url_scheme(url) or bare_path_scheme(path))
    if path is not None and files_of_kind is not None:
        total = used = 0
        for name in files_of_kind.files(path):
            try:
                st = os.stat(name)
            except OSError:
                continue
            total += st.st_size
            used += st.st_blocks * 512
        return {"path": path, "bytes": total, "disk_bytes": used}
    return driver.usage()


def _nodes(session: Any) -> dict[str, int] | None:
    """The node IDs the kernel holds (after a LOOKUP or READDIRPLUS) and the forgotten ones kept
    for their inode numbers."""
    inodes = getattr(session, "inodes", None)
    if inodes is None:
        return None
    idle = len(inodes.idle)
    return {"held": len(inodes) - idle, "idle": idle}


def _memory() -> dict[str, int]:
    """The daemon's resident memory in bytes: all of it, and the part that is its own (not
    pages of files it maps, such as LMDB's, which the kernel can take back at any time)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "RssAnon", "VmHWM"):
                    found[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


class ControlServer:
    """Answers each connection to the mount's status socket with one JSON document."""

    def __init__(self, mountpoint, url, driver, session, handles, tree, opts) -> None:
        self.mountpoint = mountpoint
        self.url = url
        self.driver = driver
        self.session = session
        self.handles = handles
        self.tree = tree
        self.opts = opts
        self.started = time.time()
        self.path = own_socket_path(mountpoint)
        folder = os.path.dirname(self.path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(self.path)  # left by a daemon that was killed
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            self.sock.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.sock.listen(8)
        self._closed = False
        self.thread = threading.Thread(target=self._serve, name="zarrfs-status", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def status(self) -> dict[str, Any]:
        """The live figures of the mount."""
        stats = getattr(self.session, "stats", None)
        figures = stats() if callable(stats) else {}
        cache = getattr(self.tree, "folder_cache", None)
        return {
            "mountpoint": self.mountpoint,
            "url": self.url,
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 1),
            "readonly": self.opts.readonly,
            "requests": _copy(figures.get("requests", {})) if stats else None,
            "errors": _copy(figures.get("errors", {})) if stats else None,
            "busy_ns": _copy(figures.get("busy_ns", {})) if stats else None,
            "bytes": figures.get("bytes"),
            "notifications": figures.get("notifications"),
            "request_cpu_us": _copy(figures["cpu_us"]) if "cpu_us" in figures else None,
            "open_files": len(self.handles.handles),
            "folder_snapshots": None
            if cache is None
            else {
                "held": cache.folders_held,
                "built": cache.builds,
                "hits": cache.hits,
                "lifetime": cache.ttl,
                "entries": cache.held,
                "entries_max": cache.entries,
            },
            # Windows of listings read between requests, and those a request took as read.
            "listings_read_ahead": {
                "windows": self.tree.listings.read_ahead,
                "taken": self.tree.listings.taken,
            },
            "nodes": _nodes(self.session),
            "memory": _memory(),
            "database": databasesize_text(self.url, self.driver),
            "transactions": {"read": self.driver.reads, "write": self.driver.writes},
            "version": self._version(),
        }

    def _version(self) -> dict[str, Any] | None:
        return self.driver.version()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request (see the module docstring)."""
        op = request.get("op", "status")
        if op == "status":
            return self.status()
        if op == "ping":  # zarrfs status's look at whether the daemon answers: nothing to compute
            return {"pid": os.getpid()}
        if op == "commit":
            if not self.driver.versioned:
                return {"error": "this mount has nothing to commit: only an Icechunk branch takes commits"}
            try:
                message, rebase = str(request.get("message") or ""), bool(request.get("rebase"))
                return self.driver.commit(message, rebase, request.get("branch"))
            except Exception as exc:  # one line for the client; the daemon goes on
                return {"error": str(exc)}
        return {"error": f"unknown request {op!r}"}

    def _request(self, conn: socket.socket) -> dict[str, Any]:
        """The client's request: read until it shuts its side down (a client that sends
        nothing gets the status)."""
        conn.settimeout(5.0)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
        try:
            request = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            return {"op": "?"}
        return request if isinstance(request, dict) else {"op": "?"}

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(json.dumps(self.answer(self._request(conn))).encode())
                except (BrokenPipeError, ConnectionResetError) as exc:  # the client went away
                    log.debug("status client gone before the answer: %s", exc)
                except Exception as exc:  # a status must never take the daemon down
                    log.warning("status request failed: %s", exc)

    def close(self) -> None:
        """Stop answering and remove the socket."""
        self._closed = True
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def size_text(n: float) -> str:
    """A byte count for people: ``3.1 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _counts(figures: dict[str, int] | None) -> str:
    if figures is None:
        return "not counted by this daemon"
    if not figures:
        return "none"
    ordered = sorted(figures.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {count}" for name, count in ordered)


def version_text(version: dict[str, Any]) -> str:
    """The ``version`` line of ``zarrfs status``: what version of the data the mount serves."""
    if version.get("kind") == "icechunk":
        if version.get("branch"):
            where = f"branch {version['branch']}"
        else:
            where = f"tag {version['tag']}" if version.get("tag") else "snapshot"
        text = f"Icechunk {where} at {version['snapshot']}"
        if version.get("writable"):
            text += ", uncommitted writes" if version.get("uncommitted") else ", nothing uncommitted"
        aside = version.get("kept_aside") or []
        return text + (f", {len(aside)} file(s) not Zarr v3 keys kept in memory only" if aside else "")
    if version.get("kind") == "snapshot":
        name = f" {version['name']}" if version.get("name") else ""
        limit = f"held at most {version['limit']:g} s" if version.get("limit") else "held without a limit"
        return (
            f"snapshot{name} taken {version['age']:g} s ago ({limit}); "
            f"it costs the writers: {version['cost']}"
        )
    return json.dumps(version)


def render_status(doc: dict) -> str:
    """The lines ``zarrfs status MOUNTPOINT`` prints for a daemon's answer ``doc``."""
    db = doc.get("database") or {}
    if "bytes" in db:
        size = f"{size_text(db['bytes'])} ({size_text(db['disk_bytes'])} on disk)"
    elif "keys" in db:
        size = f"{db['keys']} Redis keys, {size_text(db.get('used_memory') or 0)} used by the server"
    else:
        size = db.get("error", "size unknown")
    cache = doc.get("folder_snapshots")
    snapshots = (
        "off"
        if cache is None
        else f"{cache['held']} held, {cache['built']} built (lifetime {cache['lifetime']:g} s), "
        f"{cache.get('entries', 0)} of at most {cache.get('entries_max', 0)} entries"
    )
    nodes = doc.get("nodes") or {}
    memory = doc.get("memory") or {}
    txns = doc.get("transactions") or {"read": 0, "write": 0}
    mode = "read-only" if doc["readonly"] else "read-write"
    rows = [
        ("mountpoint", doc["mountpoint"]),
        ("database", f"{doc['url']}: {size}"),
        ("daemon", f"pid {doc['pid']}, up {doc['uptime']:g} s, {mode}"),
        ("open files", str(doc["open_files"])),
        ("snapshots", snapshots),
        *([("version", version_text(doc["version"]))] if doc.get("version") else []),
        ("nodes", f"{nodes.get('held', 0)} held by the kernel, {nodes.get('idle', 0)} forgotten and kept"),
        (
            "memory",
            f"{size_text(memory.get('VmRSS', 0))} resident ({size_text(memory.get('RssAnon', 0))} its own), "
            f"peak {size_text(memory.get('VmHWM', 0))}",
        ),
        ("requests", _counts(doc.get("requests"))),
        ("errors", _counts(doc.get("errors"))),
        ("txns", "{read} reading, {write} writing (database transactions begun)".format(**txns)),
    ]
    # A mountpoint or URL holding a newline stays on its row (zarrfs.lines).
    return "\n".join(f"{name:<11} {one_line(value)}" for name, value in rows)

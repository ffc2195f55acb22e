"""Observers of one operation, run as processes of their own while a test repeats the operation
(``tests/sharing/test_atomicity.py``): each looks at the state again and again and reports every
observation that is neither the state before an operation nor the state after it.

    python tests/observers.py OP mount ROOT [COUNTS]  # probes through a mount (the same one, or
                                                      # another); COUNTS: an exchange's (Exchanges)
    python tests/observers.py OP db URL          # the database's own client: one read transaction each

It prints ``ready``, then a line per observation (``.``, or ``! what was wrong``; ``~`` for a
read that failed with ESTALE, no observation), until its standard input closes. The writer of
each operation goes forward through generations ``k`` (``d/f0`` renamed to ``d/f1``, then to
``d/f2``...), so a name that is gone never comes back and a state never repeats. A database
client reads everything at once; a probe through a mount is one path at a time, so the checks
through a mount rest on that order in time:

* a name of an older generation, once seen missing, is never seen present again (``gone``);
* once a name of the newer generation is seen, no name of the older one is seen after it.

A two-step version of an operation (a folder rename that moves its last file in a second
transaction) shows a state in between for the time between its two commits; an observer that
looks then sees both generations, or one name gone and the next present.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
import struct
import sys
import threading

# --- what each operation's writer writes (the test imports these) -------------------------


class Exchanges:
    """Two counters in a file the exchange's writer shares with its observers: exchanges begun
    and exchanges ended (the writer's ``renameat2`` returned). A path lookup and the open that
    follows it are two steps: a lookup made while an exchange is under way may find a name's
    node of before it, and the open that follows read that node's content after it and after
    the rewrite behind it (as on a local disk, where a process can be preempted between the
    two). A read that overlapped an exchange is not evidence of which file a name was."""

    _COUNTS = struct.Struct("<QQ")

    def __init__(self, path: str, create: bool = False) -> None:
        if create:
            with open(path, "wb") as fh:
                fh.write(bytes(self._COUNTS.size))
        with open(path, "r+b") as fh:
            self._map = mmap.mmap(fh.fileno(), self._COUNTS.size)

    def counts(self) -> tuple[int, int]:
        """``(begun, ended)``."""
        return self._COUNTS.unpack_from(self._map)

    def begin(self) -> None:
        begun, ended = self.counts()
        self._COUNTS.pack_into(self._map, 0, begun + 1, ended)

    def end(self) -> None:
        begun, ended = self.counts()
        self._COUNTS.pack_into(self._map, 0, begun, ended + 1)



def content(k: int) -> bytes:
    """The value of generation ``k`` of a rewritten file: a header naming ``k``, then bytes
    that depend on it, of a size that changes with ``k`` (a half of it is never another)."""
    size = 2_000 + (k % 5) * 30_011
    head = b"gen %08d " % k
    body = hashlib.sha256(head).digest() * (size // 32 + 1)
    return (head + body)[:size]


def content_ok(value: bytes) -> int | None:
    """The generation of a whole value written by :func:`content`, or None when torn."""
    try:
        k = int(bytes(value[4:12]))
    except ValueError:
        return None
    return k if bytes(value) == content(k) else None


FOLDER_PARTS = ["a", "b/c", "b/d/e"]  # files of the folder renamed; b/d/e moves last
GROUP_KEYS = [f"c/{i:02d}" for i in range(12)]  # keys of a folder that delete_dir removes
DIR_MODE = 0o710


def name(op: str, k: int) -> str:
    """The name of generation ``k``'s node: what the operation renames, links, removes."""
    return {
        "rename_file": f"d/f{k}",
        "rename_folder": f"g{k}",
        "link": f"l{k}",
        "rmdir": f"r{k}",
        "delete_dir": f"z{k}",
    }[op]


def paths(op: str, k: int) -> list[str]:
    """The files of generation ``k`` whose presence a mount observer probes."""
    if op == "rename_folder":
        return [f"{name(op, k)}/{p}" for p in FOLDER_PARTS]
    if op == "delete_dir":
        return [f"{name(op, k)}/{p}" for p in GROUP_KEYS]
    return [name(op, k)]


# --- through a mount ------------------------------------------------------------------------


def _exists(path: str) -> bool:
    try:
        os.lstat(path)
        return True
    except FileNotFoundError:
        return False


class Stale(Exception):
    """The file was replaced between the open and the read: the read failed with ESTALE,
    which the README allows (an error, never parts of two versions). No observation."""


def _read(path: str, stat_too: bool = False):
    """The content of ``path`` through one descriptor (None: no such file); with ``stat_too``,
    also that descriptor's ``fstat`` after the read."""
    try:
        with open(path, "rb") as fh:
            value = fh.read()
            return (value, os.fstat(fh.fileno())) if stat_too else value
    except FileNotFoundError:
        return (None, None) if stat_too else None
    except OSError as exc:
        if exc.errno == errno.ESTALE:
            raise Stale from exc
        raise


class Times:
    """A rewritten file's mtime, seen with each generation of its content: every commit records
    a new one with the value, so a generation seen again has the mtime it had, and a newer one
    a later mtime (a value and its attribute record of two commits show otherwise)."""

    def __init__(self) -> None:
        self.k: int | None = None
        self.mtime = 0

    def check(self, k: int, mtime: int | None) -> str | None:
        if mtime is None:
            return f"generation {k} without its attribute record"
        if self.k is not None and (k == self.k and mtime != self.mtime or k > self.k and mtime <= self.mtime):
            return f"generation {k} with mtime {mtime}, generation {self.k} had {self.mtime}"
        self.k, self.mtime = k, mtime
        return None


class MountObserver:
    """The checks of one operation through a mount at ``root``; ``k`` is the generation it
    believes current (it moves forward as it finds newer ones)."""

    def __init__(self, op: str, root: str, exchanges: Exchanges | None = None) -> None:
        self.op, self.root, self.k = op, root, 0
        self.times = Times()
        self.exchanges = exchanges

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def observe(self) -> str | None:
        if self.op in ("commit", "store_set"):
            return self._value()
        if self.op == "exchange":
            return self._exchange()
        if self.op == "link":
            return self._link()
        if self.op == "rmdir":
            return self._rmdir()
        return self._moved()

    def _catch_up(self) -> None:
        """Move ``k`` to a generation whose first name exists (the writer may be far ahead)."""
        for j in range(self.k, self.k + 1000):
            if _exists(self.path(paths(self.op, j)[0])):
                self.k = j
                return

    def _moved(self) -> str | None:
        """rename_file, rename_folder, delete_dir: the names of generation k go, at once, and
        (for a rename) those of k+1 come, at once."""
        self._catch_up()
        old, new = paths(self.op, self.k), paths(self.op, self.k + 1)
        rename = self.op != "delete_dir"
        seen: list[str] = []
        gone = newer = None
        # Old names, last first and again first; then the new ones; then the old ones again.
        order = [(p, "old") for p in [*old[::-1], *old]]
        if rename:
            order += [(p, "new") for p in new] + [(p, "old") for p in old]
        for rel, age in order:
            present = _exists(self.path(rel))
            seen.append(f"{rel}:{int(present)}")
            if age == "old" and present and gone is not None:
                return f"{rel} present after {gone} was gone: {' '.join(seen)}"
            if age == "old" and present and newer is not None:
                return f"{rel} present after {newer} was there: {' '.join(seen)}"
            if age == "old" and not present:
                gone = gone or rel
            if age == "new" and present:
                newer = newer or rel
        return None

    def _value(self) -> str | None:
        """commit, store_set: the file read through one descriptor is one whole generation,
        never older than one read before."""
        value, st = _read(self.path("f"), stat_too=True)
        if value is None:
            return "f is missing"
        k = content_ok(value)
        if k is None:
            return f"f torn: {len(value)} bytes read, starts {bytes(value[:12])!r}"
        if k < self.k:
            return f"f went back from generation {self.k} to {k}"
        self.k = k
        if st.st_size != len(value):
            return f"f: generation {k} read whole, its descriptor's size {st.st_size} ({len(value)})"
        return self.times.check(k, st.st_mtime_ns) if self.op == "commit" else None

    def _exchange(self) -> str | None:
        """exchange: x holds generation k, n holds k+1 (rewritten) or k-1 (exchanged); read x,
        then n, then x: when x did not change meanwhile, neither did the pair."""
        ended = None if self.exchanges is None else self.exchanges.counts()[1]
        first = _read(self.path("x"))
        # The first read's lookup of x may be of before an exchange it overlapped, its content
        # of after it (see Exchanges): then x may seem to hold what n holds next.
        overlapped = ended is not None and self.exchanges.counts()[0] != ended
        other, again = _read(self.path("n")), _read(self.path("x"))
        if first is None or other is None or again is None:
            return "x or n missing"
        a, b, c = (content_ok(v) for v in (first, other, again))
        if None in (a, b, c):
            return f"torn value: x {a}, n {b}, x {c}"
        if a == c and abs(a - b) != 1 and not overlapped:
            return f"x holds {a} and n holds {b}"
        return None

    def _link(self) -> str | None:
        """link: a new name is the file, with its link count, from its first appearance."""
        self._catch_up()
        try:
            src = os.lstat(self.path("s"))
            for j in (self.k, self.k + 1):
                st = os.lstat(self.path(name("link", j)))
                if st.st_ino != src.st_ino or st.st_nlink < 2:
                    return f"l{j}: inode {st.st_ino} (s: {src.st_ino}), {st.st_nlink} links"
        except FileNotFoundError:
            pass
        return None

    def _rmdir(self) -> str | None:
        """rmdir: a folder is there with its mode, or not there."""
        self._catch_up()
        for j in (self.k, self.k + 1):
            try:
                mode = stat.S_IMODE(os.lstat(self.path(name("rmdir", j))).st_mode)
            except FileNotFoundError:
                continue
            if mode != DIR_MODE:
                return f"r{j} has mode {oct(mode)}"
        return None


# --- the database's own client -------------------------------------------------------------


class DatabaseObserver:
    """The checks of one operation on a snapshot of the database: every data key and the side
    records that belong to them, read in one transaction."""

    def __init__(self, op: str, url: str) -> None:
        from zarrfs.backends import open_driver

        self.op = op
        self.driver = open_driver(url, readonly=True)
        self.k = 0
        self.times = Times()

    def snapshot(self, t):
        from zarrfs.backends.base import SIDE, VALUES

        data = {k: bytes(v) for k, v in t.scan("", None, fetch=VALUES)}
        side = {k: bytes(v) for k, v in t.scan("", None, space=SIDE, fetch=VALUES)}
        return data, side

    def observe(self) -> str | None:
        data, side = self.driver.transact(self.snapshot, write=False)
        return getattr(self, "_" + self.op)(data, side)

    @staticmethod
    def _gens(keys, op: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        stem = name(op, 0)[:-1]
        for key in keys:
            head = key.split("/")[0] if op != "rename_file" else key
            if head.startswith(stem) and head[len(stem) :].isdigit():
                out.setdefault(int(head[len(stem) :]), []).append(key)
        return out

    def _value_at(self, data, key: str) -> str | None:
        if key not in data:
            return f"{key} is missing"
        k = content_ok(data[key])
        if k is None:
            return f"{key} torn: {len(data[key])} bytes, starts {data[key][:12]!r}"
        if k < self.k:
            return f"{key} went back from generation {self.k} to {k}"
        self.k = k
        return None

    def _commit(self, data, side):
        """The value of one generation, with that generation's attribute record."""
        from zarrfs.fs.sidedata import Attrs, attr_key

        wrong = self._value_at(data, "f")
        if wrong is None:
            attrs = Attrs.unpack(side.get(attr_key("f"), b""))
            wrong = self.times.check(self.k, None if attrs is None else attrs.mtime)
        return wrong

    def _store_set(self, data, side):
        return self._value_at(data, "f")


    def _exchange(self, data, side):
        x, n = data.get("x", b""), data.get("n", b"")
        a, b = content_ok(x), content_ok(n)
        if a is None or b is None or abs(a - b) != 1:
            return f"x holds {a} ({len(x)} bytes, {x[:12]!r}) and n holds {b} ({len(n)} bytes, {n[:12]!r})"
        return None

    def _rename_file(self, data, side):
        gens = self._gens(data, "rename_file")
        if len(gens) != 1:
            return f"names: {sorted(k for ks in gens.values() for k in ks)}"
        return None

    def _rename_folder(self, data, side):
        gens = self._gens(data, "rename_folder")
        want = sorted(FOLDER_PARTS)
        if len(gens) != 1 or sorted(k.split("/", 1)[1] for k in next(iter(gens.values()))) != want:
            return f"keys: {sorted(k for ks in gens.values() for k in ks)}"
        return None

    def _delete_dir(self, data, side):
        for k, keys in self._gens(data, "delete_dir").items():
            if len(keys) != len(GROUP_KEYS):
                return f"z{k} holds {len(keys)} of its {len(GROUP_KEYS)} keys"
        return None

    def _link(self, data, side):
        """A new name holds the file's value, and is one of its link group's names."""
        from zarrfs.fs.sidedata import pointer_key

        group = side.get(pointer_key("s"))
        for k in self._gens(data, "link"):
            key = name("link", k)
            if data[key] != data.get("s"):
                return f"{key}: value {data[key][:8]!r}, s: {data.get('s', b'')[:8]!r}"
            if group is None or side.get(pointer_key(key)) != group:
                return f"{key}: link group {side.get(pointer_key(key))!r}, s: {group!r}"
        return None

    def _rmdir(self, data, side):
        from zarrfs.fs.sidedata import attr_key, entry_key

        for k in range(max(self.k - 2, 0), self.k + 1000):
            marked, attrs = entry_key(name("rmdir", k)) in side, attr_key(name("rmdir", k)) in side
            if marked != attrs:
                return f"r{k}: folder mark {marked}, attribute record {attrs}"
            if marked:
                self.k = k
        return None


def main() -> None:
    op, kind, where = sys.argv[1:4]
    exchanges = Exchanges(sys.argv[4]) if len(sys.argv) > 4 else None
    observer = MountObserver(op, where, exchanges) if kind == "mount" else DatabaseObserver(op, where)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("ready", flush=True)
    while not done.is_set():
        try:
            wrong = observer.observe()
        except Stale:
            print("~", flush=True)
            continue
        except OSError as exc:  # a probe through a mount that failed otherwise than ENOENT
            wrong = f"{type(exc).__name__}: {exc}"
        print("." if wrong is None else f"! {wrong}", flush=True)


if __name__ == "__main__":
    main()

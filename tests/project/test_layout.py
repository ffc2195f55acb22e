"""The layers of ``zarrfs`` and which may import which, read from the source: ``cli -> daemon ->
fuse -> fs -> format/backends``. ``fuse`` sees the filesystem only through ``fs.api``;
``format`` knows no database and no filesystem; the drivers (``backends``) know nothing above
them; ``tools``, ``store`` and ``urlfs`` (the fsspec filesystems, over ``store``) use the
public parts of ``fs`` and ``backends``, never the daemon or the command line. The modules
left at the package's root (what a URL names, the mount options, the usage error, the spin
window) sit below the daemon: the tools and the fsspec filesystems use them too. No module
reaches itself through its imports, type-only ones included. A node's side records
(``fs.sidedata``'s layout) are written and deleted by ``fs.records`` alone."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "zarrfs"

# Layer (a module's name under zarrfs: its first name, or a module or package within one) ->
# the names it must not import. A name covers the modules under it; a module follows the rules
# of every layer that covers it.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "backends": ("fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
    "format": ("backends", "fs", "fuse", "daemon", "cli", "tools", "store", "urlfs"),
    "fs": ("fuse", "daemon", "cli", "tools", "store", "urlfs"),
    "fuse": ("backends", "format", "daemon", "cli", "tools", "store", "urlfs"),
    "daemon": ("cli",),
    "tools": ("daemon", "cli", "fuse"),
    "store": ("daemon", "cli", "fuse", "tools"),
    "urlfs": ("daemon", "cli", "fuse", "tools"),
    # zarrfs stats reads a daemon's status socket and knows nothing else of it.
    "cli.stats": ("fuse", "fs", "format", "backends", "tools", "store", "urlfs"),
    # At the root, below the daemon: the tools and the fsspec filesystems use them.
    "urls": ("fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
    "dbfiles": ("fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
    "options": ("daemon", "cli", "tools", "store", "urlfs"),
    "usage": ("backends", "fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
    # The polling window the request loop and the Redis link share (neither may import the other).
    "spin": ("backends", "fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
}
# What of the filesystem a layer may import, when it may import only part of it.
FS_PUBLIC: dict[str, tuple[str, ...]] = {
    "fuse": ("fs.api",),
    "tools": ("fs.api", "fs.sidedata", "fs.manifest", "fs.parts", "fs.records", "fs.names", "fs.errors"),
    "store": ("fs.api", "fs.records", "fs.parts"),
    "urlfs": ("fs.parts",),
}
# What of the daemon a layer may import, when it may import only part of it.
DAEMON_PUBLIC: dict[str, tuple[str, ...]] = {
    "cli.stats": ("daemon.control",),
}
# The shared parts of the drivers (what a third-party driver uses too); a driver's own package
# is its own.
BACKENDS_PRIVATE = ("lmdb", "sqlite", "postgres", "redis", "redis_cluster")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imported(name: str) -> set[str]:
    """The modules of zarrfs that module ``name`` imports anywhere in it (at the top, inside a
    function, or for type checking only), each by its full name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in MODULES and t != name)
    return out


GRAPH = {name: imported(name) for name in MODULES}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def breaks(importer: str, target: str) -> bool:
    """Whether ``importer`` may not import ``target`` (full module names)."""
    layer = importer.split(".")[1] if "." in importer else ""
    source = importer.removeprefix("zarrfs")
    inner = target.removeprefix("zarrfs.")
    if any(under(source, "." + name) and under(inner, f) for name, fs in FORBIDDEN.items() for f in fs):
        return True
    for public, part in ((FS_PUBLIC, "fs"), (DAEMON_PUBLIC, "daemon")):
        for name, allowed in public.items():
            if under(source, "." + name) and under(inner, part) and not any(under(inner, p) for p in allowed):
                return True
    if layer not in ("backends", "") and under(inner, "backends"):
        driver = inner.split(".")[1] if inner.count(".") else ""
        return driver in BACKENDS_PRIVATE and inner.count(".") > 1
    return False


def test_every_import_follows_the_layers():
    assert len(MODULES) > 100
    found = {(a, b) for a, targets in GRAPH.items() for b in targets if breaks(a, b)}
    assert found == set(), "imports across the layers"


def cycles() -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_module_reaches_itself_through_its_imports():
    assert cycles() == []


def test_the_rules_catch_what_they_forbid():
    assert breaks("zarrfs.fuse.session", "zarrfs.fs.tree")
    assert not breaks("zarrfs.fuse.session", "zarrfs.fs.api")
    assert breaks("zarrfs.format.hooks", "zarrfs.backends.base")
    assert breaks("zarrfs.backends.lmdb.driver", "zarrfs.fs.api")
    assert breaks("zarrfs.tools.copy", "zarrfs.daemon")
    assert breaks("zarrfs.tools.copy", "zarrfs.backends.lmdb.driver")
    assert not breaks("zarrfs.tools.copy", "zarrfs.backends.base")
    assert not breaks("zarrfs.backends.redis_cluster.driver", "zarrfs.backends.redis.link")
    assert breaks("zarrfs.daemon.main", "zarrfs.cli.oneline")
    assert not breaks("zarrfs.cli.mount_command", "zarrfs.daemon.main")
    assert breaks("zarrfs.cli.stats", "zarrfs.daemon.main")
    assert not breaks("zarrfs.cli.stats", "zarrfs.daemon.control")
    assert breaks("zarrfs.cli.stats", "zarrfs.fs.api")
    assert breaks("zarrfs.options", "zarrfs.daemon.logs")
    assert breaks("zarrfs.spin", "zarrfs.backends.base")
    assert breaks("zarrfs.urlfs.filesystem", "zarrfs.daemon.control")


# The names of fs.sidedata that say a node's side record: its prefixes and key builders.
SIDE_RECORD_NAMES = frozenset(
    {"ATTR", "ENTRY", "XATTR", "POINTER", "GROUP", "EPOCH", "NAMED"}
    | {"attr_key", "entry_key", "xattr_key", "pointer_key", "group_key", "moved_key"}
)
SIDE_RECORD_PREFIXES = ("a:", "e:", "x:", "h:", "g:")
# Where side records may be written: the one module that owns their writes; the drivers (which
# store bytes, whatever they mean) and the conformance kits (which write raw records to set up
# what they test) know nothing of that layout's rules.
SIDE_WRITERS = ("zarrfs.fs.records", "zarrfs.backends", "zarrfs.testing")


def side_writes(source: str) -> list[int]:
    """The lines of ``source`` with a ``put`` or ``delete`` whose arguments name a side record
    (a name of :data:`SIDE_RECORD_NAMES`, or a string that starts with a record's prefix)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("put", "delete"):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for part in ast.walk(arg):
                named = getattr(part, "id", None) or getattr(part, "attr", "")
                text = part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else ""
                if named in SIDE_RECORD_NAMES or text.startswith(SIDE_RECORD_PREFIXES):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_side_records_are_written_by_records_alone():
    found = {
        f"{name}:{line}"
        for name, path in MODULES.items()
        if not any(under(name, w) for w in SIDE_WRITERS)
        for line in side_writes(path.read_text(encoding="utf-8"))
    }
    assert found == set(), "side records written outside zarrfs.fs.records"


def test_the_side_record_rule_catches_what_it_forbids():
    assert side_writes("t.put(attr_key(k), raw, SIDE)") == [1]
    assert side_writes("x = 1\nt.delete(sidedata.pointer_key(k), SIDE)") == [2]
    assert side_writes('t.delete("h:" + k, SIDE)') == [1]
    assert side_writes("driver.put(EPOCH, b'1', SIDE)") == [1]
    assert side_writes("t.put(k, value)\nt.get(attr_key(k), SIDE)\nrecords.put_attrs(t, [k], raw)") == []

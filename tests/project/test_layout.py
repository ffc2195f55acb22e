"""The layers of ``zarrfs`` and which may import which, read from the source: ``cli -> daemon ->
fuse -> fs -> format/backends``. ``fuse`` sees the filesystem only through ``fs.api``;
``format`` knows no database and no filesystem; the drivers (``backends``) know nothing above
them; ``tools``, ``store`` and ``urlfs`` (the fsspec filesystems, over ``store``) use the
public parts of ``fs`` and ``backends``, never the daemon or the command line. The modules
left at the package's root (what a URL names, the mount options, the usage error, a line's
escapes, the spin window) sit below the daemon: the tools and the fsspec filesystems use them
too. No module reaches itself through its imports, type-only ones included. A node's side records
(``fs.sidedata``'s layout) are written and deleted by ``fs.records`` alone."""

from __future__ import annotations

import ast
import re
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
    "lines": ("backends", "fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
    # The polling window the request loop and the Redis link share (neither may import the other).
    "spin": ("backends", "fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
    # Which modules run compiled: imported by the package itself, before any of them.
    "compiled": ("backends", "fs", "fuse", "format", "daemon", "cli", "tools", "store", "urlfs"),
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


# -- what a driver is, declared rather than probed ------------------------------------------------

# An object that is (or holds, or makes) a driver, a transaction or the tree's hooks, as the code
# names it: a probe of one of these asks for a feature the contract should declare.
_DRIVER_LIKE = re.compile(r"(^|[._])(driver|drivers|txn|hooks|inner)($|[._(])|driver_class\(")


def _declared_features() -> set[str]:
    """The members of the contracts: ``Driver`` and ``Txn`` (backends.base), ``Hooks`` (fs.hooks)."""
    from zarrfs.backends.base import Driver, Txn
    from zarrfs.fs.hooks import Hooks

    return {n for cls in (Driver, Txn, Hooks) for n in dir(cls) if not n.startswith("__")}


def feature_probes(source: str) -> list[str]:
    """The ``getattr``/``hasattr`` calls in ``source`` that probe a driver's, a transaction's or
    the hooks' feature by name: a member the contracts declare (read it directly), or any name
    asked of an object the code calls a driver, transaction or hooks."""
    declared = _declared_features()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("getattr", "hasattr") or len(node.args) < 2:
            continue
        name = node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue  # a proxy forwarding whatever it is asked (``__getattr__``)
        target = ast.unparse(node.args[0])
        if name.value in declared or _DRIVER_LIKE.search(target):
            found.append(f"{node.func.id}({target}, {name.value!r})")
    return found


def test_no_module_above_the_drivers_probes_a_driver_feature():
    """Every optional feature of a driver or of the hooks is declared in its contract (a class
    attribute or a method with a default in ``Driver``, ``Txn``, ``Hooks``), so callers read it
    directly; a probe by name would read a feature nothing declares."""
    found = {
        f"{name}: {probe}"
        for name, path in MODULES.items()
        if not under(name, "zarrfs.backends")
        for probe in feature_probes(path.read_text(encoding="utf-8"))
    }
    assert found == set()


def test_the_probe_rule_catches_what_it_forbids():
    assert feature_probes('getattr(driver, "max_key_size", None)')
    assert feature_probes('hasattr(driver_class(normalize_url(url)[0]), "reindex")')
    assert feature_probes('getattr(self.tree.hooks, "whole", lambda k: False)(key)')
    assert feature_probes('getattr(self.driver, "anything_new", None)')
    assert feature_probes('getattr(txn, "get_many", None)')
    assert not feature_probes('getattr(self._local, "req", None)')
    assert not feature_probes("getattr(lib, func)")
    assert not feature_probes("getattr(self._txn, name)")


# The modules that read the drivers' declarations for everyone: none names a driver.
DECLARATION_READERS = (
    "zarrfs.backends.registry",
    "zarrfs.backends.about",
    "zarrfs.backends.dbfiles",
    "zarrfs.backends.urls",
    "zarrfs.urls",
    "zarrfs.dbfiles",
    "zarrfs.store",
)
DRIVER_PACKAGES = ("lmdb", "sqlite", "redis", "redis_cluster", "postgres", "dbm", "memory", "zip", "icechunk")


def driver_names(source: str, schemes: set[str]) -> list[str]:
    """The string constants of ``source`` that name a driver: one of ``schemes``, or a module
    of a driver's package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            module = node.value.partition(":")[0].split(".")
            if node.value.lower() in schemes or (module[:2] == ["zarrfs", "backends"] and module[2:3] and
                                                 module[2] in DRIVER_PACKAGES):
                found.append(node.value)
    return found


def _transitive(name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for target in GRAPH[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_each_driver_package_declares_itself_and_nothing_else_names_one():
    """Each driver package has an ``about`` module declaring it, which imports no driver; the
    registry finds them (no table of schemes), and the modules reading the declarations name
    no scheme and no driver."""
    import importlib

    schemes: set[str] = set()
    for package in DRIVER_PACKAGES:
        about = f"zarrfs.backends.{package}.about"
        assert about in MODULES, f"{package} declares nothing"
        drivers = {t for t in _transitive(about) if t.endswith(".driver")}
        assert drivers == set(), f"{about} imports a driver"
        schemes.update(importlib.import_module(about).ABOUT.schemes)
    assert {"lmdb", "redis", "postgresql", "zip"} <= schemes
    found = {
        f"{name}: {text!r}"
        for name in DECLARATION_READERS
        for text in driver_names(MODULES[name].read_text(encoding="utf-8"), schemes)
    }
    assert found == set()
    assert driver_names('x = {"lmdb": "zarrfs.backends.lmdb.driver:LMDBDriver"}', schemes) == [
        "lmdb",
        "zarrfs.backends.lmdb.driver:LMDBDriver",
    ]


def test_reading_the_declarations_imports_no_client_library():
    """What the command line asks of every driver before it opens one (schemes, files,
    secrets) imports none of their client libraries: ``zarrfs --help`` and ``zarrfs status``
    stay fast, and a driver whose library is missing does not stop the others."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from zarrfs.backends import registry\n"
        "from zarrfs.backends.urls import shown_url\n"
        "registry.known_schemes(); registry.kind_at('/'); registry.password_env()\n"
        "shown_url('redis://:pw@host/0'); shown_url('postgresql://me:pw@host/db')\n"
        "print(sorted(m for m in ('lmdb', 'redis', 'psycopg', 'icechunk', 'zarr') if m in sys.modules))\n"
    )
    env = {"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


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

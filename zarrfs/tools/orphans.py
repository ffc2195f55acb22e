"""Parts no file references (``zarrfs check``, ``zarrfs check --repair``).

A file stored in parts (:mod:`zarrfs.fs.parts`) writes its parts before the commit that makes them
its content and deletes a replaced version's parts after the commit that replaced it; a crash or a
failed deletion in between leaves orphans, which hold space and are never read. They are found by
listing the manifests the attribute records name (only where the data key holds the same
manifest), the part keys those reference (a mapped version's map names, per part, the version
whose key holds it, so a part a later version took over counts for that one) and the part keys
stored; ``repair`` deletes the unreferenced ones, one per transaction. Missing parts of a
referenced version are reported too. A mount writing a large file meanwhile has parts nothing
references yet: repair when no mount writes (a commit whose parts were deleted under it fails
with EIO; nothing is stored wrong).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zarrfs.backends.base import KEYS, PARTS, SIDE, VALUES
from zarrfs.fs import parts
from zarrfs.fs.manifest import PART, Parted, id_of_part
from zarrfs.fs.sidedata import ATTR

BATCH = 1000


@dataclass
class Orphan:
    """The parts of one version id that no file references."""

    id: str
    keys: list[str]


@dataclass
class Found:
    """What a scan found: the orphans, the count of parts, and referenced versions with parts
    missing (``(key, id)``)."""

    orphans: list[Orphan] = field(default_factory=list)
    parts: int = 0
    missing: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0


def _side(driver: Any, prefix: str, fetch: str, space: Any = SIDE) -> Iterator[tuple[str, Any]]:
    stop = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    start = prefix
    while True:
        page = driver.scan(start, stop, space=space, fetch=fetch, limit=BATCH)
        yield from page
        if len(page) < BATCH:
            return
        start = page[-1][0] + "\0"


def referenced(driver: Any) -> dict[str, tuple[str, Parted]]:
    """Version id -> (a key, its manifest, with its map when it is there) of every file stored
    in parts."""
    found: dict[str, tuple[str, Parted]] = {}
    for side_key, raw in _side(driver, ATTR, VALUES):
        parted = parts.parted_of(raw)
        if parted is None:
            continue
        key = side_key[len(ATTR) :]
        if parted.id not in found and driver.get(key) == parted.manifest():
            if parted.mapped:
                raw_map = driver.get(parted.map_key, PARTS)
                if raw_map is not None and len(raw_map) == 16 * parted.count:
                    parted = parted.with_map(raw_map)
            found[parted.id] = (key, parted)
    return found


def _wanted(parted: Parted) -> list[str]:
    """The part keys (and map) a version references; only its map when the map is missing."""
    if parted.mapped and parted.entries is None:
        return [parted.map_key]
    return parted.keys() + ([parted.map_key] if parted.mapped else [])


def find_orphans(driver: Any, repair: bool = False) -> Found:
    """Scan for orphan parts (and missing ones); with ``repair``, delete the orphans."""
    used = referenced(driver)
    wanted: set[str] = set()
    for _, parted in used.values():
        wanted.update(_wanted(parted))
    stored: set[str] = set()
    loose: dict[str, list[str]] = {}
    found = Found()
    for side_key, _ in _side(driver, PART, KEYS, PARTS):
        ident = id_of_part(side_key)
        if ident is None:
            continue
        stored.add(side_key)
        found.parts += 1
        if side_key not in wanted:
            loose.setdefault(ident, []).append(side_key)
    for ident, keys in sorted(loose.items()):
        found.orphans.append(Orphan(ident, keys))
    for ident, (key, parted) in sorted(used.items()):
        if any(k not in stored for k in _wanted(parted)):
            found.missing.append((key, ident))
    if repair:
        for orphan in found.orphans:
            for side_key in orphan.keys:
                driver.transact(lambda t, k=side_key: t.delete(k, PARTS))
                found.removed += 1
    return found


def report(driver: Any, repair: bool) -> Iterator[tuple[str, str, str]]:
    """``(severity, key, text)`` lines for ``zarrfs check``: orphans are errors until
    repaired, then notes; missing parts are errors."""
    found = find_orphans(driver, repair)
    for orphan in found.orphans:
        what = f"{len(orphan.keys)} part(s) no file references (an unfinished write)"
        if repair:
            yield "repaired", PART + orphan.id, what + ": deleted"
        else:
            yield "error", PART + orphan.id, what + "; zarrfs check --repair deletes them"
    for key, ident in found.missing:
        yield "error", key, f"parts of its content ({ident}) are missing"

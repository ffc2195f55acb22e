"""Key names: which keys are metadata, which are temporary files, which names are legal.

Keys are ``/``-separated paths relative to the store root, as zarr's stores hold them
(``"foo/bar/.zarray"``, ``"foo/bar/0.0"``, ``"zarr.json"``).
"""

from __future__ import annotations

import re

from .errors import Problem, error

ZARRAY = ".zarray"
ZGROUP = ".zgroup"
ZATTRS = ".zattrs"
ZMETADATA = ".zmetadata"
ZARR_JSON = "zarr.json"
V1_META = "meta"
V1_ATTRS = "attrs"

V2_METADATA_NAMES = frozenset({ZARRAY, ZGROUP, ZATTRS, ZMETADATA})
METADATA_NAMES = V2_METADATA_NAMES | {ZARR_JSON}
V1_METADATA_KEYS = frozenset({V1_META, V1_ATTRS})


def split_key(key: str) -> tuple[str, str]:
    """Split ``"a/b/.zarray"`` into ``("a/b", ".zarray")``; the root prefix is ``""``."""
    prefix, _, name = key.rpartition("/")
    return prefix, name


def join_key(prefix: str, name: str) -> str:
    """Join a folder prefix (``""`` for the root) and a relative key."""
    return f"{prefix}/{name}" if prefix else name


def ancestors(prefix: str) -> list[str]:
    """Return ``prefix`` and every folder above it, innermost first, ending with ``""``."""
    out = []
    while prefix:
        out.append(prefix)
        prefix = prefix.rpartition("/")[0]
    out.append("")
    return out


def relative_to(key: str, prefix: str) -> str | None:
    """Return ``key`` relative to folder ``prefix``, or ``None`` when it lies outside."""
    if not prefix:
        return key
    if key.startswith(prefix + "/"):
        return key[len(prefix) + 1 :]
    return None


def is_metadata_key(key: str) -> bool:
    """True for keys holding Zarr metadata rather than chunk data.

    v2: ``.zarray``, ``.zgroup``, ``.zattrs``, ``.zmetadata``; v3: ``zarr.json``, at any depth.
    v1 (``meta`` and ``attrs``) only at the store root: a v1 store held exactly one array and
    had no hierarchy, so a ``meta`` deeper down is just a file (or, inside an array, a bad
    chunk key) and must not be mistaken for array metadata.
    """
    prefix, name = split_key(key)
    if name in METADATA_NAMES:
        return True
    return not prefix and name in V1_METADATA_KEYS


# Python's tempfile.mkstemp(dir=...) ("tmp" + 8 of [a-z0-9_]) and GNU sed -i ("sed" + 6).
_TOOL_TEMPS = re.compile(r"^(tmp[a-z0-9_]{8}|sed[A-Za-z0-9]{6})$")


def is_temporary(key: str) -> bool:
    """True for names that writers use for files about to be renamed, never chunk keys.

    * ``*.partial``: zarr-python 2 ``DirectoryStore`` writes ``<name>.<32 hex>.partial`` and
      zarr-python 3 ``LocalStore`` writes ``<stem>.<32 hex>.partial`` (``0.0`` becomes
      ``0.<hex>.partial``, ``zarr.json`` becomes ``zarr.<hex>.partial``) before renaming.
    * ``*.__lock``: tensorstore's file kvstore writes ``<key>.__lock`` and renames it onto
      ``<key>``.
    * dot-files other than the v2 metadata names: rsync's ``.<name>.XXXXXX``, editors' swap
      files, ``.DS_Store``, NFS and FUSE ``.nfs*`` / ``.fuse_hidden*`` placeholders.
    * ``*~`` and ``#*#`` editor backups, ``*.tmp``, Python ``tempfile`` names in the target
      folder (``tmpab_12cde``) and ``sed -i``'s ``sedXXXXXX``.
    """
    name = key.rpartition("/")[2]
    if name.endswith((".partial", ".__lock", ".tmp", "~")):
        return True
    if name.startswith(".") and name not in V2_METADATA_NAMES:
        return True
    if len(name) > 1 and name.startswith("#") and name.endswith("#"):
        return True
    return _TOOL_TEMPS.fullmatch(name) is not None


_PARTIAL = re.compile(r"^(?P<stem>.*)\.[0-9a-f]{32}\.partial$")


def becomes_metadata(key: str) -> bool:
    """True for a temporary file that a Zarr client renames or links onto a metadata key:
    ``.zgroup.<hex>.partial`` (zarr-python 2, and 3 for v2 documents), ``zarr.<hex>.partial``
    (zarr-python 3's ``zarr.json``), ``zarr.json.__lock`` (tensorstore). Such a file is read
    whole, as the document it becomes."""
    prefix, _, name = key.rpartition("/")
    if name.endswith(".__lock"):
        name = name[: -len(".__lock")]
    else:
        m = _PARTIAL.fullmatch(name)
        if m is None:
            return False
        name = "zarr.json" if m["stem"] == "zarr" else m["stem"]
    return is_metadata_key(f"{prefix}/{name}" if prefix else name)


def validate_name(key: str) -> list[Problem]:
    """Check a key (a file or folder path) against the specs' path rules.

    Errors: empty keys or empty segments (leading, trailing or doubled ``/``), ``.`` or ``..``
    segments (v2: "an error MUST be raised"; v3 forbids names made only of periods), a
    backslash (v2 normalises ``\\`` to ``/``, so such a key can never be addressed by a client),
    NUL characters, and text that has no UTF-8 form (lone surrogates from undecodable bytes).
    """
    if not key:
        return [error(key, "name.empty", "empty key")]
    problems = []
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        problems.append(error(key, "name.not-utf8", "name is not valid UTF-8"))
    if "\\" in key:
        problems.append(
            error(
                key,
                "name.backslash",
                "backslash in a key: Zarr normalises it to '/', so no client can reach it",
            )
        )
    if "\x00" in key:
        problems.append(error(key, "name.nul", "NUL character in a key"))
    segments = key.split("/")  # membership tests run in C: every create's key comes here twice
    if "" in segments:
        problems.append(
            error(key, "name.empty-segment", "empty path segment (leading, trailing or double '/')")
        )
    if "." in segments or ".." in segments:
        problems.append(error(key, "name.dot-segment", "path segment '.' or '..'"))
    return problems

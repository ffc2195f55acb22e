"""Versions named in a repository's path as ZEP 8's URL draft names them: ``repo@branch.NAME``,
``repo@tag.NAME`` or ``repo@SNAPSHOT_ID`` (Icechunk's 20 characters of Crockford base32), the
same versions as the query forms ``?branch=``, ``?tag=``, ``?snapshot=``."""

from __future__ import annotations

import re

_SNAPSHOT_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{20}")


def split_version(path: str) -> tuple[str, str | None, str | None]:
    """``(repository path, kind, name)`` of a path whose last part may end in ``@VERSION``;
    kind is ``"branch"``, ``"tag"`` or ``"snapshot"``, or None (and the path as it is) when it
    names no version."""
    head, at, tail = path.rpartition("@")
    if not at or "/" in tail or not head or head.endswith("/"):
        return path, None, None
    for kind in ("branch", "tag"):
        if tail.startswith(kind + ".") and len(tail) > len(kind) + 1:
            return head, kind, tail[len(kind) + 1 :]
    if _SNAPSHOT_ID.fullmatch(tail):
        return head, "snapshot", tail
    return path, None, None

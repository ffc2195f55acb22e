"""``zarrfs consolidate URL|FOLDER``: rebuild every stale consolidated document.

Every ``.zmetadata`` and every ``zarr.json`` that holds a ``consolidated_metadata`` map is
compared with the metadata stored below its folder (the rules of ``zarrfs check``) and, when it
differs, rewritten as the hierarchy says it should be (:mod:`zarrfs.format.reconsolidate`). In
a database each document is checked and rewritten in one transaction; in a folder (a plain one,
or a mount) a rewritten document replaces the old one by rename.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

from zarrfs.backends.base import Driver, Txn
from zarrfs.format.keys import split_key
from zarrfs.format.reconsolidate import is_document_key, is_stale, rebuilt
from zarrfs.fs import records
from zarrfs.tools.copy import database_items, folder_files, is_url

__all__ = ["consolidate"]


def consolidate(location: str) -> tuple[int, int]:
    """Rebuild the stale consolidated documents of a database URL or a folder; return how many
    documents were found and how many were rebuilt."""
    if is_url(location):
        from zarrfs.dbfiles import open_database
        from zarrfs.options import parse_options

        with open_database(location, parse_options([]), hint=False) as driver:
            return _in_database(driver)
    return _in_folder(location)


def _in_database(driver: Driver) -> tuple[int, int]:
    documents = [k for k, _ in database_items(driver, "keys") if is_document_key(k)]
    changed = 0
    for doc_key in documents:
        changed += driver.transact(lambda t, k=doc_key: _rebuild_in(t, k))
    return len(documents), changed


def _rebuild_in(t: Txn, doc_key: str) -> bool:
    raw = t.get(doc_key)
    folder = split_key(doc_key)[0]
    keys = [k for k, _ in t.scan_prefix(folder + "/" if folder else "")]
    if raw is None or not is_stale(doc_key, raw, keys, t.get):
        return False
    new = rebuilt(doc_key, raw, keys, t.get)
    if new is None:
        return False
    t.put(doc_key, new)
    records.restamp(t, doc_key)  # a rewritten file: its mtime moves (tools that sync by mtime)
    return True


def _in_folder(root: str) -> tuple[int, int]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} is neither a folder nor a database URL")
    keys = [k for k, _ in folder_files(root)]
    documents = [k for k in keys if is_document_key(k)]

    def get(key: str) -> bytes | None:
        try:
            with open(os.path.join(root, *key.split("/")), "rb") as fh:
                return fh.read()
        except OSError:
            return None

    changed = 0
    for doc_key in documents:
        raw = get(doc_key)
        if raw is None or not is_stale(doc_key, raw, _below(keys, doc_key), get):
            continue
        new = rebuilt(doc_key, raw, _below(keys, doc_key), get)
        if new is not None:
            _replace(os.path.join(root, *doc_key.split("/")), new)
            changed += 1
    return len(documents), changed


def _below(keys: list[str], doc_key: str) -> Iterator[str]:
    folder = split_key(doc_key)[0]
    under = folder + "/" if folder else ""
    return (k for k in keys if k.startswith(under))


def _replace(path: str, data: bytes) -> None:
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=name + ".", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

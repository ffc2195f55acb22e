"""Shared helpers for the zarrfs.format tests: an in-memory store and rule lookups."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from zarrfs.format import Problem

DROP = object()  # marks a member to delete in with_()


class Store(dict):
    """A dict of key -> bytes whose ``get`` is the callable the format layer wants."""

    def put_json(self, key: str, doc: Any) -> Store:
        self[key] = json.dumps(doc).encode()
        return self


def with_(doc: dict, **changes: Any) -> dict:
    """A deep copy of ``doc`` with members replaced (or deleted when given ``DROP``)."""
    out = copy.deepcopy(doc)
    for k, v in changes.items():
        if v is DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def rules(problems: list[Problem], severity: str = "error") -> set[str]:
    """The rule ids of the problems of one severity."""
    return {p.rule for p in problems if p.severity == severity}


def errors(problems: list[Problem]) -> list[Problem]:
    """The problems of severity error."""
    return [p for p in problems if p.severity == "error"]


def dir_getter(root: str):
    """A ``get`` reading keys from a directory tree (the layout DirectoryStore uses)."""

    def get(key: str) -> bytes | None:
        path = os.path.join(root, *key.split("/"))
        if os.path.isfile(path):
            with open(path, "rb") as f:
                return f.read()
        return None

    return get


def dir_keys(root: str) -> list[str]:
    """Every file under ``root`` as a store key, sorted."""
    keys = []
    for d, _, files in os.walk(root):
        for f in files:
            keys.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return sorted(keys)


V2_ARRAY = {
    "zarr_format": 2,
    "shape": [10, 20],
    "chunks": [4, 8],
    "dtype": "<f8",
    "compressor": {"id": "zlib", "level": 1},
    "fill_value": "NaN",
    "order": "C",
    "filters": None,
}

V3_ARRAY = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [10, 20],
    "data_type": "float64",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 8]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": "NaN",
    "codecs": [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "gzip", "configuration": {"level": 1}},
    ],
    "attributes": {},
}

V1_META = {
    "zarr_format": 1,
    "shape": [10, 20],
    "chunks": [4, 8],
    "dtype": "<i4",
    "compression": "zlib",
    "compression_opts": 1,
    "fill_value": 42,
    "order": "C",
}

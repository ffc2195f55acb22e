"""Key classification and name rules (zarrfs.format.keys)."""

from __future__ import annotations

import pytest
from format_cases import rules

from zarrfs.format import is_metadata_key, is_temporary, validate_name
from zarrfs.format.keys import becomes_metadata


@pytest.mark.parametrize(
    "key",
    [".zarray", "a/.zgroup", "a/b/.zattrs", ".zmetadata", "zarr.json", "a/b/zarr.json", "meta", "attrs"],
)
def test_metadata_keys(key):
    assert is_metadata_key(key)


@pytest.mark.parametrize(
    "key",
    ["0.0", "a/0", "a/c/0/0", "a/meta", "a/attrs", "zarr.jsonx", "a/.zarray.partial", ".zarrayx", "c"],
)
def test_not_metadata_keys(key):
    # v1 "meta"/"attrs" only count at the root: v1 stores had no hierarchy.
    assert not is_metadata_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "a/0.0.0123456789abcdef0123456789abcdef.partial",  # zarr-python 2 DirectoryStore
        "a/0.0123456789abcdef0123456789abcdef.partial",  # zarr-python 3 LocalStore, key "0.0"
        "a/zarr.0123456789abcdef0123456789abcdef.partial",  # LocalStore, zarr.json
        "a/.zarray.0123456789abcdef0123456789abcdef.partial",
        "a/.0.0.Xy12Ab",  # rsync
        "a/.zattrs.AbC123",
        ".DS_Store",
        "a/.nfs000000001",
        "a/0.0~",
        "a/#0.0#",
        "a/0.0.tmp",
        "a/0.1.__lock",  # tensorstore
        "a/c/0/0.__lock",
        "a/zarr.json.__lock",
        "a/.zarray.__lock",
        "a/tmpk2j_9x0a",  # tempfile.mkstemp(dir=...)
        "a/sedQx81Zb",  # sed -i
    ],
)
def test_temporary(key):
    assert is_temporary(key)


@pytest.mark.parametrize(
    "key",
    [
        "a/0.0", "a/.zarray", ".zgroup", "a/c/0", "zarr.json", "#", "a/b", "a/tmp", "a/temperature", "a/sed",
        "a/tmpk2j_9x0a\n",  # a pattern's "$" takes a name with a newline last, fullmatch not
        "a/sedQx81Zb\n",
    ],
)
def test_not_temporary(key):
    assert not is_temporary(key)


def test_a_temporary_becomes_metadata_only_by_its_whole_name():
    partial = "a/.zgroup.0123456789abcdef0123456789abcdef.partial"
    assert becomes_metadata(partial)
    assert not becomes_metadata(partial + "\n")


@pytest.mark.parametrize(
    "key,rule",
    [
        ("", "name.empty"),
        ("a\\b", "name.backslash"),
        ("a/\x00", "name.nul"),
        ("/a", "name.empty-segment"),
        ("a/", "name.empty-segment"),
        ("a//b", "name.empty-segment"),
        ("a/./b", "name.dot-segment"),
        ("../a", "name.dot-segment"),
        ("a/\udcff", "name.not-utf8"),
    ],
)
def test_bad_names(key, rule):
    assert rule in rules(validate_name(key))


@pytest.mark.parametrize("key", ["a/b", "a.b/c", "...", "a/.zarray", "é/ü", "a b/c-d_e", "a/..b"])
def test_good_names(key):
    assert validate_name(key) == []

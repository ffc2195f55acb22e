"""The Zarr format layer: pure functions over keys and bytes, no FUSE, no database.

Other keys are read only through a ``get(key) -> bytes | None`` callable the caller supplies.

* validation when a key is committed: :func:`validate_metadata`, :func:`validate_data_key`,
  :func:`validate_name`, with :func:`is_metadata_key` and :func:`is_temporary` to sort keys;
* arrays for a decoded view: :func:`array_info`, :func:`find_array`, :class:`ArrayInfo`;
* live consolidated metadata: :func:`consolidated_update`, :func:`build_consolidated`,
  :func:`dumps_consolidated` (v2) and :func:`consolidated_update_v3`, :func:`dumps_zarr_json`;
* the whole-store checker :func:`check_items` (:func:`check_database` over a driver);
* :class:`zarrfs.format.hooks.FormatHooks`, the layer plugged into the filesystem tree;
* :class:`Problem` and :class:`FormatError` (mapped to ``EINVAL`` by the filesystem).
"""

import importlib
from typing import Any

# Name -> the module defining it, imported on first use (PEP 562): the array and codec modules
# bring numpy and numcodecs, which a mount storing plain files never needs.
_WHERE = {
    **dict.fromkeys(["ArrayInfo", "array_info", "find_array"], "arrays"),
    **dict.fromkeys(["check_database", "check_items"], "check"),
    **dict.fromkeys(
        [
            "CachedDoc",
            "build_consolidated",
            "build_consolidated_v3",
            "consolidated_update",
            "consolidated_update_v3",
            "dumps_consolidated",
            "dumps_zarr_json",
            "is_consolidated_key",
            "load_consolidated",
        ],
        "consolidated",
    ),
    **dict.fromkeys(
        ["ERROR", "WARNING", "ChunkSizeError", "FormatError", "Problem", "UnsupportedArray", "errors_only",
         "raise_on_error"],
        "errors",
    ),
    **dict.fromkeys(["is_metadata_key", "is_temporary", "validate_name"], "keys"),
    **dict.fromkeys(["validate_data_key", "validate_metadata"], "validate"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = sorted(_WHERE)  # every public name, defined in the module _WHERE names

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

from .arrays import ArrayInfo, array_info, find_array
from .check import check_database, check_items
from .consolidated import (
    CachedDoc,
    build_consolidated,
    build_consolidated_v3,
    consolidated_update,
    consolidated_update_v3,
    dumps_consolidated,
    dumps_zarr_json,
    is_consolidated_key,
    load_consolidated,
)
from .errors import (
    ERROR,
    WARNING,
    ChunkSizeError,
    FormatError,
    Problem,
    UnsupportedArray,
    errors_only,
    raise_on_error,
)
from .keys import is_metadata_key, is_temporary, validate_name
from .validate import validate_data_key, validate_metadata

__all__ = [
    "ERROR",
    "WARNING",
    "ArrayInfo",
    "CachedDoc",
    "ChunkSizeError",
    "FormatError",
    "Problem",
    "UnsupportedArray",
    "array_info",
    "build_consolidated",
    "build_consolidated_v3",
    "check_database",
    "check_items",
    "consolidated_update",
    "consolidated_update_v3",
    "dumps_consolidated",
    "dumps_zarr_json",
    "errors_only",
    "find_array",
    "is_consolidated_key",
    "is_metadata_key",
    "is_temporary",
    "load_consolidated",
    "raise_on_error",
    "validate_data_key",
    "validate_metadata",
    "validate_name",
]

#!/usr/bin/env python3
"""Write a small sample Zarr hierarchy (zarr-python 3, Zarr format 2) into a folder."""

from __future__ import annotations

import sys

import numpy as np
import zarr


def main(path: str) -> None:
    """Create groups, arrays (flat and nested chunk keys) and attributes at ``path``."""
    root = zarr.open_group(path, mode="w", zarr_format=2)
    root.attrs["title"] = "zarrfs sample"
    weather = root.create_group("weather")
    temp = weather.create_array("temperature", shape=(365, 64, 64), chunks=(30, 32, 32), dtype="f4")
    rng = np.random.default_rng(42)
    temp[:] = 15 + 10 * np.sin(np.arange(365) / 58.0)[:, None, None] + rng.normal(0, 1, (365, 64, 64))
    temp.attrs["units"] = "degC"
    wind = weather.create_array(
        "wind",
        shape=(365, 64),
        chunks=(100, 64),
        dtype="i2",
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    wind[:] = rng.integers(0, 40, (365, 64))
    root.create_group("empty")


if __name__ == "__main__":
    main(sys.argv[1])

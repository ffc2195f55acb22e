"""GDAL and netCDF-C read versions through real mounts: a ``-o snapshot`` mount of LMDB and
SQLite while a writer appends through another mount, a zip archive, and an Icechunk tag.

GDAL is Debian's ``gdal-bin`` command line (``gdal_translate``, ``gdalinfo``,
``gdalmdiminfo``); netCDF-C is the ``netCDF4`` wheel (its bundled netCDF-C, with the Blosc and
Zstd filters) and Debian's ``ncdump`` (``netcdf-bin``, no filter plugins: it reads uncompressed
arrays only, and gives a compressed chunk's bytes as numbers without an error, so it is given an
uncompressed array). Values are compared exactly with what zarr-python reads.

What these versions cannot read, pinned here so that the README stays true: GDAL 3.6 knows only
the 2021 draft of Zarr v3 (``meta/root.array.json``), netCDF-C 4.9 and 4.10 no Zarr v3 at all,
and Icechunk holds nothing but Zarr v3. Through a tag mount they answer exactly as for a copy
of the tag in a plain folder; a GDAL that reads the copy must read the tag's values.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr
from mounting import make_url, needs_fuse, unavailable, zarrfs

pytestmark = needs_fuse

GDAL_ENV = {**os.environ, "GDAL_PAM_ENABLED": "NO"}  # no .aux.xml written next to what it reads
FILL = -9999  # no value the tests write: ncdump prints a fill value as "_"


def _tool(name: str, package: str) -> str:
    """The path of a command-line client; skipped where it is missing, failed in CI."""
    found = shutil.which(name)
    if found is None:
        unavailable(f"{name} is not installed (apt-get install {package})")
    return found


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, env=GDAL_ENV, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def gdal_read(array: Path | str, dtype: str, scratch: Path) -> np.ndarray:
    """The 2-D array at ``array`` as GDAL reads it: ``gdal_translate`` to a raw ENVI file, its
    header's lines and samples the shape."""
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / "gdal.bin"
    _run(_tool("gdal_translate", "gdal-bin"), "-q", "-of", "ENVI", str(array), str(out))
    header = (scratch / "gdal.hdr").read_text()
    lines = int(re.search(r"^lines\s*=\s*(\d+)", header, re.M).group(1))
    samples = int(re.search(r"^samples\s*=\s*(\d+)", header, re.M).group(1))
    assert re.search(r"^byte order\s*=\s*0", header, re.M), header  # little-endian
    return np.fromfile(out, dtype=dtype).reshape(lines, samples)


def gdal_shapes(group: Path) -> dict[str, list[int]]:
    """Each array's shape as ``gdalmdiminfo`` lists the group (from ``.zmetadata`` when there
    is one)."""
    info = json.loads(_run(_tool("gdalmdiminfo", "gdal-bin"), str(group)).stdout)
    return {name: arr["dimension_size"] for name, arr in info.get("arrays", {}).items()}


def netcdf_read(group: Path, name: str) -> np.ndarray:
    """Array ``name`` as netCDF-C (the ``netCDF4`` wheel) reads the group, unmasked."""
    import netCDF4

    with netCDF4.Dataset(f"file://{group}#mode=zarr,file") as ds:
        ds.set_auto_mask(False)
        return np.asarray(ds[name][:])


def ncdump_read(group: Path, name: str) -> np.ndarray:
    """Array ``name`` as Debian's ``ncdump`` prints it: its dimensions from the header, its
    values from the data section."""
    out = _run(_tool("ncdump", "netcdf-bin"), "-v", name, f"file://{group}#mode=zarr,file").stdout
    dims = dict(re.findall(r"^\s+(\w+) = (\d+) ;", out.split("variables:")[0], re.M))
    shape = re.search(rf"^\s+\w+ {name}\(([\w, ]+)\) ;", out, re.M).group(1).split(", ")
    values = re.search(rf"^ {name} =\s*(.*?);", out.split("data:")[1], re.M | re.S).group(1)
    return np.array([int(v) for v in values.replace("\n", " ").split(",")]).reshape(
        [int(dims[d]) for d in shape]
    )


def _v2_arrays(group, data: np.ndarray) -> None:
    """``x`` with zarr's default compressor (Blosc) and ``plain`` uncompressed, both ``data``,
    named dimensions (``_ARRAY_DIMENSIONS``, which netCDF-C and GDAL read as dimension names)."""
    for name, compressors in (("x", "auto"), ("plain", None)):
        arr = group.create_array(
            name,
            shape=data.shape,
            chunks=(2, 5),
            dtype=data.dtype,
            fill_value=FILL,
            compressors=compressors,
            attributes={"_ARRAY_DIMENSIONS": ["row", "col"]},
        )
        arr[:] = data


def _append(folder: Path, rows: np.ndarray) -> None:
    for name in ("x", "plain"):
        arr = zarr.open_array(str(folder / name), mode="r+")
        start = arr.shape[0]
        arr.resize((start + rows.shape[0], arr.shape[1]))
        arr[start:] = rows
    zarr.consolidate_metadata(str(folder))


def _clients(group: Path, scratch: Path) -> dict[str, object]:
    """What each client reads of the group: shapes and values as lists, or the first line of
    its error (one comparison shows every client that differs)."""

    def attempt(read):
        try:
            return read()
        except (AssertionError, OSError, ValueError, RuntimeError) as exc:
            return f"failed: {str(exc).splitlines()[0][:300]}"

    return {
        "gdalmdiminfo shapes": attempt(lambda: gdal_shapes(group)),
        **{
            f"gdal_translate {n}": attempt(lambda n=n: gdal_read(group / n, "<i4", scratch / n).tolist())
            for n in ("x", "plain")
        },
        "netCDF4 x": attempt(lambda: netcdf_read(group, "x").tolist()),
        "ncdump plain": attempt(lambda: ncdump_read(group, "plain").tolist()),
    }


def _check(got: dict[str, object], data: np.ndarray, what: str) -> None:
    """Every client read ``data``; else fail naming those that did not."""
    want = _expected(data)
    wrong = {k: got[k] for k in want if got[k] != want[k]}
    assert not wrong, f"{what}: {sorted(wrong)} read otherwise than {data.shape}: {wrong}"


def _expected(data: np.ndarray) -> dict[str, object]:
    shape = list(data.shape)
    values = data.tolist()
    return {
        "gdalmdiminfo shapes": {"x": shape, "plain": shape},
        "gdal_translate x": values,
        "gdal_translate plain": values,
        "netCDF4 x": values,
        "ncdump plain": values,
    }


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_gdal_and_netcdf_read_a_snapshot_as_it_was_at_mount_time(kind, tmp_path, request, mount_factory):
    url = make_url(kind, tmp_path, request)
    writer = mount_factory(url, ["create"])
    first = np.arange(40, dtype="i4").reshape(4, 10) * 3 - 50
    _v2_arrays(zarr.open_group(str(writer.path), mode="a", zarr_format=2), first)
    zarr.consolidate_metadata(str(writer.path))

    snap = mount_factory(url, ["snapshot"])
    live = mount_factory(url)
    at_mount = zarr.open_consolidated(str(snap.path), mode="r")
    seen = {name: at_mount[name][:] for name in ("x", "plain")}
    np.testing.assert_array_equal(seen["x"], first)
    np.testing.assert_array_equal(seen["plain"], first)
    _check(_clients(snap.path, tmp_path / "before"), first, "the snapshot at mount time")

    grown = first
    for step in range(2):
        rows = np.full((3, 10), 100 + step, dtype="i4")
        _append(writer.path, rows)
        grown = np.concatenate([grown, rows])
        # The clients read the append through a mount that is no snapshot...
        _check(_clients(live.path, tmp_path / f"live{step}"), grown, "the mount that is no snapshot")
        # ... and the snapshot as it was when it was mounted.
        _check(_clients(snap.path, tmp_path / f"snap{step}"), first, f"the snapshot after append {step + 1}")
    assert zarrfs("status", str(snap.path)).returncode == 0


def _zip_v2(path: Path, data: np.ndarray) -> None:
    """A zarr-python 3 ``ZipStore`` archive holding a Zarr v2 group (consolidated)."""
    from zarr.storage import ZipStore

    store = ZipStore(path, mode="w")
    root = zarr.open_group(store, mode="w", zarr_format=2)
    _v2_arrays(root, data)
    zarr.consolidate_metadata(store)
    store.close()


@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")  # consolidating rewrites .zgroup
def test_gdal_and_netcdf_read_a_zip_archive_of_zarr_v2(tmp_path, mount_factory):
    data = (np.arange(60, dtype="i4").reshape(6, 10) - 30) * 7
    _zip_v2(tmp_path / "d.zip", data)
    m = mount_factory(f"zip://{tmp_path}/d.zip")
    _check(_clients(m.path, tmp_path / "read"), data, "the zip mount")
    assert zarr.open_consolidated(str(m.path), mode="r")["x"][:].tolist() == data.tolist()
    # GDAL reads the archive itself too (/vsizip/): the same values as through the mount.
    direct = gdal_read(f"/vsizip/{tmp_path}/d.zip/x", "<i4", tmp_path / "vsizip")
    assert direct.tolist() == data.tolist()


def _refusals(folder: Path) -> dict[str, str]:
    """What GDAL and netCDF-C answer for a Zarr v3 group holding array ``x``, reduced to what
    does not name the path."""
    import netCDF4

    info = _run(_tool("gdalinfo", "gdal-bin"), str(folder / "x"), check=False)
    mdim = _run(_tool("gdalmdiminfo", "gdal-bin"), str(folder), check=False)
    try:
        netCDF4.Dataset(f"file://{folder}#mode=zarr,file").close()
        netcdf = "opened"
    except OSError as exc:
        netcdf = exc.strerror or str(exc)
    ncdump = _run(_tool("ncdump", "netcdf-bin"), "-h", f"file://{folder}#mode=zarr,file", check=False)
    return {
        "gdalinfo": f"{info.returncode} {info.stderr.replace(str(folder), 'FOLDER')}".strip(),
        "gdalmdiminfo": f"{mdim.returncode} {mdim.stdout}".strip(),
        "netCDF4": netcdf,
        "ncdump": f"{ncdump.returncode} {ncdump.stdout.replace(folder.name, 'NAME')}".strip(),
    }


def test_an_icechunk_tag_reads_in_gdal_and_netcdf_as_a_plain_copy_of_it(tmp_path, mount_factory):
    import icechunk  # a test dependency (pyproject): missing is an error, not a skip

    repo_path = tmp_path / "repo"
    branch = mount_factory(f"icechunk://{repo_path}?branch=main", ["create"])
    data = np.arange(64, dtype="i4").reshape(8, 8) - 20
    root = zarr.open_group(str(branch.path), mode="a")
    # bytes and gzip: the codecs a GDAL that reads Zarr v3 is likeliest to have (not zstd).
    arr = root.create_array(
        "x", shape=data.shape, chunks=(4, 4), dtype="i4", compressors=zarr.codecs.GzipCodec(level=1)
    )
    arr[:] = data
    done = zarrfs("commit", str(branch.path), "-m", "v1")
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(repo_path)))
    repo.create_tag("v1", done.stdout.strip())
    zarr.open_array(str(branch.path / "x"), mode="r+")[:] = 7  # the branch moves on
    zarrfs("commit", str(branch.path), "-m", "v2")

    tag = mount_factory(f"icechunk://{repo_path}?tag=v1")
    np.testing.assert_array_equal(zarr.open_array(str(tag.path / "x"), mode="r")[:], data)
    # The same tag in a plain folder, copied by the driver (not through the mount).
    copy = tmp_path / "copy" / tag.path.name
    zarrfs("copy", f"icechunk://{repo_path}?tag=v1", str(copy))

    refused = _refusals(tag.path)
    assert refused == _refusals(copy)
    # netCDF-C reads no Zarr v3: the wheel's 4.10.1 says so, Debian's ncdump 4.9.0 prints an
    # empty file and exits 0. A netCDF-C that reads it fails here: say so in the README.
    assert refused["netCDF4"] == "NetCDF: Unknown file format", refused
    assert refused["ncdump"] == "0 netcdf NAME {\n}", refused
    if refused["gdalinfo"].split()[0] == "0":
        # A GDAL that reads this Zarr v3 from a folder reads the tag's values through the mount.
        assert gdal_read(tag.path / "x", "<i4", tmp_path / "gdal").tolist() == data.tolist()
    else:
        # GDAL 3.6 knows the draft layout only: the array is "not recognized", the group lists
        # no array. Another refusal fails here: say what it is in the README.
        assert refused["gdalinfo"].startswith("1 ERROR 4: `FOLDER/x' not recognized"), refused
        assert json.loads(refused["gdalmdiminfo"][2:]) == {"type": "group", "driver": "Zarr", "name": "/"}
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == sorted(
        p.relative_to(tag.path) for p in tag.path.rglob("*")
    )

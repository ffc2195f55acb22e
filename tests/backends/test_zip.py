"""Zip archives as folders: ``zip:///path/data.zip`` mounts the archive of zarr-python 2's or
3's ``ZipStore`` read-only, and ``zarrfs copy`` copies to and from one."""

from __future__ import annotations

import errno
import json
import os
import zipfile

import numpy as np
import pytest
import zarr2env
from mounting import zarrfs

from zarrfs.backends import open_driver
from zarrfs.backends.base import BackendError, ReadOnlyError
from zarrfs.testing import DriverConformance
from zarrfs.testing.filesystem import FilesystemConformance

ZARR2_WRITE = r"""
import sys, numpy as np, zarr
store = zarr.ZipStore(sys.argv[1], mode="w")
root = zarr.group(store=store)
a = root.create_dataset("x", shape=(12, 10), chunks=(5, 4), dtype="i4")
a[:] = np.arange(120, dtype="i4").reshape(12, 10)
a.attrs["_ARRAY_DIMENSIONS"] = ["row", "col"]
root.attrs["made_by"] = "zarr 2"
zarr.consolidate_metadata(store)
store.close()
"""

ZARR2_READ = r"""
import json, sys, zarr
root = zarr.open_consolidated(sys.argv[1], mode="r")
print(json.dumps({"x": root["x"][:].tolist(), "attrs": dict(root.attrs)}))
"""


def _zarr3_archive(path) -> np.ndarray:
    import zarr
    from zarr.storage import ZipStore

    data = np.arange(300, dtype="f8").reshape(15, 20)
    store = ZipStore(path, mode="w")
    root = zarr.open_group(store, mode="w")
    arr = root.create_array("x", shape=data.shape, chunks=(4, 8), dtype="f8")
    arr[:] = data
    root.attrs["made_by"] = "zarr 3"
    store.close()
    return data


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_zarr3_zipstore_read_through_the_mount(tmp_path, mount_factory):
    import zarr

    data = _zarr3_archive(tmp_path / "d.zip")
    m = mount_factory(f"zip://{tmp_path}/d.zip")
    root = zarr.open_group(str(m.path), mode="r")
    assert root.attrs["made_by"] == "zarr 3"
    np.testing.assert_array_equal(root["x"][:], data)
    with zipfile.ZipFile(tmp_path / "d.zip") as zf:
        names = {i.filename for i in zf.infolist()}
    listed = {
        os.path.relpath(os.path.join(d, f), m.path) for d, _, files in os.walk(m.path) for f in files
    }
    assert listed == names
    assert os.path.getsize(m.path / "x" / "c" / "0" / "0") == zipfile.ZipFile(tmp_path / "d.zip").getinfo(
        "x/c/0/0"
    ).file_size
    # Read-only: the mount says so, and writes fail with EROFS.
    assert os.statvfs(m.path).f_flag & os.ST_RDONLY
    for attempt in (
        lambda: (m.path / "new").write_bytes(b"x"),
        lambda: os.unlink(m.path / "zarr.json"),
        lambda: os.mkdir(m.path / "d"),
    ):
        with pytest.raises(OSError) as err:
            attempt()
        assert err.value.errno == errno.EROFS


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_zarr2_zipstore_read_through_the_mount_by_zarr2_and_zarr3(tmp_path, mount_factory, zarr2_python):
    import zarr

    zarr2env.run(zarr2_python, ZARR2_WRITE, str(tmp_path / "d.zip"))
    m = mount_factory(f"zip://{tmp_path}/d.zip")
    want = np.arange(120, dtype="i4").reshape(12, 10)
    got = json.loads(zarr2env.run(zarr2_python, ZARR2_READ, str(m.path)))
    assert got["attrs"] == {"made_by": "zarr 2"}
    np.testing.assert_array_equal(np.array(got["x"]), want)
    arr = zarr.open_array(str(m.path / "x"), mode="r", zarr_format=2)
    np.testing.assert_array_equal(arr[:], want)
    assert sorted(os.listdir(m.path)) == [".zattrs", ".zgroup", ".zmetadata", "x"]
    # netCDF-C reads the Zarr v2 archive through the mount too (it reads no Zarr v3).
    netcdf = pytest.importorskip("netCDF4")
    with netcdf.Dataset(f"file://{m.path}#mode=zarr,file") as ds:
        np.testing.assert_array_equal(ds["x"][:], want)


def test_the_last_of_two_members_of_one_name_wins(tmp_path):
    path = tmp_path / "d.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a/b", b"old")
        zf.writestr("a/", b"")  # a folder entry: no key
        with pytest.warns(UserWarning):
            zf.writestr("a/b", b"newer")
        zf.writestr("c", b"0123456789", compress_type=zipfile.ZIP_DEFLATED)
    with open_driver(f"zip://{path}") as d:
        assert d.readonly
        assert d.scan(fetch="sizes") == [("a/b", 5), ("c", 10)]
        assert d.get("a/b") == b"newer"
        assert d.read("c", 3, 4) == b"3456"
        with pytest.raises(ReadOnlyError):
            d.put("a/b", b"x")


def test_a_damaged_member_is_an_error_not_data(tmp_path):
    path = tmp_path / "d.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a", b"0123456789" * 10)
    raw = path.read_bytes()
    at = raw.index(b"0123456789")
    path.write_bytes(raw[:at] + b"X" + raw[at + 1 :])
    with open_driver(f"zip://{path}") as d:
        assert d.read("a", 20, 5) == b"01234"  # a range cannot be checked
        with pytest.raises(BackendError, match="does not match"):
            d.get("a")


def test_copy_to_a_zip_and_back(tmp_path, zarr2_python):
    folder = tmp_path / "src"
    import zarr

    root = zarr.open_group(str(folder), mode="w", zarr_format=2)
    arr = root.create_array("x", shape=(9, 9), chunks=(4, 4), dtype="u2")
    arr[:] = np.arange(81, dtype="u2").reshape(9, 9)
    zarrfs("copy", str(folder), f"zip://{tmp_path}/out.zip")
    # zarr-python 2 opens the archive the copy wrote as a ZipStore
    script = r"""
import sys, zarr
print(zarr.open_array(zarr.ZipStore(sys.argv[1], mode="r"), path="x", mode="r")[:].sum())
"""
    assert zarr2env.run(zarr2_python, script, str(tmp_path / "out.zip")).strip() == str(sum(range(81)))
    zarrfs("copy", f"zip://{tmp_path}/out.zip", f"lmdb://{tmp_path}/back.lmdb")
    with open_driver(f"lmdb://{tmp_path}/back.lmdb", readonly=True) as d:
        copied = dict(d.scan(fetch="values"))
    with zipfile.ZipFile(tmp_path / "out.zip") as zf:
        assert copied == {name: zf.read(name) for name in zf.namelist()}
    # An archive cannot lose a member: a copy that would replace one says so.
    result = zarrfs("copy", str(folder), f"zip://{tmp_path}/out.zip", check=False)
    assert result.returncode != 0 and "read-only" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


class TestZipConformance(DriverConformance):
    """The driver kit on a new archive (written as ``zarrfs copy`` writes one); what an
    archive cannot do is declared, with the reason."""

    removes = "an archive only grows: a key cannot be removed"
    cannot = {
        "test_get_put_delete": removes,
        "test_read_your_writes": removes,
        "test_write_while_scanning": removes,
        "test_side_data_is_separate": removes,
        "test_read_many": removes,
        "test_read_many_in_a_write_transaction": removes,
        "test_scan_ahead_sees_the_transactions_own_writes": removes,
        "test_a_scan_finds_a_moving_key_under_one_name": removes,
        "test_read_only": "an archive being written has no directory until it is closed",
        "test_reopen_keeps_data": "side data is kept in memory, not in the archive",
        "test_processes_increment_exactly": "an archive being written is one process's file",
        "test_killed_writer_leaves_a_consistent_database": "an archive being written is one process's file",
    }

    @pytest.fixture
    def url(self, tmp_path):
        return f"zip://{tmp_path}/new.zip"

    @pytest.fixture
    def driver(self, url):
        d = open_driver(url)
        yield d
        d.close()


class TestZipFilesystem(FilesystemConformance):
    """The filesystem kit over a new archive: what removes or replaces a name cannot be done."""

    removes = "an archive only grows: the test removes or replaces a name"
    cannot = {
        "test_two_names_open_at_once_share_one_file": removes,
        "test_unlink_leaves_the_other_names": removes,
        "test_rename_keeps_links": removes,
        "test_a_name_deleted_by_another_writer_is_no_name": removes,
        "test_a_new_file_at_a_name_deleted_behind_our_back_is_not_linked": removes,
        "test_links_change_folder_times_and_ctimes": removes,
        "test_mkdir_markers_and_parent_kept": removes,
        "test_rename_folder_moves_everything_atomically": removes,
        "test_decoded_view_encodes_a_temporary_file_renamed_onto_a_chunk": removes,
        "test_a_folder_named_as_a_prefix_of_its_siblings_is_listed_once": removes,
        "test_a_folder_holding_a_temporary_file_is_not_empty": removes,
        "test_an_unlinked_open_file_keeps_and_changes_its_attributes": removes,
        "test_an_open_file_replaced_by_a_rename_keeps_its_content": removes,
        "test_a_window_being_given_reads_again_the_names_this_mount_changed": removes,
        "test_a_folder_another_writer_removed_is_no_node_of_the_window_being_given": removes,
        "test_random_changes_beside_a_listing_never_give_an_old_node": removes,
    }

    @pytest.fixture
    def driver_url(self, tmp_path):
        return f"zip://{tmp_path}/new.zip"

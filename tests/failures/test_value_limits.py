"""Values larger than a database holds: EFBIG, checked before anything is sent, one log line
naming the key, the size and the limit; the connection and the mount go on."""

from __future__ import annotations

import errno
import os

import pytest
from conftest import start_redis, stop_redis
from mounting import Mount

from zarrfs.backends import open_driver
from zarrfs.backends.base import ValueTooLargeError
from zarrfs.backends.lmdb.driver import LMDBTxn
from zarrfs.fs.errors import to_errno


@pytest.mark.parametrize("kind", ["lmdb", "sqlite"])
def test_a_value_above_the_limit_is_refused_before_it_is_stored(kind, tmp_path, monkeypatch):
    url = {"lmdb": f"lmdb://{tmp_path}/db.lmdb", "sqlite": f"sqlite://{tmp_path}/db.sqlite"}[kind]
    driver = open_driver(url)
    try:
        if kind == "lmdb":
            page = os.sysconf("SC_PAGE_SIZE")  # a commit writes a value's pages in one write(2)
            assert LMDBTxn.max_value == 0x7FFFF000 // page * page - 16
            monkeypatch.setattr(LMDBTxn, "max_value", 1000)
        else:
            assert driver.max_value >= 10**9 - 4096
            driver.max_value = 1000
        driver.put("small", b"x" * 1000)
        with pytest.raises(ValueTooLargeError) as info:
            driver.put("a/big", b"x" * 1001)
        assert "a/big" in str(info.value) and "1001" in str(info.value) and "1000" in str(info.value)
        assert to_errno(info.value) == errno.EFBIG
        assert driver.get("a/big") is None and driver.get("small") == b"x" * 1000
    finally:
        driver.close()


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_redis_proto_max_bulk_len_is_efbig_through_a_mount(tmp_path):
    """A file above the limit is stored in parts (zarrfs.fs.parts); a metadata document, which
    the format layer reads whole, is EFBIG."""
    server = start_redis(str(tmp_path))
    try:
        server.client().config_set("proto-max-bulk-len", str(1 << 20))  # its smallest
        url = server.url(0, prefix="big")
        with Mount(url, tmp_path / "mnt", ["create", "validate=off"]) as m:
            data = os.urandom(2 << 20)
            (m.path / "chunk").write_bytes(data)
            assert (m.path / "chunk").read_bytes() == data
            with pytest.raises(OSError) as info:
                with open(m.path / ".zattrs", "wb") as fh:
                    fh.write(os.urandom(2 << 20))
            assert info.value.errno == errno.EFBIG
            assert not (m.path / ".zattrs").exists()
            (m.path / "after").write_bytes(b"ok")  # the link was not reset
            assert (m.path / "after").read_bytes() == b"ok"
            lines = [line for line in m.log_text().splitlines() if "EFBIG" in line]
            assert len(lines) == 1, lines
            assert ".zattrs" in lines[0] and str(2 << 20) in lines[0] and str(1 << 20) in lines[0], lines
    finally:
        stop_redis(server)

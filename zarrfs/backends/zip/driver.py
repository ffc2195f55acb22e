"""Zip archives: ``zip:///abs/path/data.zip``, the archive of zarr-python 2's or 3's
``ZipStore`` (a member's name is its Zarr key).

An archive that exists is read-only: a zip file cannot replace or remove a member in place. Its
central directory is read once, at open, into a sorted index (members read later by offset);
when a name occurs twice, the last member wins, as ``zipfile`` and zarr-python read it. A
stored (uncompressed) member, as ``ZipStore`` writes them, is read with one ``pread`` at its
data's offset (its local header read once), a whole one checked against its CRC; a compressed
one goes through ``zipfile``, inflated up to the range's end.

A missing archive opened writable (``zarrfs copy`` to a zip) is created and only grows: each
committed transaction appends its values as stored members, and removing a key fails with
:class:`ReadOnlyError`. Side data (mtimes, modes, empty folders) has no place in an archive
and is kept in memory, for the life of the driver.
"""

from __future__ import annotations

import os
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ..base import DATA, Driver, MissingDatabaseError, ReadOnlyError, Space, Txn
from ..buffered import DELETED
from ..errors import BackendError
from ..filelock import FileLock
from ..filespace import statvfs
from ..keyindex import KeyIndex
from ..overlay import OverlayTxn
from ..urloptions import check_options, parse_file_url
from .about import ABOUT

T = TypeVar("T")
#: A local file header: signature, version, flags, method, time, date, CRC, sizes, lengths of
#: the name and of the extra field.
LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


class ZipTxn(OverlayTxn):
    """An :class:`OverlayTxn` that reads a byte range of a member without reading it whole."""

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        if space is DATA and (space, raw) not in self.writes:
            return self._driver.read_range(raw, offset, length)
        return super()._read(raw, offset, length, space)


class ZipDriver(Driver):
    """Driver for ``zip://`` URLs; see the module docstring."""

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        path, options = parse_file_url(url)
        check_options(url, options, set(ABOUT.options))
        self.path = self.where = path
        self.lock = threading.RLock()
        self.data = KeyIndex()  # name (UTF-8) -> ZipInfo
        self.side = KeyIndex()  # side key -> value, in memory
        self.offsets: dict[int, int] = {}  # a member's header offset -> where its data starts
        self.fd: int | None = None  # the archive, for reads of stored members by offset
        self.held: FileLock | None = None
        if os.path.exists(path):
            self.readonly = True  # members cannot be replaced in place
            self.held = FileLock(path, False, "the zip archive")  # not one being written
            try:
                self.zip = zipfile.ZipFile(path, "r")
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except (OSError, zipfile.BadZipFile) as exc:
                self.held.release()
                raise BackendError(f"{path}: not a zip archive ({exc})") from None
            for info in self.zip.infolist():
                if not info.is_dir():
                    self.data.set(info.filename.encode("utf-8"), info)
        elif readonly:
            raise MissingDatabaseError(f"{path}: no such zip archive")
        else:
            try:  # made here, never truncated: another writer may have made it meanwhile
                out = open(path, "x+b")  # noqa: SIM115 - the archive owns it until close
            except FileExistsError:
                raise BackendError(f"the zip archive {path} was just made by another process") from None
            except OSError as exc:
                raise BackendError(f"cannot create the zip archive {path}: {exc.strerror}") from None
            self.held = FileLock(path, True, "the zip archive")
            self.zip = zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True)
            self._out = out

    def transact(self, fn: Callable[[Txn], T], write: bool = True) -> T:
        """:meth:`Driver.transact`, with what to do instead of writing to an archive."""
        if write and self.readonly:
            raise ReadOnlyError(f"{self.path}: a zip archive is read-only once written (write a new one)")
        return super().transact(fn, write)

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        with self.lock:
            with ZipTxn(self, write) as txn:
                yield txn

    # -- what OverlayTxn asks of its driver --------------------------------------------------------
    def index(self, space: Space) -> KeyIndex:
        """The index of ``space``."""
        return self.data if space is DATA else self.side

    def load(self, raw: bytes, space: Space) -> bytes | None:
        """The value of ``raw``, or None."""
        info = self.index(space).info.get(raw)
        if info is None or space is not DATA:
            return info
        return self._read_member(info, 0, info.file_size)

    def size_of(self, raw: bytes, space: Space) -> int | None:
        """The size of ``raw``'s value, or None (from the directory: nothing is read)."""
        info = self.index(space).info.get(raw)
        if info is None:
            return None
        return info.file_size if space is DATA else len(info)

    def read_range(self, raw: bytes, offset: int, length: int) -> bytes | None:
        """``length`` bytes of member ``raw`` from ``offset``, or None."""
        info = self.data.info.get(raw)
        if info is None:
            return None
        return self._read_member(info, offset, length)

    def _read_member(self, info: zipfile.ZipInfo, offset: int, length: int) -> bytes:
        length = max(0, min(length, info.file_size - offset))
        try:
            if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 1 and self.fd is not None:
                data = os.pread(self.fd, length, self._data_offset(info) + offset)
                if len(data) != length or (
                    offset == 0 and length == info.file_size and zlib.crc32(data) != info.CRC
                ):
                    raise zipfile.BadZipFile("member data does not match the directory")
                return data
            with self.zip.open(info) as member:
                if offset:
                    member.seek(offset)
                return member.read(length)
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise BackendError(f"{self.path}: {info.filename}: {exc}") from None

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        """Where a member's data starts: after its local header, whose name and extra field
        may differ in length from the directory's (read once, then kept)."""
        start = self.offsets.get(info.header_offset)
        if start is None:
            header = os.pread(self.fd, LOCAL_HEADER.size, info.header_offset)
            if len(header) != LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile("bad local header")
            name_length, extra_length = LOCAL_HEADER.unpack(header)[-2:]
            start = info.header_offset + LOCAL_HEADER.size + name_length + extra_length
            self.offsets[info.header_offset] = start
        return start

    def apply(self, writes: dict[tuple[Space, bytes], Any]) -> None:
        """Append a committed transaction's values to the archive (side data: in memory)."""
        for (space, raw), value in sorted(writes.items()):
            if space is not DATA:
                if value is DELETED:
                    self.side.remove(raw)
                else:
                    self.side.set(raw, value)
                continue
            if value is DELETED:
                if raw in self.data.info:
                    raise ReadOnlyError(f"{self.path}: a zip archive cannot remove {raw.decode()!r}")
                continue
            name = raw.decode("utf-8")
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            try:
                self.zip.writestr(info, value)
            except (OSError, ValueError) as exc:
                raise BackendError(f"{self.path}: {exc}") from None
            self.data.set(raw, info)

    def statfs(self) -> dict[str, int] | None:
        """The space of the filesystem holding the archive."""
        return statvfs(os.path.dirname(self.path))

    def close(self) -> None:
        """Close the archive (one being written gets its central directory now)."""
        with self.lock:
            self.zip.close()
            out = getattr(self, "_out", None)
            if out is not None:
                out.close()
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            if self.held is not None:
                self.held.release()


__all__ = ["ZipDriver"]

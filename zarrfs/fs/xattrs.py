"""Extended attributes of the tree's nodes: ``getxattr``, ``setxattr``, ``listxattr``,
``removexattr``, kept in the ``x:`` side record of each node (:mod:`zarrfs.fs.sidedata`).

Limits are ext4's with 4 KiB blocks: a name of at most 255 bytes (ERANGE), a value of at most
64 KiB (E2BIG), and all of a node's attributes in one block, each costing 16 bytes, its name
without the namespace prefix and its value rounded up to 4 bytes (ENOSPC past it). The
namespaces the kernel lets through are stored as they are: ``user.`` (files and folders; the
kernel refuses it elsewhere), ``trusted.`` (CAP_SYS_ADMIN, checked by the kernel) and
``security.``. Of ``system.`` names, the two POSIX ACLs (``system.posix_acl_access``,
``system.posix_acl_default``) are kept when the kernel enforces them (see
:mod:`zarrfs.fs.acl`; EOPNOTSUPP otherwise, as on a filesystem mounted ``noacl``); any other
is EOPNOTSUPP.
"""

from __future__ import annotations

import errno

from zarrfs.backends.base import SIDE, Get, Txn
from zarrfs.fs import acl, hardlinks, records
from zarrfs.fs.errors import FsError
from zarrfs.fs.lookups import Lookups
from zarrfs.fs.node import FILE, LINK
from zarrfs.fs.sidedata import Attrs, pack_xattrs, unpack_xattrs, xattr_key
from zarrfs.fs.transactions import Transactions, clock

XATTR_CREATE, XATTR_REPLACE = 1, 2
NAME_MAX = 255
SIZE_MAX = 65536
#: Bytes of one ext4 block left for the entries (less its header and end mark).
SPACE = 4096 - 32 - 4
STORED_PREFIXES = (b"user.", b"trusted.", b"security.")
ACL_NAMES = (b"system.posix_acl_access", b"system.posix_acl_default")


def _cost(name: bytes, value: bytes) -> int:
    short = len(name) - len(next((p for p in STORED_PREFIXES if name.startswith(p)), b""))
    return 16 + (short + 3) // 4 * 4 + (len(value) + 3) // 4 * 4


def check_name(name: bytes) -> None:
    """ERANGE for an empty or too long name, EINVAL for a namespace alone (``user.``, as ext4
    and tmpfs answer), EOPNOTSUPP for a namespace not kept here."""
    if not name or len(name) > NAME_MAX:
        raise FsError(errno.ERANGE, f"an extended attribute name of {len(name)} bytes", quiet=True)
    if name in STORED_PREFIXES:  # a namespace and no name in it: the kernel's own filesystems say so
        raise FsError(errno.EINVAL, f"extended attribute {name!r}: no name after the namespace", quiet=True)
    if not name.startswith(STORED_PREFIXES) and name not in ACL_NAMES:
        raise FsError(errno.EOPNOTSUPP, f"extended attribute {name!r}: namespace not kept", quiet=True)


def prepare(name: bytes, value: bytes | None, flags: int) -> tuple[bytes | None, int | None]:
    """The checks of a ``setxattr`` that need no record, and what it stores: ``value`` (an
    ACL packed; None for an access ACL the mode says all of, three entries, which is not kept,
    as ext4 does) and the permission bits an access ACL sets (None for any other name)."""
    check_name(name)
    if flags & ~(XATTR_CREATE | XATTR_REPLACE):
        raise FsError(errno.EINVAL, f"setxattr flags {flags:#x}")
    if value is not None and len(value) > SIZE_MAX:
        raise FsError(errno.E2BIG, f"an extended attribute value of {len(value)} bytes")
    mode_bits = None
    if name in acl.NAMES and value is not None:
        entries = acl.parse(value)
        value = acl.pack(entries)
        if name == acl.ACCESS:
            mode_bits = acl.mode_bits(entries)
            value = None if acl.equivalent(entries) else value
    return value, mode_bits


def change(
    xattrs: dict[bytes, bytes], key: str, name: bytes, value: bytes | None, flags: int, mode_bits: int | None
) -> None:
    """Apply one ``setxattr`` (as :func:`prepare` made it) to a node's attributes ``xattrs``:
    EEXIST, ENODATA as ``flags`` say, ENOSPC past one block."""
    if name in xattrs and flags & XATTR_CREATE:
        raise FsError(errno.EEXIST, f"{key}: {name!r}", quiet=True)
    if name not in xattrs and mode_bits is None and (value is None or flags & XATTR_REPLACE):
        raise FsError(errno.ENODATA, f"{key}: {name!r}", quiet=True)
    if value is None:
        xattrs.pop(name, None)
    else:
        xattrs[name] = bytes(value)
    if sum(_cost(n, v) for n, v in xattrs.items()) > SPACE:
        raise FsError(errno.ENOSPC, f"{key}: extended attributes past one block", quiet=True)


def applied(
    raw: bytes | None,
    attrs: Attrs,
    key: str,
    name: bytes,
    value: bytes | None,
    flags: int,
    mode_bits: int | None,
) -> bytes:
    """One ``setxattr`` (as :func:`prepare` made it) on a node whose ``x:`` record is ``raw``:
    the record it leaves (empty: none), and its ``attrs`` changed with it (an access ACL's
    permission bits; the ctime, as Linux's filesystems do: the node changed)."""
    xattrs = unpack_xattrs(raw)
    change(xattrs, key, name, value, flags, mode_bits)
    if mode_bits is not None:
        attrs.mode = (attrs.mode & ~0o777) | mode_bits
    attrs.ctime = clock()
    return pack_xattrs(xattrs)


class Xattrs:
    """The extended-attribute calls of the tree, over ``lookups`` (probes, attributes) and
    ``writes`` (its write transactions)."""

    def __init__(self, lookups: Lookups, writes: Transactions) -> None:
        self.lookups = lookups
        self.writes = writes
        self.driver = lookups.driver

    def xattrs(self, key: str) -> dict[bytes, bytes]:
        """Every extended attribute of ``key`` (ENOENT when nothing is there): the record the
        mount knows (a remote database followed by its feed), else read with the probe."""
        known = self.lookups.known
        if known is not None:
            have, raw = known.xattr_record(key)
            if have:
                return unpack_xattrs(raw)

        def run(t: Txn) -> bytes | None:
            (found,), (raw,) = self.lookups.probe_many_with(t, [key], [Get(xattr_key(key), SIDE)])
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            return raw

        raw = self.driver.transact(run, write=False)
        if known is not None:
            known.read_xattrs(key, raw)
        return unpack_xattrs(raw)

    def set_xattr(self, key: str, name: bytes, value: bytes | None, flags: int = 0) -> None:
        """Set (``value`` bytes) or remove (None: ENODATA when absent) one attribute;
        ``flags`` XATTR_CREATE (EEXIST when present) or XATTR_REPLACE (ENODATA when absent)."""
        value, mode_bits = prepare(name, value, flags)

        def run(t: Txn) -> None:
            # The record read with the probe: one round trip on a server.
            (found,), (raw_before,) = self.lookups.probe_many_with(t, [key], [Get(xattr_key(key), SIDE)])
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            attrs = self.lookups.attrs_of(t, key, found[0])
            raw = applied(raw_before, attrs, key, name, value, flags, mode_bits)
            group = hardlinks.load(t, key, found[4]) if found[4] is not None else None
            names = group.names if group is not None else [key]
            record = attrs.pack()
            records.put_attrs(t, names, record)
            records.put_xattrs(t, names, raw)
            if group is None and found[0] in (FILE, LINK) and self.writes.leaving:
                # The node changed (one of one name): the kernel asks for its attributes again
                # (its ctime changed), and need not ask the server
                self.writes.leave(key, self.lookups.node_from(t, key, found[0], found[1], found[2], record))

        self.writes.run(run)

"""POSIX ACLs (``system.posix_acl_access``, ``system.posix_acl_default``) as FUSE allows them.

With FUSE_POSIX_ACL (asked for when the mount checks permissions: ``default_permissions``) the
kernel reads ACLs through GETXATTR, caches and enforces them, and ``setfacl`` arrives as a
SETXATTR; the rest is the filesystem's (Linux's ``fs/fuse/acl.c``, libfuse's FUSE_CAP_POSIX_ACL):

* an access ACL sets the mode's permission bits (owner, mask or else owning group, other); one
  the mode says all of (three entries) is not kept, as on ext4;
* ``chmod`` changes the access ACL's owner, mask (or owning group) and other entries;
* a node made in a folder with a default ACL gets an access ACL from it, masked by the mode asked
  for (``posix_acl_create``), and a folder the default ACL too; without one the umask applies
  (the kernel leaves it to the filesystem: FUSE_DONT_MASK).

The xattr form: a little-endian u32 version (2), then 8 bytes per entry: u16 tag, u16
permissions, u32 id (for USER and GROUP entries).
"""

from __future__ import annotations

import errno
import struct

from zarrfs.fs.errors import FsError

ACCESS = b"system.posix_acl_access"
DEFAULT = b"system.posix_acl_default"
NAMES = (ACCESS, DEFAULT)

VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_HEAD = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_ORDER = {USER_OBJ: 0, USER: 1, GROUP_OBJ: 2, GROUP: 3, MASK: 4, OTHER: 5}

Entries = list[tuple[int, int, int]]


def parse(value: bytes) -> Entries:
    """The entries of an ACL in xattr form; EINVAL when it is not a valid ACL (the kernel
    checks an ACL before it sends it, so this guards the database, not the caller)."""
    body = len(value) - _HEAD.size
    if body < 0 or body % _ENTRY.size or _HEAD.unpack_from(value)[0] != VERSION:
        raise FsError(errno.EINVAL, "not a POSIX ACL", quiet=True)
    entries = [_ENTRY.unpack_from(value, at) for at in range(_HEAD.size, len(value), _ENTRY.size)]
    tags = [tag for tag, _, _ in entries]
    if any(tag not in _ORDER for tag in tags) or any(perm & ~7 for _, perm, _ in entries):
        raise FsError(errno.EINVAL, "not a POSIX ACL", quiet=True)
    single = [tags.count(t) for t in (USER_OBJ, GROUP_OBJ, OTHER)]
    if single != [1, 1, 1] or tags.count(MASK) > 1 or ((USER in tags or GROUP in tags) and MASK not in tags):
        raise FsError(errno.EINVAL, "not a POSIX ACL", quiet=True)
    return sorted(entries, key=lambda e: (_ORDER[e[0]], e[2]))


def pack(entries: Entries) -> bytes:
    """The xattr form of ``entries``."""
    return _HEAD.pack(VERSION) + b"".join(_ENTRY.pack(tag, perm, ident) for tag, perm, ident in entries)


def _perm(entries: Entries, tag: int) -> int | None:
    return next((perm for t, perm, _ in entries if t == tag), None)


def mode_bits(entries: Entries) -> int:
    """The permission bits an access ACL gives the mode."""
    group = _perm(entries, MASK)
    if group is None:
        group = _perm(entries, GROUP_OBJ) or 0
    return (_perm(entries, USER_OBJ) or 0) << 6 | group << 3 | (_perm(entries, OTHER) or 0)


def equivalent(entries: Entries) -> bool:
    """Whether the mode says all of the ACL (only its three base entries)."""
    return len(entries) == 3


def chmod(entries: Entries, mode: int) -> Entries:
    """The access ACL after a ``chmod`` to ``mode``."""
    has_mask = _perm(entries, MASK) is not None
    out = []
    for tag, perm, ident in entries:
        if tag == USER_OBJ:
            perm = mode >> 6 & 7
        elif tag == MASK or (tag == GROUP_OBJ and not has_mask):
            perm = mode >> 3 & 7
        elif tag == OTHER:
            perm = mode & 7
        out.append((tag, perm, ident))
    return out


def inherit(default: Entries, mode: int) -> tuple[Entries, int]:
    """The access ACL a node made with ``mode`` gets from its folder's default ACL, and its
    mode (``posix_acl_create_masq``)."""
    has_mask = _perm(default, MASK) is not None
    out = []
    for tag, perm, ident in default:
        if tag == USER_OBJ:
            perm &= mode >> 6 & 7
        elif tag == MASK or (tag == GROUP_OBJ and not has_mask):
            perm &= mode >> 3 & 7
        elif tag == OTHER:
            perm &= mode & 7
        out.append((tag, perm, ident))
    return out, (mode & ~0o777) | mode_bits(out)

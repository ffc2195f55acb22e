"""How a name's bytes become a key's text, and back.

A POSIX name is any bytes but ``/`` and NUL; a key is UTF-8 text, which every database and
zarr-python 2 can hold and list. A name that is UTF-8 is its key as it is. A byte that is not
part of valid UTF-8 becomes the private-use character U+EF80 + (byte - 0x80), as MirBSD's
OPTU-8 maps them (``caf\\xe9`` from a Latin-1 tarball is the key ``caf\\uefe9``), and comes back
as that byte in listings. A name that already holds one of those 128 characters cannot be told
from such a byte: it is refused with EILSEQ (a lookup of it finds nothing).
"""

from __future__ import annotations

import errno
import re

from zarrfs.fs.errors import FsError

NAME_MAX = 255  # bytes in one name (statfs's f_namemax), as ext4 and XFS allow
_BASE = 0xEF00  # + the byte (0x80-0xFF): U+EF80-U+EFFF
# Those characters in UTF-8: EE BE 80-BF (U+EF80-U+EFBF) and EE BF 80-BF (U+EFC0-U+EFFF).
_MARKS = (b"\xee\xbe", b"\xee\xbf")
_ESCAPED = re.compile("[\uef80-\uefff]")
_RAW = re.compile("[\udc80-\udcff]")


def key_text(name: bytes) -> str:
    """The key text of a name's bytes; EILSEQ for a name holding U+EF80-U+EFFF, ENAMETOOLONG
    for one longer than :data:`NAME_MAX`, as local filesystems say."""
    if len(name) > NAME_MAX:
        raise FsError(errno.ENAMETOOLONG, f"a name of {len(name)} bytes", quiet=True)
    if name.isascii():  # most names: nothing to map, no mark possible (every lookup asks)
        return name.decode("ascii")
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        text = name.decode("utf-8", "surrogateescape")
        if _marked(name):
            _refuse(name)
        return _RAW.sub(lambda m: chr(ord(m.group()) - 0xDC00 + _BASE), text)
    if _marked(name):
        _refuse(name)
    return text


def name_bytes(text: str) -> bytes:
    """The bytes of the name whose key text is ``text`` (the inverse of :func:`key_text`)."""
    if text.isascii():  # most names (every listed name passes here)
        return text.encode("ascii")
    raw = text.encode("utf-8")
    if _marked(raw):
        text = _ESCAPED.sub(lambda m: chr(ord(m.group()) - _BASE + 0xDC00), text)
        return text.encode("utf-8", "surrogateescape")
    return raw


def _marked(raw: bytes) -> bool:
    """Whether ``raw`` holds one of the characters that stand for bytes. ``find``, not ``in``:
    ``bytes in bytes`` first tries its operand as an integer and formats the TypeError it
    clears, several times the cost of the search."""
    return raw.find(_MARKS[0]) >= 0 or raw.find(_MARKS[1]) >= 0


def _refuse(name: bytes) -> None:
    raise FsError(
        errno.EILSEQ, f"the name {name!r} holds a character kept for bytes that are not UTF-8", quiet=True
    )

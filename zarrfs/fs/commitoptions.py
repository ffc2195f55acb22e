"""How a file's content is committed (:meth:`zarrfs.fs.tree.Tree.store`): one typed value that
travels from the open file (``HandleTable``) through the parts (``Parting``) to the transaction
(``Tree.store``), so that no step drops or misspells an option on the way."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class CommitOptions:
    """``create``: the file may be new here (its folder must exist, a folder or symlink in the
    way is an error; a new file replaces a name of a linked file: that name leaves the group);
    ``exclusive``: it must be new (EEXIST otherwise), as for ``link`` or ``RENAME_NOREPLACE``;
    ``replace``: a symlink in the way is replaced, as a rename does. ``linked``: the file had
    hard links when it was opened; the content is stored under every name its group has now.
    ``added``: when the file was made; if it turns out new, its folder's times change.
    ``renamed_from``: the file was an unstored file of that name, renamed here: both folders'
    times change. ``parted``: the value is the manifest of these parts (``fs.parts``); the
    parts of the version replaced are freed. ``base`` and ``lay``: when the stored file is no
    longer the version ``base`` (its stamp) the value was made from, ``lay(newest)`` makes the
    value to store from the newest content, read in the transaction (``fs.extents``).
    ``xattrs``: the extended-attributes record of a file new here."""

    create: bool = False
    exclusive: bool = False
    replace: bool = False
    linked: bool = False
    added: int | None = None
    renamed_from: str | None = None
    parted: Any = None
    base: tuple[int, int] | None = None
    lay: Any = None
    xattrs: bytes | None = None

    def in_parts(self, parted: Any) -> CommitOptions:
        """These options for the manifest of ``parted``: the parts were written before the
        transaction, so the content is stored as it is, nothing laid on a newer version."""
        return replace(self, parted=parted, base=None, lay=None)


#: The options of a plain rewrite of an existing file.
REWRITE = CommitOptions()
#: A file that may be new here.
CREATE = CommitOptions(create=True)

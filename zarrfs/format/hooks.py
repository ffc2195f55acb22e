"""The format layer plugged into the filesystem tree (``zarrfs.fs.tree.Hooks``).

:class:`FormatHooks` is what the daemon builds from the ``validate=``, ``view=`` and
``consolidate=`` mount options. It sees only a transaction with ``get``, ``get_many`` (reads in
one batch: one round trip on a remote database), ``put`` (and ``scan`` for ``consolidate=live``),
so it needs neither FUSE nor a particular database; the Zarr rules live in the rest of the
package.

* validate: ``strict`` refuses a name, metadata document or chunk key that breaks a rule
  (:class:`FormatError`, answered ``EINVAL``); ``warn`` logs and stores; ``off`` checks nothing.
* view: ``raw`` shows stored bytes; ``decoded`` shows each chunk of a supported array as its full
  raw bytes and encodes writes (a wrong size is refused); chunks it cannot decode are refused.
* consolidate: ``auto`` keeps each existing consolidated document (``.zmetadata``, a v3
  ``consolidated_metadata``) in step with metadata changes, in the same transaction; ``live`` also
  creates the root group's; ``off`` does nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING, Any

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
from .errors import FormatError, Problem
from .json_docs import parse_json_or_none
from .keys import (
    ZARR_JSON,
    ZGROUP,
    ZMETADATA,
    ancestors,
    becomes_metadata,
    is_metadata_key,
    is_temporary,
    join_key,
    relative_to,
    split_key,
    validate_name,
)
from .nodes import ARRAY, candidate_keys, enclosing_node
from .reconsolidate import is_document_key, is_stale, rebuilt
from .validate import chunk_key_problems, is_data_key_judged, validate_metadata

if TYPE_CHECKING:
    from .arrays import ArrayInfo

log = logging.getLogger("zarrfs.format")

VALIDATE_MODES = ("strict", "warn", "off")
VIEWS = ("raw", "decoded")
CONSOLIDATE_MODES = ("auto", "live", "off")
# Parsed consolidated documents and array infos kept between calls; both are re-validated
# against the stored bytes on every use, so another writer can never make them stale.
_CACHE_LIMIT = 64
#: How long a folder found outside every Zarr node is taken as such (seconds), and how many
#: such folders are kept. This mount's own metadata changes forget them at once, another
#: mount's as soon as the change feed tells (:meth:`FormatHooks.elsewhere`); without a feed,
#: within this time. A folder taken as outside when it no longer is only lets a chunk key go
#: unchecked, never refuses one.
OUTSIDE_TTL = 1.0
OUTSIDE_LIMIT = 4096


class FormatHooks:
    """Validation, the decoded view and live consolidated metadata for ``zarrfs.fs.tree.Tree``."""

    def __init__(
        self,
        validate: str = "strict",
        view: str = "raw",
        consolidate: str = "auto",
        clock: Callable[[], float] = time.monotonic,
    ):
        for name, value, allowed in (
            ("validate", validate, VALIDATE_MODES),
            ("view", view, VIEWS),
            ("consolidate", consolidate, CONSOLIDATE_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        self.validate = validate
        self.view = view
        self.consolidate = consolidate
        # The tree asks this to know that shown bytes differ from stored bytes.
        self.transforms = view == "decoded"
        self._docs: dict[str, tuple[bytes, CachedDoc]] = {}
        # Consolidated documents known to match the hierarchy, by the bytes they had then.
        self._verified: dict[str, bytes] = {}
        self._infos: dict[str, tuple[Any, ArrayInfo]] = {}
        # Folders with no metadata document in them or above them, by when that was read: a
        # file committed in one is no chunk, and its commit reads no metadata (an eighth of a
        # small file's close otherwise: docs/performance.md, "Python CPU of a lookup and of a
        # small file's close").
        self._outside: dict[str, float] = {}
        self._clock = clock

    # ------------------------------------------------------------------ validation
    def _judge(self, problems: list[Problem]) -> None:
        """Log what was found and, in strict mode, refuse on the first error."""
        for p in problems:
            if p.is_error and self.validate == "strict":
                raise FormatError(p, problems)
        for p in problems:
            log.warning("%s", p)

    def check_name(self, txn: Any, key: str, kind: int) -> None:
        """Refuse a new file or folder name that no Zarr client could address. A backslash
        matters only inside a Zarr node (zarr-python 2 reads it as ``/``): outside one, a name
        is any name a folder can hold (a zip's ``a\\b``)."""
        if self.validate != "off" and (problems := validate_name(key)):  # most names: none
            if any(p.rule == "name.backslash" for p in problems) and (
                enclosing_node(key, txn.get, txn.get_many) is None
            ):
                problems = [p for p in problems if p.rule != "name.backslash"]
            self._judge(problems)

    def _validate_value(self, txn: Any, key: str, value: Any) -> None:
        if self.validate == "off":
            return
        if is_metadata_key(key):
            self._judge(validate_metadata(key, bytes(value), txn.get))
        elif is_data_key_judged(key):
            folder = split_key(key)[0]
            if self._is_outside(folder):
                return
            node = enclosing_node(key, txn.get, txn.get_many)
            if node is None:
                txn.after_commit(partial(self._found_outside, folder, self._clock()))
            self._judge(chunk_key_problems(key, node))

    def _found_outside(self, folder: str, when: float) -> None:
        if len(self._outside) >= OUTSIDE_LIMIT:
            self._outside.clear()
        self._outside[folder] = when

    def _is_outside(self, folder: str) -> bool:
        """Whether ``folder`` was found outside every Zarr node less than
        :data:`OUTSIDE_TTL` ago (and nothing said otherwise since)."""
        seen = self._outside.get(folder)
        return seen is not None and self._clock() - seen < OUTSIDE_TTL

    def elsewhere(self, keys: Collection[str] | None) -> None:
        """Another writer changed ``keys`` (None: something, not known what), as the change
        feed tells: a metadata document among them may put folders taken as outside every
        Zarr node inside one."""
        if keys is None or any(is_metadata_key(k) for k in keys):
            self._outside.clear()

    def whole(self, key: str) -> bool:
        """Whether a value at ``key`` is read whole here (metadata, and the temporary files
        that become metadata): never stored in parts."""
        return is_metadata_key(key) or becomes_metadata(key)

    def reads(self, key: str) -> list[str]:
        """The metadata documents validating a new chunk or data file at ``key`` reads (those
        of its enclosing folders); nothing for metadata, which is rare and read differently."""
        if (self.validate == "off" and not self.transforms) or is_metadata_key(key):
            return []
        folder = split_key(key)[0]
        if not self.transforms and self._is_outside(folder):
            return []
        return [k for prefix in ancestors(folder) for k in candidate_keys(prefix)]

    def store(self, txn: Any, key: str, value: Any) -> Any:
        """Validate bytes written through a file; in the decoded view, encode chunks; a
        consolidated document is made true (see :meth:`_trusted`)."""
        self._validate_value(txn, key, value)
        value = self._trusted(txn, key, value)
        if self.transforms:
            info = self._chunk_array(txn, key)
            if info is not None:
                return info.encode_chunk(bytes(value))
        return value

    def arrive(self, txn: Any, key: str, value: bytes, source: str) -> bytes:
        """Validate a stored value arriving at ``key`` by rename or link. In the decoded view,
        bytes that arrive on a chunk from a file that was not a chunk (a program's temporary
        file) are the decoded bytes it wrote: encode them, as a write in place would be."""
        self._validate_value(txn, key, value)
        value = self._trusted(txn, key, value)
        if self.transforms and source:
            info = self._chunk_array(txn, key)
            if info is not None and self._chunk_array(txn, source) is None:
                # refused with the reason when the array is unsupported
                return info.encode_chunk(bytes(value))
        return value

    # ------------------------------------------------------------------ decoded view
    def _chunk_array(self, txn: Any, key: str) -> ArrayInfo | None:
        """The array whose chunk ``key`` is, or ``None`` (then bytes pass as stored). For an
        array the decoded view cannot show (object dtype, codecs that cannot be built,
        sharding), ``decode_chunk``/``encode_chunk`` raise :class:`UnsupportedArray`."""
        if is_metadata_key(key) or is_temporary(key):
            return None
        node = enclosing_node(key, txn.get, txn.get_many)
        if node is None or node.kind != ARRAY:
            return None
        from .arrays import info_from_node  # codecs (numpy): for a decoded view only

        cached = self._infos.get(node.metadata_key)
        if cached is not None and cached[0] == node.doc:
            info = cached[1]  # same document: keep the built codec pipeline
        else:
            try:
                info = info_from_node(node)
            except FormatError:
                return None  # invalid or unknown layout: nothing to decode against
            if len(self._infos) >= _CACHE_LIMIT:
                self._infos.clear()
            self._infos[node.metadata_key] = (node.doc, info)
        if info.chunk_coords(key) is None:
            return None
        return info  # possibly unsupported: decode/encode then refuse with the reason

    def shown_size(self, txn: Any, key: str, size: int) -> int:
        """A chunk shows the size of the full decoded chunk in the decoded view (a chunk of an
        unsupported array keeps its stored size, so listings work; reading it is refused)."""
        if self.transforms:
            info = self._chunk_array(txn, key)
            if info is not None and info.unsupported is None:
                return info.chunk_nbytes()
        return size

    def shown_value(self, txn: Any, key: str, value: bytes) -> bytes:
        """A chunk shows its decoded bytes in the decoded view."""
        if self.transforms:
            info = self._chunk_array(txn, key)
            if info is not None:
                return info.decode_chunk(value)
        return value

    # ------------------------------------------------------------------ consolidated metadata
    def changed(self, txn: Any, key: str, value: bytes | None) -> None:
        """After a metadata key changed, bring the consolidated documents above it in step
        (and take no folder as outside every node any more)."""
        if self._outside and is_metadata_key(key):
            self._outside.clear()
        if self.consolidate == "off":
            return
        name = split_key(key)[1]
        if name == ZMETADATA or (name == ZARR_JSON and not split_key(key)[0]):
            # The documents themselves: forget what we parsed, the client rewrote them.
            self._docs.pop(key, None)
            return
        if not (is_consolidated_key(key) or name == ZARR_JSON):
            return
        found = False
        for prefix in ancestors(split_key(key)[0]):
            rel = relative_to(key, prefix)
            if name == ZARR_JSON:
                if rel == ZARR_JSON:
                    continue  # a node's own document is not consolidated into itself
                found |= self._update(txn, join_key(prefix, ZARR_JSON), rel, value, v3=True)
            else:
                found |= self._update(txn, join_key(prefix, ZMETADATA), rel, value, v3=False)
        if not found and self.consolidate == "live" and value is not None:
            self._create_root(txn, v3=name == ZARR_JSON)

    def _load(self, txn: Any, doc_key: str) -> tuple[bytes, CachedDoc] | None:
        raw = txn.get(doc_key)
        if raw is None:
            return None
        raw = bytes(raw)
        cached = self._docs.get(doc_key)
        if cached is not None and cached[0] == raw:
            return cached
        try:
            doc = load_consolidated(raw)
        except FormatError:
            return None
        return raw, doc

    def _update(self, txn: Any, doc_key: str, rel: str, value: bytes | None, v3: bool) -> bool:
        """Apply one change to the consolidated document at ``doc_key``; True if there is one.
        A document not known to be true (first seen, or rewritten by someone else) is checked
        against the hierarchy first, and rebuilt from it instead of patched when stale."""
        loaded = self._load(txn, doc_key)
        if loaded is None:
            return False
        if not self._is_verified(txn, doc_key, loaded[0]):
            raw = bytes(loaded[0])
            keys = self._keys_below(txn, doc_key)
            if is_stale(doc_key, raw, keys, txn.get, ahead=True):
                new_raw = rebuilt(doc_key, raw, keys, txn.get)
                if new_raw is None:
                    return False
                log.info("%s: consolidated metadata was stale; rebuilt from the hierarchy", doc_key)
                txn.put(doc_key, new_raw)
                self._docs.pop(doc_key, None)
                self._verify(txn, doc_key, new_raw)
                return True
        _, doc = loaded
        if v3 and not isinstance(doc.get("consolidated_metadata"), dict):
            return False
        try:
            new = consolidated_update_v3(doc, rel, value) if v3 else consolidated_update(doc, rel, value)
        except FormatError:
            return True  # a value that is not JSON: validation's business, not ours
        if new is not None:
            raw = dumps_zarr_json(new) if v3 else dumps_consolidated(new)
            txn.put(doc_key, raw)
            doc = new
        else:
            raw = loaded[0]
        if len(self._docs) >= _CACHE_LIMIT:
            self._docs.clear()
            self._verified.clear()
        self._docs[doc_key] = (raw, doc)
        self._verify(txn, doc_key, raw)
        return True

    # ------------------------------------------------------------------ trusted documents
    def _is_verified(self, txn: Any, doc_key: str, raw: Any) -> bool:
        """Whether the document ``raw`` at ``doc_key`` is known to match the hierarchy: found
        so by a committed transaction, or earlier in this one (:meth:`_verify`)."""
        return self._verified.get(doc_key) == raw or txn.notes.get(("verified", doc_key)) == raw

    def _verify(self, txn: Any, doc_key: str, raw: bytes) -> None:
        """``raw`` at ``doc_key`` matches the hierarchy, as this transaction read it: known for
        the rest of it, and kept once it commits (a run on reads that did not hold, run
        again, must not leave it trusted)."""
        txn.notes[("verified", doc_key)] = raw
        txn.after_commit(partial(self._verified.__setitem__, doc_key, raw))

    @staticmethod
    def _keys_below(txn: Any, doc_key: str) -> list[str]:
        folder = split_key(doc_key)[0]
        return [k for k, _ in txn.scan_prefix(folder + "/" if folder else "")]

    def _trusted(self, txn: Any, key: str, value: Any) -> Any:
        """A consolidated document written by a client, as the hierarchy says it should be:
        a client writing back an outdated copy (zarr-python 3 rewriting a group's
        ``zarr.json`` to change its attributes) cannot make it stale. Unchanged bytes when
        the document is true."""
        if self.consolidate == "off" or not is_document_key(key):
            return value
        raw = bytes(value)
        if split_key(key)[1] == ZARR_JSON:
            doc = parse_json_or_none(raw) if b"consolidated_metadata" in raw else None
            if not isinstance(doc, dict) or not isinstance(doc.get("consolidated_metadata"), dict):
                return value  # a node's own document, no consolidated map in it
        keys = self._keys_below(txn, key)
        if not is_stale(key, raw, keys, txn.get, ahead=True):  # kept byte for byte
            self._verify(txn, key, raw)
            return value
        new_raw = rebuilt(key, raw, keys, txn.get)
        if new_raw is None:
            return value
        log.info("%s: the consolidated metadata written was stale; stored as the hierarchy holds it", key)
        self._verify(txn, key, new_raw)
        return new_raw

    def _create_root(self, txn: Any, v3: bool) -> None:
        """``consolidate=live``: give a root group its consolidated document, built once from
        every metadata key (later changes update it)."""
        if v3:
            root = parse_json_or_none(txn.get(ZARR_JSON))
            if not isinstance(root, dict) or root.get("node_type") != "group":
                return
            keys = [k for k, _ in txn.scan() if split_key(k)[1] == ZARR_JSON]
            items = ((k, txn.get(k)) for k in keys)
            root = CachedDoc(root)
            root["consolidated_metadata"] = build_consolidated_v3(items)
            txn.put(ZARR_JSON, dumps_zarr_json(root))
        else:
            if txn.get(ZGROUP) is None:
                return
            keys = [k for k, _ in txn.scan() if is_consolidated_key(k)]  # keys first, then reads
            items = ((k, txn.get(k)) for k in keys)
            txn.put(ZMETADATA, dumps_consolidated(build_consolidated(items)))

"""A name's bytes and its key's text, both ways (``fs.names``): every name but those holding
the characters kept for bytes comes back as it went, ASCII or not, valid UTF-8 or not."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zarrfs.fs.errors import FsError
from zarrfs.fs.names import NAME_MAX, key_text, name_bytes

MARKED = ("\uef80", "\uefbf", "\uefc0", "\uefff")  # U+EF80-U+EFFF: stand for bytes 0x80-0xFF

names = st.one_of(
    st.binary(min_size=1, max_size=NAME_MAX),
    st.text(min_size=1, max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.text(alphabet=st.characters(max_codepoint=127), min_size=1, max_size=NAME_MAX).map(str.encode),
    st.sampled_from(MARKED).map(lambda c: ("a" + c).encode()),
).filter(lambda b: b"/" not in b and b"\0" not in b and len(b) <= NAME_MAX)


@given(names)
def test_a_name_comes_back_as_its_bytes_or_is_refused_when_it_holds_a_kept_character(name):
    marked = any(c.encode() in name for c in MARKED) or b"\xee\xbe" in name or b"\xee\xbf" in name
    try:
        text = key_text(name)
    except FsError as exc:
        assert exc.errno == errno.EILSEQ and marked
        return
    assert not marked
    assert name_bytes(text) == name
    text.encode("utf-8")  # a key is UTF-8 text, whatever the name's bytes
    if name.isascii():
        assert text == name.decode()


@pytest.mark.parametrize(
    ("name", "text"),
    [(b"c0.1", "c0.1"), ("café".encode(), "café"), (b"caf\xe9", "caf\uefe9"), (b"\xff\x80", "\uefff\uef80")],
)
def test_known_names_and_their_keys(name, text):
    assert key_text(name) == text and name_bytes(text) == name


def test_a_name_longer_than_name_max_is_refused():
    with pytest.raises(FsError) as exc:
        key_text(b"x" * (NAME_MAX + 1))
    assert exc.value.errno == errno.ENAMETOOLONG

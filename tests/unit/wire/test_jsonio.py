"""Reading JSON: the fast path keeps the standard library's meaning; only the members asked
for are read, and only objects count as bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from proxy.wire.jsonio import load_object, loads, top_members, with_members


def test_json_fallback_keeps_the_standard_librarys_meaning() -> None:
    """Bodies orjson refuses are read as json.loads reads them; well-formed ones alike."""
    for text in (
        b'{"a": NaN, "b": Infinity}',
        b'{"big": 123456789012345678901234567890}',
        b'{"s": "\\ud800"}',
        '{"u": "é"}'.encode("utf-16"),
        b'{"a": 1, "a": 2, "f": 1e400, "n": -0, "e": 1.5e-400, "p": 0.30000000000000004}',
        b'{"q": "Where", "documents": ["x", {"type": "image_url"}], "\\u0000": null}',
        b'\xef\xbb\xbf{"bom": 1}',
        b' [1, 2.5, "\\u00e9\\ud83d\\ude00"]\n',
    ):
        assert repr(loads(text)) == repr(json.loads(text))
    for broken in (b'{"a": ', b'{"a": 1} x', b"[1,]", b'{"a": "x\ny"}', b"   "):
        with pytest.raises(json.JSONDecodeError):
            loads(broken)


class _Deciding(BaseModel):
    model: Any = None
    stream: Any = None


@pytest.mark.parametrize(
    ("data", "members"),
    [
        (b'{"model": "m", "input": [1, 2], "stream": true}', {"model": "m", "stream": True}),
        (b'{"input": "x"}', {}),
        (b'{"model": "a", "model": "b"}', {"model": "b"}),  # the last one counts, as in loads
        (b'\xef\xbb\xbf{"model": "bom"}', {"model": "bom"}),  # refused by pydantic, not loads
        (b"[1, 2]", None),
        (b'"model"', None),
        (b"{not json", None),
    ],
)
def test_top_members_reads_only_the_declared_members(
    data: bytes, members: dict[str, Any] | None
) -> None:
    """The declared top-level members the body holds, read as ``loads`` reads them; None
    for anything that is not a JSON object."""
    assert top_members(data, _Deciding) == members


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"a": 1}', {"a": 1}),
        (b"[1]", None),
        (b"null", None),
        (b"\xff\xfe{", None),
        (b"[" * 100_000 + b"]" * 100_000, None),
    ],
)
def test_load_object_is_none_for_anything_but_an_object(
    data: bytes, expected: dict[str, Any] | None
) -> None:
    """Not JSON, not UTF-8, nested too deep, or another JSON value: None, never a raise."""
    assert load_object(data) == expected


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@given(
    st.dictionaries(st.text(max_size=4), _JSON, max_size=4),
    st.dictionaries(st.sampled_from(["cache_salt", "request_id", "a"]), st.text(), min_size=1),
    st.sampled_from(["", " ", "\n", "\r\n  "]),
    st.booleans(),
)
def test_with_members_reads_as_the_merged_object(
    base: dict[str, Any], added: dict[str, str], space: str, pretty: bool
) -> None:
    """Issue #44: the members the proxy adds (a tenant's cache salt, a minted response id)
    are what a JSON reader that keeps the last repeated member (vLLM's) reads, whatever
    the body already holds, its spacing or trailing white space."""
    body = (json.dumps(base, indent=2 if pretty else None) + space).encode()
    merged = with_members(body, added)
    assert json.loads(merged) == {**base, **added}
    assert load_object(merged) == {**base, **added}


def test_with_members_of_a_body_that_is_not_plain_utf8() -> None:
    """A body with a byte-order mark or in UTF-16 is parsed and written whole; one that is
    no object raises ValueError (vLLM answers it 400; the proxy sends it as it came)."""
    bom = b"\xef\xbb\xbf" + json.dumps({"a": 1}).encode()
    assert json.loads(with_members(bom, {"b": "x"})) == {"a": 1, "b": "x"}
    utf16 = json.dumps({"a": 1}).encode("utf-16")
    assert json.loads(with_members(utf16, {"b": "x"})) == {"a": 1, "b": "x"}
    with pytest.raises(ValueError, match="not a JSON object"):
        with_members(b"[1, 2]", {"b": "x"})

"""Multipart forms read as Starlette reads them, and one field appended."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.forms import (
    FILE,
    MAX_PART_BYTES,
    FormError,
    is_multipart,
    read_form,
    with_field,
)

KIND = "multipart/form-data; boundary=xyz"


def body(*parts: bytes) -> bytes:
    return b"".join(b"--xyz\r\n" + p + b"\r\n" for p in parts) + b"--xyz--\r\n"


def text(name: str, value: bytes) -> bytes:
    return b'Content-Disposition: form-data; name="' + name.encode() + b'"\r\n\r\n' + value


FILE_PART = b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n--'


def test_text_fields_are_read_and_files_only_marked() -> None:
    """Text parts keep their values in order; a file part's bytes are not kept (even when
    they hold something that looks like a delimiter's start)."""
    form = read_form(body(FILE_PART, text("model", b"w"), text("stream", b"true")), KIND)
    assert form.items == [("file", FILE), ("model", "w"), ("stream", "true")]
    assert form.boundary == b"xyz"


def test_the_last_value_is_the_one_read() -> None:
    """Starlette's FormData.get returns a repeated field's last value; so does value()."""
    form = read_form(body(text("stream", b"false"), text("stream", b"true")), KIND)
    assert form.value("stream") == "true"
    assert form.value("model") is None


@pytest.mark.parametrize(
    ("raw", "kind", "message"),
    [
        (body(text("a", b"1")), "multipart/form-data", "Missing boundary in multipart."),
        (body(b"Content-Disposition: form-data\r\n\r\nx"), KIND, "The Content-Disposition"),
        (body(text("p", b"x" * (MAX_PART_BYTES + 1))), KIND, "Part exceeded maximum size"),
        (body(*[text("a", b"1")] * 1001), KIND, "Too many fields."),
        (b"--xyz\r\nno-colon-header\r\n\r\n1\r\n--xyz--\r\n", KIND, "Invalid multipart data."),
    ],
)
def test_what_starlette_refuses_is_refused_with_its_message(
    raw: bytes, kind: str, message: str
) -> None:
    """Each of Starlette's refusals (vLLM answers them 400) raises FormError, its message."""
    with pytest.raises(FormError, match=message[:20]):
        read_form(raw, kind)


def test_a_file_part_may_be_larger_than_a_text_field() -> None:
    """Only text parts are bounded (a file is spooled by Starlette, not bounded)."""
    big = b'Content-Disposition: form-data; name="file"; filename="a"\r\n\r\n' + b"x" * (
        MAX_PART_BYTES + 1
    )
    assert read_form(body(big), KIND).items == [("file", FILE)]


@given(st.lists(st.binary(max_size=40).filter(lambda b: b"--xyz" not in b), min_size=1, max_size=4))
def test_an_appended_field_is_read_last_and_the_rest_is_unchanged(values: list[bytes]) -> None:
    """Whatever the other parts, the appended part is the last item read, every other
    item reads as before, and the bytes before the closing delimiter are untouched."""
    raw = body(*(text(f"f{i}", v) for i, v in enumerate(values)))
    before = read_form(raw, KIND).items
    sent = with_field(raw, b"xyz", "stream_include_usage", "true")
    assert read_form(sent, KIND).items == [*before, ("stream_include_usage", "true")]
    close = raw.rfind(b"\r\n--xyz--")
    assert sent[:close] == raw[:close]
    assert sent[-len(raw) + close :] == raw[close:]


def test_a_body_without_its_closing_delimiter_gets_no_part() -> None:
    """Nothing to append before: FormError, never a body with a part in the wrong place."""
    with pytest.raises(FormError):
        with_field(b"--xyz\r\n" + text("a", b"1"), b"xyz", "b", "2")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("multipart/form-data; boundary=a", True),
        ("Multipart/Form-Data; boundary=a", True),
        ("application/x-www-form-urlencoded", False),
        ("application/json", False),
        (None, False),
    ],
)
def test_is_multipart(kind: str | None, expected: bool) -> None:
    """Only multipart/form-data (any case) is a form the proxy reads."""
    assert is_multipart(kind) is expected


def test_the_last_file_part_of_a_name_is_kept_when_asked() -> None:
    """``keep``: the bytes of the last file part of that name (the one vLLM reads),
    every byte as sent; other file parts are still only marked."""
    other = b'Content-Disposition: form-data; name="file"; filename="b.wav"\r\n\r\nWAVE'
    form = read_form(body(FILE_PART, other, text("model", b"w")), KIND, keep="file")
    assert form.kept == b"WAVE"
    assert form.items == [("file", FILE), ("file", FILE), ("model", "w")]
    assert read_form(body(FILE_PART), KIND, keep="audio").kept is None
    assert read_form(body(FILE_PART), KIND).kept is None

"""Multipart forms (vLLM's audio requests): the text fields read as vLLM's server reads
them, and one field appended with the body otherwise unchanged.

Pure: bytes in, facts or bytes out. Parsed by python-multipart, the parser Starlette (and
so vLLM) runs on the same bytes, with Starlette's bounds: a body Starlette refuses is
refused here with its message, so the proxy never forwards a form it read differently.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

# Starlette's ``Request.form()`` bounds (starlette 0.40 to 1.10, which vLLM's servers run).
MAX_PART_BYTES = 1024 * 1024
MAX_FIELDS = 1000
MAX_FILES = 1000
MULTIPART = "multipart/form-data"


class FormError(ValueError):
    """A form Starlette refuses (vLLM answers 400 with this message)."""


class File:
    """A file part: its bytes are not read, only that it is there."""

    def __repr__(self) -> str:
        return "File()"


FILE = File()


@dataclass(slots=True)
class Form:
    """A multipart form's boundary and its parts' values in order (a file part as
    ``FILE``); vLLM's request model reads each field's last value."""

    boundary: bytes
    items: list[tuple[str, str | File]] = field(default_factory=list)
    charset: str = "utf-8"  # what names and values are decoded with (the Content-Type's)
    kept: bytes | None = None  # the last file part of the name ``read_form`` was asked to keep

    def value(self, name: str) -> str | File | None:
        """The value vLLM reads for ``name`` (Starlette's ``FormData.get``: the last)."""
        found: str | File | None = None
        for key, value in self.items:
            if key == name:
                found = value
        return found


def is_multipart(content_type: str | None) -> bool:
    kind, _ = parse_options_header(content_type or "")
    return kind == MULTIPART.encode()


def read_form(body: bytes, content_type: str, keep: str | None = None) -> Form:
    """The text fields of a ``multipart/form-data`` body as Starlette reads them, and the
    bytes of the last file part named ``keep`` (``Form.kept``; vLLM reads that one);
    raises FormError with Starlette's message where it refuses the body."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise FormError("Missing boundary in multipart.")
    charset = _charset(params.get(b"charset", b"utf-8"))
    reader = _Reader(Form(boundary, charset=charset), charset, keep)
    try:
        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": reader.begin,
                "on_part_data": reader.part_data,
                "on_part_end": reader.part_end,
                "on_header_field": reader.header_field,
                "on_header_value": reader.header_value,
                "on_header_end": reader.header_end,
                "on_headers_finished": reader.headers_done,
            },
        )
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise FormError("Invalid multipart data.") from exc
    return reader.form


def with_field(
    body: bytes, boundary: bytes, name: str, value: str, charset: str = "utf-8"
) -> bytes:
    """``body`` with one more text part, ``name`` = ``value`` (in the form's ``charset``,
    as its names and values are read), just before its closing delimiter: the first one,
    where every parser stops (what follows is epilogue); the same boundary, every other
    byte as sent; read last, so it is the value vLLM reads. Raises FormError for a body
    without a closing delimiter. The caller reads the result again to prove it."""
    close = b"\r\n--" + boundary + b"--"
    end = body.find(close)
    if end < 0:
        raise FormError("Invalid multipart data.")
    try:
        coded_name, coded_value = name.encode(charset), value.encode(charset)
    except (UnicodeEncodeError, LookupError) as exc:
        raise FormError(f"Cannot write a part in the form's charset {charset}.") from exc
    part = (
        b"\r\n--"
        + boundary
        + b'\r\nContent-Disposition: form-data; name="'
        + coded_name
        + b'"\r\n\r\n'
        + coded_value
    )
    return body[:end] + part + body[end:]


def _charset(raw: bytes) -> str:
    try:
        return codecs.lookup(raw.decode("latin-1")).name
    except LookupError:
        return "latin-1"


class _Reader:
    """Starlette's ``MultiPartParser`` callbacks, keeping text values and marking files."""

    def __init__(self, form: Form, charset: str, keep: str | None = None) -> None:
        self.form, self._charset, self._keep = form, charset, keep
        self._header_name = self._header_value = b""
        self._disposition = b""
        self._name = ""
        self._data = bytearray()
        self._file = False
        self._fields = self._files = 0

    def begin(self) -> None:
        self._disposition, self._data, self._file = b"", bytearray(), False

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file:
            if self._name == self._keep:
                self._data += data[start:end]
            return
        if len(self._data) + end - start > MAX_PART_BYTES:
            raise FormError(f"Part exceeded maximum size of {MAX_PART_BYTES // 1024}KB.")
        self._data += data[start:end]

    def part_end(self) -> None:
        if self._file and self._name == self._keep:
            self.form.kept = bytes(self._data)
        value = FILE if self._file else _decode(bytes(self._data), self._charset)
        self.form.items.append((self._name, value))

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def headers_done(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise FormError('The Content-Disposition header field "name" must be provided.')
        self._name = _decode(options[b"name"], self._charset)
        self._file = b"filename" in options
        if self._file:
            self._files += 1
            if self._files > MAX_FILES:
                raise FormError(f"Too many files. Maximum number of files is {MAX_FILES}.")
        else:
            self._fields += 1
            if self._fields > MAX_FIELDS:
                raise FormError(f"Too many fields. Maximum number of fields is {MAX_FIELDS}.")


def _decode(value: bytes, charset: str) -> str:
    """Starlette's ``_user_safe_decode``: the charset, else latin-1."""
    try:
        return value.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return value.decode("latin-1")

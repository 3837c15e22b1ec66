"""Content encodings of upstream answers: undone in order, within the limit, or refused."""

from __future__ import annotations

import gzip
import zlib

import pytest

from proxy.wire.encoding import UnreadableBody, content_codings, decode_body

BODY = b'{"usage": {"prompt_tokens": 5, "total_tokens": 5}}'


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("header", "codings"),
    [
        (None, []),
        ("", []),
        ("identity", []),
        ("GZIP", ["gzip"]),
        ("deflate, gzip", ["deflate", "gzip"]),
        (" gzip ,identity, br", ["gzip", "br"]),
    ],
)
def test_content_codings_drop_identity(header: str | None, codings: list[str]) -> None:
    """The header's codings, lower-cased, in the order applied, without ``identity``."""
    assert content_codings(header) == codings


@pytest.mark.parametrize(
    ("header", "payload"),
    [
        (None, BODY),
        ("identity", BODY),
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("deflate", _raw_deflate(BODY)),  # servers that omit the zlib header
        ("deflate, gzip", gzip.compress(zlib.compress(BODY))),
    ],
)
def test_every_coding_is_undone_in_reverse_order(header: str | None, payload: bytes) -> None:
    """The client's bytes come back whatever codings were applied, last applied first."""
    assert decode_body(payload, header, 1 << 20) == BODY


@pytest.mark.parametrize(
    ("header", "payload", "reason"),
    [
        ("br", BODY, "not supported"),
        ("gzip", b"not gzip at all", "corrupt"),
        ("gzip", gzip.compress(BODY)[:-12], "truncated"),
        ("gzip", gzip.compress(b" " * 10_000), "larger than"),
    ],
)
def test_unreadable_bodies_are_refused_with_a_reason(
    header: str, payload: bytes, reason: str
) -> None:
    """Unknown codings, corrupt or truncated streams, and expansion past the limit (a
    small compressed answer cannot grow without bound) raise UnreadableBody."""
    with pytest.raises(UnreadableBody, match=reason):
        decode_body(payload, header, 1024)


def test_a_body_exactly_at_the_limit_is_read() -> None:
    """The limit is inclusive: a body of exactly ``limit`` bytes decodes."""
    assert decode_body(gzip.compress(b"x" * 1024), "gzip", 1024) == b"x" * 1024


def test_every_member_of_a_multi_member_gzip_body_is_read() -> None:
    """A gzip answer of several members (RFC 1952: their concatenation) decodes whole;
    cutting it at the first member would bill from a fragment and hand the client a
    cut body in rewrite mode."""
    first, second = BODY[:20], BODY[20:]
    payload = gzip.compress(first) + gzip.compress(second)
    assert decode_body(payload, "gzip", 1 << 20) == BODY
    assert decode_body(payload + b"\0" * 8, "gzip", 1 << 20) == BODY  # zero padding


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (gzip.compress(b"x" * 600) + gzip.compress(b"y" * 600), "larger than"),
        (gzip.compress(BODY) + gzip.compress(BODY)[:-12], "truncated"),
        (gzip.compress(BODY) + b"trailing junk", "corrupt"),
    ],
)
def test_later_gzip_members_are_held_to_the_same_bounds(payload: bytes, reason: str) -> None:
    """The limit counts the members together; a truncated or corrupt later member is
    refused like a first one."""
    with pytest.raises(UnreadableBody, match=reason):
        decode_body(payload, "gzip", 1024)

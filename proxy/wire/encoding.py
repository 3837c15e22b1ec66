"""Content-Encoding of upstream answers on metered paths: read what the client will read.

The proxy asks the upstream for ``identity`` there; an upstream (or a layer in front of
it) that compresses anyway must not make a request unbillable. gzip and deflate are
decoded, bounded so a small compressed answer cannot expand without limit. Pure; callers
run it off the event loop.
"""

from __future__ import annotations

import zlib


class UnreadableBody(Exception):
    """The answer's encoding is unknown, corrupt, or expands past the limit."""


def content_codings(header: str | None) -> list[str]:
    """The codings applied, in order, without ``identity`` (which means none)."""
    codings = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
    return [c for c in codings if c != "identity"]


def decode_body(payload: bytes, header: str | None, limit: int) -> bytes:
    """The body with every coding in ``header`` undone; raises UnreadableBody."""
    for coding in reversed(content_codings(header)):
        if coding in ("gzip", "x-gzip"):
            payload = _inflate(payload, zlib.MAX_WBITS | 16, limit)
        elif coding == "deflate":
            try:
                payload = _inflate(payload, zlib.MAX_WBITS, limit)
            except UnreadableBody:  # some servers send raw deflate without the zlib header
                payload = _inflate(payload, -zlib.MAX_WBITS, limit)
        else:
            raise UnreadableBody(f"content-encoding {coding!r} is not supported")
    return payload


def _inflate(payload: bytes, wbits: int, limit: int) -> bytes:
    """Every member of a gzip stream (RFC 1952 allows several, read as one), the one
    stream of a zlib or raw deflate body; at most ``limit`` bytes in all."""
    out = bytearray()
    rest = payload
    while True:
        rest = _inflate_member(rest, wbits, limit, out)
        if wbits <= zlib.MAX_WBITS or not rest.strip(b"\0"):  # gzip allows zero padding
            return bytes(out)


def _inflate_member(payload: bytes, wbits: int, limit: int, out: bytearray) -> bytes:
    """Append one member's bytes to ``out``; return what follows it."""
    inflater = zlib.decompressobj(wbits)
    try:
        out += inflater.decompress(payload, limit + 1 - len(out))
    except zlib.error as exc:
        raise UnreadableBody(f"corrupt compressed body: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise UnreadableBody(f"decoded body is larger than {limit} bytes")
    if not inflater.eof:
        raise UnreadableBody("truncated compressed body")
    return inflater.unused_data

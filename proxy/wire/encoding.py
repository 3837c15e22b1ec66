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
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise UnreadableBody(f"corrupt compressed body: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise UnreadableBody(f"decoded body is larger than {limit} bytes")
    if not inflater.eof:
        raise UnreadableBody("truncated compressed body")
    return out

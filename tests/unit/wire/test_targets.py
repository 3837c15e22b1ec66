"""Request targets read as vLLM's router reads them (issue #26)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.targets import BadTarget, normalize, remove_dot_segments


@pytest.mark.parametrize(
    ("raw", "path", "sent"),
    [
        ("/x/../v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/./chat/completions", "/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/%2e/chat/completions", "/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/%2E%2E/v1/embeddings", "/v1/embeddings", "/v1/embeddings"),
        ("/./rerank", "/rerank", "/rerank"),
        ("/v1%2Frerank", "/v1/rerank", "/v1/rerank"),
        ("/v1/rerank/", "/v1/rerank", "/v1/rerank"),
        ("/v1/rerank/?a=%2F", "/v1/rerank", "/v1/rerank?a=%2F"),
        ("/v1/r%65rank", "/v1/rerank", "/v1/rerank"),
        ("/../../rerank", "/rerank", "/rerank"),
        ("/", "/", "/"),
        ("/v1/responses/resp%20x", "/v1/responses/resp x", "/v1/responses/resp%20x"),
    ],
)
def test_targets_are_normalized_as_vllm_routes_them(raw: str, path: str, sent: str) -> None:
    """Percent-decoding, dot-segment removal (RFC 3986 5.2.4) and one trailing slash
    dropped: the path routed is the path sent, the query untouched."""
    target = normalize(raw)
    assert (target.path, target.sent) == (path, sent)


@pytest.mark.parametrize(
    "raw", ["//v1/rerank", "/v1//rerank", "/v1/%252e%252e/rerank", "/v1/re%00rank", "/a\\b", "x"]
)
def test_targets_no_route_could_mean_are_refused(raw: str) -> None:
    """Empty segments, double encoding, control characters, backslashes and non-origin
    forms have no reading vLLM would serve as an endpoint: refused before forwarding."""
    with pytest.raises(BadTarget):
        normalize(raw)


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "v1", "%2e"]), max_size=8))
def test_normalizing_twice_changes_nothing(segments: list[str]) -> None:
    """A normalized target is its own normal form: the path routed and the path sent
    agree however often it is read, and it holds no dot segment."""
    try:
        target = normalize("/" + "/".join(segments))
    except BadTarget:
        return
    again = normalize(target.sent)
    assert (again.path, again.sent) == (target.path, target.sent)
    assert "/./" not in target.path + "/"
    assert "/../" not in target.path + "/"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a/b/c/./../../g", "/a/g"),
        ("/mid/content=5/../6", "/mid/6"),
        ("/..", "/"),
        ("/a/.", "/a/"),
    ],
)
def test_dot_segments_are_removed_as_rfc_3986_says(path: str, expected: str) -> None:
    """The examples of RFC 3986 section 5.2.4 (and its edge cases)."""
    assert remove_dot_segments(path) == expected


def test_a_refused_target_is_refused_every_time() -> None:
    """Targets are remembered once read (``normalize`` is cached); a refused one is not:
    the second request with it is refused as the first was, and a good target read
    before or after it is unaffected."""
    assert normalize("/v1/./embeddings").path == "/v1/embeddings"
    for _ in range(2):
        with pytest.raises(BadTarget, match="empty segment"):
            normalize("/v1//embeddings")
    assert normalize("/v1/./embeddings") == normalize("/v1/embeddings")

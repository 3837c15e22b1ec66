"""Answers that try to bill wrongly: duplicate or out-of-range usage, 2xx error bodies,
compressed or unknown encodings, and headers forged in the proxy's name."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import pytest

from proxy.serving.keys import METRICS
from proxy.wire.usage import MAX_TOKENS
from tests.support.records import journal_records
from tests.support.texts import RERANK


def tamper_usage(usage: str) -> Any:
    def tamper(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        text = body.decode()
        start = text.index('"usage":')
        end = text.index("}", start) + 1
        return (text[:start] + usage + text[end:]).encode(), headers

    return tamper


async def test_duplicate_usage_keys_are_not_billed_as_the_first(
    open_proxy: Any, tmp_path: Path
) -> None:
    """Regression: billed 999,999 (the first usage) while every JSON client read 25."""
    fake, client = open_proxy
    fake.tamper = tamper_usage(
        '"usage":{"prompt_tokens":999999,"total_tokens":999999},'
        '"usage":{"prompt_tokens":25,"total_tokens":25}'
    )
    resp = await client.post("/rerank", json=RERANK)
    assert resp.status == 200
    assert (await resp.json())["usage"]["prompt_tokens"] == 25  # body as vLLM sent it
    assert resp.headers["x-usage-verdict"] == "invalid"
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.verdict, record.prompt_tokens_billed) == ("invalid", None)


@pytest.mark.parametrize(
    ("value", "billed"),
    [
        ("3000000000", 3_000_000_000),
        (str(MAX_TOKENS), MAX_TOKENS),
        ("100000000000000000000000", None),
        ("-1", None),
        ("25.0", None),
        ('"25"', None),
        ("NaN", None),
        ("true", None),
    ],
)
@pytest.mark.parametrize("path", ["/rerank", "/v1/embeddings"])
async def test_usage_out_of_range_is_invalid_never_a_500(
    open_proxy: Any, tmp_path: Path, value: str, billed: int | None, path: str
) -> None:
    """Regression: a negative count gave the client a 500; 3e9 blocked the ledger."""
    fake, client = open_proxy
    fake.tamper = tamper_usage(f'"usage":{{"prompt_tokens":{value},"total_tokens":{value}}}')
    body = RERANK if path == "/rerank" else {"input": "hello"}
    resp = await client.post(path, json=body)
    assert resp.status == 200
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert record.prompt_tokens_billed == billed
    assert record.verdict != "invalid" if billed is not None else record.verdict == "invalid"
    invalid = client.app[METRICS].invalid_usage.labels(path)._value.get()
    assert invalid == (0 if billed is not None else 1)


@pytest.mark.parametrize(
    "error",
    [
        '"error":{"message":"boom","type":"BadRequestError","param":null,"code":400}',
        '"object":"error","message":"The model does not support Score API"',
    ],
)
async def test_2xx_error_body_with_usage_is_not_billed(
    open_proxy: Any, tmp_path: Path, error: str
) -> None:
    """Regression: a 200 whose body is an error but carries usage was billed."""
    fake, client = open_proxy
    fake.tamper = tamper_usage(error + ',"usage":{"prompt_tokens":25,"total_tokens":25}')
    for path, body in (("/rerank", RERANK), ("/v1/embeddings", {"input": "x"})):
        assert (await client.post(path, json=body)).status == 200
    assert journal_records(tmp_path / "journal.sqlite") == []


@pytest.mark.parametrize("coding", ["gzip", "deflate", "identity"])
@pytest.mark.parametrize("path", ["/rerank", "/v1/embeddings", "/v1/chat/completions"])
async def test_compressed_answers_are_billed(
    open_proxy: Any, tmp_path: Path, coding: str, path: str
) -> None:
    """Regression: any Content-Encoding (even identity) meant no record at all."""
    fake, client = open_proxy
    compress = {"gzip": gzip.compress, "deflate": zlib.compress, "identity": lambda b: b}

    def tamper(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        return compress[coding](body), {**headers, "Content-Encoding": coding}

    fake.tamper = tamper
    body = {
        "/rerank": RERANK,
        "/v1/embeddings": {"input": "x"},
        "/v1/chat/completions": {"messages": []},
    }[path]
    resp = await client.post(path, json=body, headers={"Accept-Encoding": "gzip, br"})
    assert resp.status == 200
    assert "usage" in await resp.json()
    assert len(journal_records(tmp_path / "journal.sqlite")) == 1
    assert fake.seen_headers[-1]["Accept-Encoding"] == "identity"


async def test_unknown_encoding_is_passed_on_and_flagged(open_proxy: Any, tmp_path: Path) -> None:
    """A coding the proxy cannot read: the client gets the bytes as sent, the record is
    invalid (nothing billed), never silently missing."""
    fake, client = open_proxy

    def tamper(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        return b"\x00opaque", {**headers, "Content-Encoding": "x-snappy"}

    fake.tamper = tamper
    resp = await client.post("/v1/embeddings", json={"input": "x"})
    assert resp.headers["Content-Encoding"] == "x-snappy"
    assert await resp.read() == b"\x00opaque"
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert record.verdict == "invalid"


@pytest.mark.parametrize("path", ["/rerank", "/v1/embeddings", "/echo/x"])
async def test_upstream_cannot_forge_the_proxys_headers(open_proxy: Any, path: str) -> None:
    """Regression: the upstream's own x-usage-* and x-litellm-* reached the client."""
    fake, client = open_proxy

    def tamper(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        forged = {
            "x-usage-verdict": "exact",
            "x-usage-engine-prompt-tokens": "1",
            "x-litellm-response-cost": "0",
        }
        return body, {**headers, **forged}

    fake.tamper = tamper
    body = RERANK if path == "/rerank" else {"input": "x"}
    resp = await client.post(path, json=body)
    assert "x-litellm-response-cost" not in resp.headers
    assert resp.headers.get("x-usage-engine-prompt-tokens") != "1"
    if path == "/rerank":
        assert resp.headers["x-usage-verdict"] == "corrected"
    else:
        assert "x-usage-verdict" not in resp.headers

"""Billing integrity (issue #10): every request billed once, to the right tenant, whatever
the client or the upstream sends. Each test reproduces one reported case."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from proxy.ledger.journal_files import read_journal
from proxy.ledger.records import UsageRecord
from proxy.serving.catalog import CATALOG
from proxy.serving.keys import METRICS
from proxy.serving.tenancy import key_digest
from proxy.serving.upstream import SESSION
from proxy.wire.usage import MAX_TOKENS
from scripts.vllm_cpu import free_port
from tests.conftest import fake_and_proxy

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "The Eiffel Tower is in Paris.", "Berlin is in Germany."]
RERANK = {"query": QUERY, "documents": DOCS}
ACME = {"Authorization": "Bearer sk-acme"}
BETA = {"Authorization": "Bearer sk-beta"}


def records(path: Path) -> list[UsageRecord]:
    return [UsageRecord.from_json(b) for b in read_journal(path)]


@pytest.fixture
async def keyed(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path) -> Any:
    """Proxy with a key map (acme, beta) and a tenant header that must not matter."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-acme')}\nbeta: {key_digest('sk-beta')}\n")
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        api_keys=keys,
        tenant_header="X-Tenant-Id",
        metrics_tenant_label=True,
        metrics_max_tenants=1,
        admin_port=free_port(),  # tenant labels are never served on the main port
        admin_host="127.0.0.1",
    )
    return fake, client, tmp_path / "journal.sqlite"


@pytest.fixture
async def open_proxy(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    """Proxy without keys: a gateway in front sets X-Tenant-Id."""
    return await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tenant_header="X-Tenant-Id"
    )


# --- 1. record ids are the proxy's ------------------------------------------------------


async def test_repeated_client_request_id_gives_one_record_per_exchange(keyed: Any) -> None:
    """Regression: five calls with X-Request-Id: fixed-id gave one record."""
    fake, client, journal = keyed
    ids = []
    for _ in range(5):
        resp = await client.post(
            "/rerank", json=RERANK, headers={**ACME, "X-Request-Id": "fixed-id"}
        )
        assert resp.status == 200
        ids.append(resp.headers["x-usage-record-id"])
    got = records(journal)
    assert [r.record_id for r in got] == ids
    assert len(set(ids)) == 5
    assert sorted(ids) == ids  # UUIDv7: time-ordered
    assert {r.client_request_id for r in got} == {"fixed-id"}
    assert [h.get("X-Request-Id") for h in fake.seen_headers] == ["fixed-id"] * 5


async def test_another_tenants_request_id_cannot_drop_a_record(keyed: Any) -> None:
    """Regression: an old id of another tenant made INSERT OR IGNORE drop the new record."""
    _, client, journal = keyed
    await client.post("/rerank", json=RERANK, headers={**ACME, "X-Request-Id": "r-1"})
    await client.post("/rerank", json=RERANK, headers={**BETA, "X-Request-Id": "r-1"})
    assert [r.tenant for r in records(journal)] == ["acme", "beta"]


# --- 2. the key decides -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "tenant"),
    [
        ({**ACME, "X-Tenant-Id": "beta"}, 200, "acme"),
        ({"X-Tenant-Id": "beta"}, 401, None),
        ({"Authorization": "Bearer sk-unknown", "X-Tenant-Id": "beta"}, 401, None),
        ({**ACME, "X-Tenant-Id": "beta", "Connection": "X-Tenant-Id"}, 200, "acme"),
    ],
)
async def test_key_decides_the_tenant(
    keyed: Any, headers: dict[str, str], status: int, tenant: str | None
) -> None:
    """Regression: the header picked the tenant although keys were configured, and a
    request without a known key was forwarded and billed to anonymous."""
    fake, client, journal = keyed
    resp = await client.post("/rerank", json=RERANK, headers=headers)
    assert resp.status == status
    if status == 401:
        assert await resp.json() == {"error": "Unauthorized"}  # vLLM's own shape
        assert fake.raw_bodies == []  # never forwarded
        assert records(journal) == []
    else:
        assert [r.tenant for r in records(journal)] == [tenant]


async def test_probes_need_no_key(keyed: Any) -> None:
    """Health, readiness and the upstream's /health stay reachable without a key."""
    _, client, _ = keyed
    for path in ("/healthz", "/readyz", "/health", "/metrics"):
        assert (await client.get(path)).status == 200, path


async def test_key_map_tenants_are_never_folded_into_other(keyed: Any) -> None:
    """With --metrics-max-tenants 1, both key-map tenants keep their own label."""
    _, client, _ = keyed
    await client.post("/rerank", json=RERANK, headers=ACME)
    await client.post("/rerank", json=RERANK, headers=BETA)
    text = client.app[METRICS].render().decode()
    assert 'tenant="acme"' in text
    assert 'tenant="beta"' in text
    assert 'tenant="other"' not in text


@pytest.mark.parametrize(
    ("value", "problem"),
    [("", "is empty"), ("x" * 201, "longer than 200"), ("a\tb", "not printable")],
)
async def test_bad_tenant_header_is_refused(open_proxy: Any, value: str, problem: str) -> None:
    """Regression: an empty value became anonymous, a long one was cut to 200 chars."""
    fake, client = open_proxy
    resp = await client.post("/rerank", json=RERANK, headers={"X-Tenant-Id": value})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert problem in error["message"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert fake.raw_bodies == []


async def test_tenant_header_listed_in_connection_is_not_trusted(
    open_proxy: Any, tmp_path: Path
) -> None:
    """Regression: `Connection: X-Tenant-Id` still attributed to the named tenant."""
    _, client = open_proxy
    headers = {"X-Tenant-Id": "tenant-b", "Connection": "X-Tenant-Id"}
    assert (await client.post("/rerank", json=RERANK, headers=headers)).status == 200
    assert [r.tenant for r in records(tmp_path / "journal.sqlite")] == ["anonymous"]


# --- 3. header bytes --------------------------------------------------------------------


async def raw_post(port: int, path: str, headers: bytes, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + headers
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return data


@pytest.mark.parametrize("stream", [False, True])
async def test_latin1_request_id_costs_neither_status_nor_record(
    open_proxy: Any, tmp_path: Path, stream: bool
) -> None:
    """Regression: a latin-1 byte in X-Request-Id gave a 500 and no record (and a streamed
    chat lost its [DONE])."""
    _, client = open_proxy
    port = client.server.port
    if stream:
        body = json.dumps({"stream": True, "messages": []}).encode()
        answer = await raw_post(port, "/v1/chat/completions", b"X-Request-Id: caf\xe9\r\n", body)
        assert b"data: [DONE]" in answer
    else:
        answer = await raw_post(
            port, "/rerank", b"X-Request-Id: caf\xe9\r\n", json.dumps(RERANK).encode()
        )
    assert answer.startswith(b"HTTP/1.1 200")
    (record,) = records(tmp_path / "journal.sqlite")
    assert record.client_request_id == "caf?"


async def test_latin1_tenant_header_is_a_clear_400(open_proxy: Any) -> None:
    """A tenant name that is not UTF-8 is refused before forwarding, never a 500."""
    fake, client = open_proxy
    answer = await raw_post(
        client.server.port, "/rerank", b"X-Tenant-Id: caf\xe9\r\n", json.dumps(RERANK).encode()
    )
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"not printable UTF-8" in answer
    assert fake.raw_bodies == []


async def test_latin1_bearer_key_is_refused_not_crashed(keyed: Any) -> None:
    """An undecodable key byte is hashed as sent: unknown key, vLLM's 401."""
    _, client, _ = keyed
    answer = await raw_post(
        client.server.port,
        "/rerank",
        b"Authorization: Bearer sk-acm\xe9\r\n",
        json.dumps(RERANK).encode(),
    )
    assert answer.startswith(b"HTTP/1.1 401")


# --- 4. lax stream flags ----------------------------------------------------------------


@pytest.mark.parametrize("stream", ["true", 1, "1"])
async def test_lax_stream_flag_is_metered(open_proxy: Any, tmp_path: Path, stream: Any) -> None:
    """Regression: "stream": "true" or 1 streamed without include_usage: no record."""
    _, client = open_proxy
    resp = await client.post("/v1/chat/completions", json={"stream": stream, "messages": []})
    text = await resp.text()
    assert text.endswith("data: [DONE]\n\n")
    assert '"usage"' not in text
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)


async def test_batch_chat_is_metered(open_proxy: Any, tmp_path: Path) -> None:
    """Regression: vLLM 0.32.0's ``/v1/chat/completions/batch`` (N conversations, one
    usage summing them) was relayed without a record: engine work for free."""
    _, client = open_proxy
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]
    resp = await client.post("/v1/chat/completions/batch", json={"messages": conversations})
    assert resp.status == 200
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.operation, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "chat",
        5,
        3,
    )
    assert resp.headers["x-usage-record-id"] == record.record_id


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_messages_and_responses_are_metered(
    open_proxy: Any, tmp_path: Path, path: str, stream: bool
) -> None:
    """Regression: the Anthropic Messages and Responses APIs (in every supported release)
    were relayed without a record, so a tenant could generate for free by switching API.
    Their usage (``input_tokens``/``output_tokens``; Messages reports the cached part of
    the prompt apart) is billed as the engine's prompt and completion, and a stream's
    last event is released once the record is committed."""
    fake, client = open_proxy
    body = {"model": "minilm", "stream": stream, "max_tokens": 8}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if path == "/v1/messages" else {}
    body |= {"input": "hi"} if path == "/v1/responses" else {}
    resp = await client.post(path, json=body)
    assert resp.status == 200
    text = await resp.text()
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.operation, record.verdict) == (path.rsplit("/", 1)[1], "reported")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (12, 3)
    assert fake.prompt_tokens_total == 12  # what the engine's counter says
    if stream:
        last = "message_stop" if path == "/v1/messages" else "response.completed"
        assert text.rstrip().split("\n\n")[-1].startswith(f"event: {last}")
    else:
        assert resp.headers["x-usage-record-id"] == record.record_id


async def test_structured_decisions_are_metered(open_proxy: Any, tmp_path: Path) -> None:
    """Regression: vLLM 0.32.0's ``/v1/systemone`` (structured decisions, its usage as
    ``input_tokens``/``output_tokens``) was relayed without a record."""
    _, client = open_proxy
    resp = await client.post("/v1/systemone", json={"model": "minilm", "state": "s"})
    assert resp.status == 200
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.operation, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "decisions",
        12,
        3,
    )


async def test_a_background_response_is_recorded_not_billed(
    open_proxy: Any, tmp_path: Path
) -> None:
    """A background Responses request is answered ``queued`` at once, with no usage: the
    engine's work is never in an answer the proxy sees. It is recorded ``invalid``
    (flagged, billed nothing, tenant known) rather than not at all."""
    _, client = open_proxy
    body = {"model": "minilm", "input": "hi", "background": True, "store": True}
    resp = await client.post("/v1/responses", json=body, headers={"X-Tenant-Id": "acme"})
    assert resp.status == 200
    assert (await resp.json())["status"] == "queued"
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.operation, record.verdict, record.tenant) == ("responses", "invalid", "acme")
    assert record.prompt_tokens_billed is None


# --- 5. clients that hang up ------------------------------------------------------------


async def test_client_disconnect_mid_stream_is_still_billed(
    open_proxy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a client that read 19 of 20 events and left got no record, and the log
    blamed the upstream."""
    fake, client = open_proxy
    fake.chunks, fake.delay = 20, 0.02
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    body = json.dumps({"stream": True, "messages": []}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    seen = b""
    while seen.count(b"data: ") < 5:
        seen += await reader.read(1024)
    writer.close()
    journal = tmp_path / "journal.sqlite"
    for _ in range(200):
        if read_journal(journal):
            break
        await asyncio.sleep(0.02)
    (record,) = records(journal)
    assert record.aborted
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (5, 3)
    assert client.app[METRICS].aborted.labels("/v1/chat/completions")._value.get() == 1


# --- 6. /invocations --------------------------------------------------------------------


async def test_invocations_are_labelled_like_the_direct_endpoints(
    open_proxy: Any, tmp_path: Path
) -> None:
    """Regression: an embeddings body had model null and verdict unaudited; score and
    rerank bodies had operation other."""
    _, client = open_proxy
    assert (await client.post("/invocations", json=RERANK)).status == 200
    score = {"text_1": QUERY, "text_2": DOCS}
    assert (await client.post("/invocations", json=score)).status == 200
    embed = {"input": ["hello world", "bye"]}
    assert (await client.post("/invocations", json=embed)).status == 200
    got = [
        (r.operation, r.model, r.verdict, r.prompt_tokens_billed)
        for r in records(tmp_path / "journal.sqlite")
    ]
    assert got == [
        ("rerank", "minilm", "corrected", 36),
        ("score", "minilm", "corrected", 36),
        ("embeddings", "minilm", "reported", 7),
    ]


@pytest.mark.parametrize(
    ("target", "operation", "verdict", "billed"),
    [
        ("/v1%2Frerank", "rerank", "corrected", 36),
        ("/v2%2frerank", "rerank", "corrected", 36),
        ("/v1%2Fscore", "score", "corrected", 36),
        ("/v1%2Fembeddings", "embeddings", "reported", 7),
    ],
)
async def test_encoded_slashes_are_routed_as_vllm_routes_them(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    target: str,
    operation: str,
    verdict: str,
    billed: int,
) -> None:
    """Regression: vLLM's server decodes ``%2F`` before routing, aiohttp's router does
    not; ``POST /v1%2Frerank`` was relayed, served by vLLM and never recorded (free)."""
    seen: list[str] = []

    @web.middleware
    async def targets(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request.raw_path)
        return await handler(request)  # type: ignore[no-any-return]

    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(targets,)
    )
    body = {
        "rerank": RERANK,
        "score": {"text_1": QUERY, "text_2": DOCS},
        "embeddings": {"input": ["hello world", "bye"]},
    }[operation]
    resp = await client.post(URL(target, encoded=True), json=body)
    assert resp.status == 200
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.operation, record.verdict, record.prompt_tokens_billed) == (
        operation,
        verdict,
        billed,
    )
    assert seen[-1].upper() == target.upper()  # forwarded unchanged (%2f and %2F are one)


# --- 7. the default model ---------------------------------------------------------------


@pytest.mark.parametrize("model", ["", None, "absent"])
async def test_default_model_is_audited(open_proxy: Any, tmp_path: Path, model: Any) -> None:
    """Regression: "model": "" (vLLM's default, 200) was unaudited and billed 57."""
    fake, client = open_proxy
    fake.aliases = ("second-name",)
    await client.app[CATALOG].refresh(client.app[SESSION])
    body = dict(RERANK) if model == "absent" else {**RERANK, "model": model}
    resp = await client.post("/rerank", json=body)
    assert resp.headers["x-usage-verdict"] == "corrected"
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record.model, record.prompt_tokens_billed) == ("minilm", 36)


# --- 8, 9, 12. odd usage ----------------------------------------------------------------


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
    (record,) = records(tmp_path / "journal.sqlite")
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
    (record,) = records(tmp_path / "journal.sqlite")
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
    assert records(tmp_path / "journal.sqlite") == []


# --- 10. compressed answers -------------------------------------------------------------


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
    assert len(records(tmp_path / "journal.sqlite")) == 1
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
    (record,) = records(tmp_path / "journal.sqlite")
    assert record.verdict == "invalid"


# --- 11. forged proxy headers -----------------------------------------------------------


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

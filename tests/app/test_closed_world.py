"""Closed world (issue #26): nothing reaches the engine unless it is metered, free by
design, or relayed by an explicit, counted opt-in; the upstream's address never leaks.

Each test was a way to make the engine work for free on the proxy before the route table
became the engine's own and targets were normalized as vLLM's router reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from proxy.ledger.journal_files import read_journal
from proxy.serving.keys import METRICS
from scripts.vllm_cpu import free_port
from tests.support.proxies import fake_and_proxy

RERANK = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
EMBED = {"input": ["Paris is in France.", "Berlin is in Germany."]}


# What the proxy reads of the upstream on its own (discovery, the reconciler's counters),
# whenever its timers say: not a client's request, and not in the tests' count.
OWN_READS = {"/version", "/v1/models", "/openapi.json", "/metrics"}


def seen_by_upstream(paths: list[str]) -> Any:
    """A middleware for the fake vLLM: what request targets of clients reach it."""

    @web.middleware
    async def seen(request: web.Request, handler: Any) -> web.StreamResponse:
        if not (request.method == "GET" and request.raw_path in OWN_READS):
            paths.append(request.raw_path)
        return await handler(request)  # type: ignore[no-any-return]

    return seen


def records(journal: Path) -> list[dict[str, Any]]:
    return [json.loads(body) for body in read_journal(journal)]


async def post_raw(client: Any, raw: str, body: Any) -> Any:
    """POST to a request target exactly as written (no client-side normalization)."""
    url = URL(str(client.make_url("")).rstrip("/") + raw, encoded=True)
    return await client.session.post(url, json=body)


@pytest.fixture
async def rig(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    paths: list[str] = []
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(seen_by_upstream(paths),)
    )
    return fake, client, paths


@pytest.mark.parametrize(
    ("raw", "body", "endpoint"),
    [
        ("/x/../v1/chat/completions", CHAT, "/v1/chat/completions"),
        ("/v1/./chat/completions", CHAT, "/v1/chat/completions"),
        ("/v1/%2e/chat/completions", {**CHAT, "stream": True}, "/v1/chat/completions"),
        ("/v1/%2E%2E/v1/embeddings", EMBED, "/v1/embeddings"),
        ("/./rerank", RERANK, "/rerank"),
        ("/v1/rerank/", RERANK, "/v1/rerank"),
        ("/v1%2Frerank", RERANK, "/v1/rerank"),
    ],
)
async def test_the_path_metered_is_the_path_served(
    rig: Any, tmp_path: Path, raw: str, body: Any, endpoint: str
) -> None:
    """Regression: a target with dot segments, encoded dots or slashes, or a trailing
    slash was relayed unmetered while the upstream served the endpoint it normalizes to.
    Now it is routed and forwarded as that endpoint, and billed as it."""
    _, client, paths = rig
    resp = await post_raw(client, raw, body)
    await resp.read()
    assert resp.status == 200
    assert "Location" not in resp.headers
    assert paths[-1] == endpoint  # the upstream was sent the normalized target
    (record,) = records(tmp_path / "journal.sqlite")
    assert record["endpoint"] == endpoint
    assert record["prompt_tokens_billed"] > 0
    assert resp.headers.get("x-usage-record-id", record["record_id"]) == record["record_id"]


@pytest.mark.parametrize(
    ("method", "raw", "status"),
    [
        ("POST", "/cohere/v2/chat", 403),
        ("POST", "/v1/load_lora_adapter", 403),
        ("POST", "/sleep", 403),
        ("POST", "/no/such/endpoint", 404),
        ("POST", "/v1/%2e%2e/v2/unknown", 404),
        ("GET", "/v1/rerank", 405),
        ("POST", "//v1/rerank", 400),
        ("POST", "/v1/%252e%252e/rerank", 400),
    ],
)
async def test_what_cannot_be_metered_never_reaches_the_engine(
    rig: Any, tmp_path: Path, method: str, raw: str, status: int
) -> None:
    """Regression: audio, engine control and unknown paths were relayed as they came
    (audio is metered now: tests/app/test_audio.py, tests/app/test_realtime.py).
    Refused in vLLM's error shape, with the setting that would relay them, and the
    upstream never sees them."""
    _, client, paths = rig
    before = len(paths)
    url = URL(str(client.make_url("")).rstrip("/") + raw, encoded=True)
    resp = await client.session.request(method, url, data=b"{}")
    error = (await resp.json())["error"]
    assert resp.status == status
    assert error["code"] == status
    assert len(paths) == before
    assert records(tmp_path / "journal.sqlite") == []


async def test_an_operator_may_relay_a_refused_route_unmetered_and_it_is_counted(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """--allow-unmetered relays exactly the routes it names, each use counted."""
    paths: list[str] = []
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(seen_by_upstream(paths),),
        allow_unmetered="/v1/load_lora_adapter",
    )
    resp = await client.post("/v1/load_lora_adapter", json={})
    assert resp.status == 404  # the fake serves no adapters: vLLM's own answer
    assert paths[-1] == "/v1/load_lora_adapter"
    assert (await client.post("/sleep", json={})).status == 403
    metric = client.app[METRICS].unmetered.labels("/v1/load_lora_adapter")
    assert metric._value.get() == 1


def tensors_answer(usage: dict[str, int]) -> Any:
    """The fake's embeddings as vLLM answers ``encoding_format: bytes`` (raw tensors, the
    usage in a ``metadata`` header) and ``bytes_only`` (no usage anywhere)."""

    @web.middleware
    async def bytes_answer(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path not in ("/v1/embeddings", "/pooling", "/invocations"):
            return await handler(request)  # type: ignore[no-any-return]
        body = json.loads(await request.read())
        if body.get("encoding_format") not in ("bytes", "bytes_only"):
            return await handler(request)  # type: ignore[no-any-return]
        metadata = {"id": "embd-1", "created": 1, "model": "minilm", "data": [], "usage": usage}
        headers = {"metadata": json.dumps(metadata)}
        if body["encoding_format"] == "bytes_only":
            headers = {}
        reply = web.StreamResponse(headers={"Content-Type": "application/octet-stream", **headers})
        await reply.prepare(request)
        await reply.write(b"\x00" * 64)
        await reply.write_eof()
        return reply

    return bytes_answer


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling", "/invocations"])
async def test_bytes_embeddings_are_billed_from_their_metadata(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, path: str
) -> None:
    """Regression: an embeddings answer as raw bytes had no JSON usage and was recorded
    nowhere. Its usage is in vLLM's ``metadata`` header: billed from there, the tensors
    passed on untouched."""
    usage = {"prompt_tokens": 17, "total_tokens": 17}
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(tensors_answer(usage),)
    )
    resp = await client.post(path, json={**EMBED, "encoding_format": "bytes"})
    assert resp.status == 200
    assert await resp.read() == b"\x00" * 64
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record["prompt_tokens_billed"], record["verdict"]) == (17, "reported")
    assert resp.headers["x-usage-record-id"] == record["record_id"]


async def test_bytes_only_embeddings_are_refused_unless_allowed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """``bytes_only`` answers carry no usage at all: refused by default (400 naming the
    setting), relayed and counted when the operator allows it."""
    usage = {"prompt_tokens": 17, "total_tokens": 17}
    middlewares = (tensors_answer(usage),)
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=middlewares
    )
    resp = await client.post("/v1/embeddings", json={**EMBED, "encoding_format": "bytes_only"})
    assert resp.status == 400
    assert "--allow-unmetered embeddings.bytes_only" in (await resp.json())["error"]["message"]
    _, allowed = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=middlewares,
        allow_unmetered="embeddings.bytes_only",
    )
    resp = await allowed.post("/v1/embeddings", json={**EMBED, "encoding_format": "bytes_only"})
    assert (resp.status, await resp.read()) == (200, b"\x00" * 64)
    assert allowed.app[METRICS].unmetered.labels("embeddings.bytes_only")._value.get() == 1
    assert records(tmp_path / "journal.sqlite") == []


async def test_background_responses_are_refused_unless_allowed(rig: Any, tmp_path: Path) -> None:
    """Regression: a background response was answered at once with no usage and its
    result fetched later with no record: the engine's work was free. Refused by default."""
    _, client, paths = rig
    before = len(paths)
    body = {"model": "minilm", "input": "hi", "background": True}
    resp = await client.post("/v1/responses", json=body)
    assert resp.status == 400
    assert "responses.background" in (await resp.json())["error"]["message"]
    assert len(paths) == before


def generate_answer() -> Any:
    """vLLM's token-in/token-out endpoint (scale-out): usage as a completion's."""

    @web.middleware
    async def generate(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/inference/v1/generate":
            return await handler(request)  # type: ignore[no-any-return]
        body = json.loads(await request.read())
        prompt = len(body["token_ids"])
        usage = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}
        answer = {"request_id": "r", "choices": [{"index": 0, "token_ids": [1, 2, 3]}]}
        return web.json_response({**answer, "usage": usage})

    return generate


async def test_token_generation_is_metered(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: /inference/v1/generate was relayed with no record."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(generate_answer(),)
    )
    body = {"token_ids": [5, 6, 7, 8], "sampling_params": {"max_tokens": 3}}
    resp = await client.post("/inference/v1/generate", json=body)
    assert resp.status == 200
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record["operation"], record["prompt_tokens_billed"]) == ("generate", 4)
    assert record["completion_tokens_billed"] == 3


def redirects_to_itself() -> Any:
    """An upstream that redirects with its own absolute address, as vLLM's FastAPI app
    does for a trailing slash (built from the Host it was sent)."""

    @web.middleware
    async def redirect(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/v1/models" or "go" not in request.query:
            return await handler(request)  # type: ignore[no-any-return]
        target = f"http://{request.host}/v1/models"
        return web.Response(status=307, headers={"Location": target})

    return redirect


async def test_a_redirect_never_names_the_upstream(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Regression: the client received ``Location: http://<upstream address>/...``; a
    client following it bypassed the proxy. The location is now a path on the proxy, and
    the proxy does not follow it itself."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(redirects_to_itself(),)
    )
    resp = await client.get("/v1/models?go=1", allow_redirects=False)
    assert resp.status == 307
    assert resp.headers["Location"] == "/v1/models"


async def test_engine_metrics_stay_private_behind_an_admin_port(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Regression: with --admin-port, GET /metrics on the main port was relayed to vLLM
    without a key (its per-model token totals, to anyone). Now refused, as is every other
    spelling of it; without an admin port /metrics is the proxy's own."""
    paths: list[str] = []
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(seen_by_upstream(paths),),
        admin_port=free_port(),
    )
    before = len(paths)
    for raw in ("/metrics", "/metrics/", "/./metrics", "/metricsx"):
        url = URL(str(client.make_url("")).rstrip("/") + raw, encoded=True)
        resp = await client.session.get(url)
        assert resp.status == 404, raw
        assert "vllm:" not in await resp.text()
    assert len(paths) == before


def answers_without_usage() -> Any:
    """The fake answers /pooling as an IO-processor plugin does (no usage) and
    /invocations with raw tensors but no metadata header."""

    @web.middleware
    async def no_usage(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/pooling":
            return web.json_response({"id": "pool-1", "data": [{"output": [1, 2]}]})
        if request.path == "/invocations":
            return web.Response(body=b"\x00" * 16, content_type="application/octet-stream")
        return await handler(request)  # type: ignore[no-any-return]

    return no_usage


@pytest.mark.parametrize("path", ["/pooling", "/invocations"])
async def test_a_successful_metered_answer_without_usage_is_recorded(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, path: str
) -> None:
    """Found in review: a 2xx metered answer with no usage in it (an IO-processor
    plugin's pooling, tensors without their metadata) left no record at all. It is
    recorded ``invalid``: billed nothing, but the engine's work shows."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(answers_without_usage(),)
    )
    resp = await client.post(path, json={"input": ["x"], "encoding_format": "float"})
    assert resp.status == 200
    (record,) = records(tmp_path / "journal.sqlite")
    assert (record["verdict"], record["prompt_tokens_billed"]) == ("invalid", None)
    assert resp.headers["x-usage-record-id"] == record["record_id"]


async def test_invocations_read_the_model_as_vllm_does_and_refuse_bytes_only_anyway(
    rig: Any, tmp_path: Path
) -> None:
    """Found in review: vLLM's /invocations takes the model from the SageMaker adapter
    header over the body's, and may read a chat-looking body as an embedding request, so
    ``bytes_only`` (no usage) got past a check keyed on the operation. It is refused
    whatever the body looks like, and the header's model is the one billed."""
    _, client, paths = rig
    before = len(paths)
    body = {"model": "nonexistent", "messages": [{"role": "user", "content": "hi"}]}
    adapter = {"X-Amzn-SageMaker-Adapter-Identifier": "minilm"}
    resp = await client.post(
        "/invocations", json={**body, "encoding_format": "bytes_only"}, headers=adapter
    )
    assert resp.status == 400
    assert len(paths) == before
    resp = await client.post(
        "/invocations", json={"input": ["x"], "model": "nope"}, headers=adapter
    )
    assert resp.status in (200, 404)
    for record in records(tmp_path / "journal.sqlite"):
        assert record["model"] == "minilm"


async def test_a_score_body_naming_two_input_pairs_is_refused_not_guessed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression (review): vLLM's ScoreRequest is a union tried in order, so a pair whose
    inputs do not validate (dicts without ``content``) is skipped for the next. The proxy
    took the first pair present: once three ordinary recounts had proven the model, a body
    whose ``queries``/``documents`` vLLM skips and whose ``text_1``/``text_2`` it scores was
    derived from the pair vLLM never ran: 263 billed where the engine processed 3,063.
    Such a body is refused before the engine sees it; one pair is served as before."""
    fake, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)
    documents = ["Paris is the capital and largest city of France."] * 3
    for _ in range(3):  # three full recounts prove the model: shortcuts become trusted
        resp = await client.post("/score", json={"queries": "capital?", "documents": documents})
        assert resp.headers["x-usage-verdict"] == "corrected"
    before, seen = fake.prompt_tokens_total, len(fake.raw_bodies)
    body = {
        "queries": "word " * 240,
        "documents": [{"not": "content"}] * 13,
        "text_1": "tiny",
        "text_2": ["Paris is the capital and largest city of France. " * 10] * 30,
    }
    for path in ("/score", "/v1/score", "/invocations"):
        resp = await client.post(path, json=body)
        assert resp.status == 400, path
        error = (await resp.json())["error"]
        assert "more than one request" in error["message"]
        assert error["code"] == 400
    assert (fake.prompt_tokens_total, len(fake.raw_bodies)) == (before, seen)
    assert len(records(tmp_path / "journal.sqlite")) == 3
    one_pair = {k: body[k] for k in ("text_1", "text_2")}
    resp = await client.post("/score", json={**one_pair, "queries": "only one member"})
    assert resp.status == 200
    billed = records(tmp_path / "journal.sqlite")[-1]["prompt_tokens_billed"]
    assert billed == fake.prompt_tokens_total - before


async def test_invocations_bill_the_model_vllm_serves_not_the_bodys(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression (review): from 0.11.1 vLLM's /invocations sets the body's ``model`` to
    the SageMaker adapter header, None without it, so the default model serves a body
    naming any other. The proxy recorded the body's name, and a rerank naming an unknown
    model was left unaudited and billed inflated (57 where the engine processed 36)."""
    fake, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)
    resp = await client.post("/invocations", json={"model": "free-tier-model", "input": ["x"]})
    assert resp.status == 200
    before = fake.prompt_tokens_total
    rerank = {**RERANK, "model": "free-tier-model"}
    resp = await client.post("/invocations", json=rerank)
    assert resp.status == 200
    assert resp.headers["x-usage-verdict"] == "corrected"
    embedded, reranked = records(tmp_path / "journal.sqlite")
    assert (embedded["model"], reranked["model"]) == ("minilm", "minilm")
    assert reranked["prompt_tokens_billed"] == fake.prompt_tokens_total - before

"""Integration: the proxy in front of a fake vLLM 0.29.0 / 0.32.0 using the real tokenizer."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.settings import Mode, Settings
from tests.support.fakevllm import FakeVLLM
from tests.support.proxies import FAKE_ROUTES
from tests.support.texts import DOCS, QUERY

Factory = Callable[..., Awaitable[tuple[FakeVLLM, TestClient[Any, Any]]]]


@pytest.fixture(scope="session")
def raw_minilm(minilm_path: Path) -> Any:
    """The raw transformers tokenizer for the fake server (not the proxy's adapter)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


@pytest.fixture(scope="session")
def cross_encoder_dir(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BertForSequenceClassification (num_labels=1) directory with the MiniLM tokenizer."""
    target = tmp_path_factory.mktemp("cross-encoder")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_path / name, target / name)
    config = json.loads((minilm_path / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], num_labels=1)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture
async def proxied(
    aiohttp_server: Any, aiohttp_client: Any, raw_minilm: Any, minilm_path: Path
) -> Factory:
    """Start a fake vLLM and the proxy in front of it; wait for model discovery."""

    async def start(
        version: str = "0.29.0",
        mode: Mode = Mode.REWRITE,
        root: Path | None = None,
        family: str = "bi-encoder",
        openapi: bool = True,
        **options: Any,
    ) -> tuple[FakeVLLM, TestClient[Any, Any]]:
        fake = FakeVLLM(
            raw_minilm, root or minilm_path, version=version, family=family, openapi=openapi
        )
        server = await aiohttp_server(fake.app())
        options.setdefault("allow_unmetered", FAKE_ROUTES)
        settings = Settings(upstream=str(server.make_url("")), mode=mode, **options)
        client = await aiohttp_client(create_app(settings))
        assert await client.app[CATALOG].wait_ready(10)
        return fake, client

    return start


async def post(client: TestClient[Any, Any], path: str, body: Any) -> tuple[int, Any, Any]:
    resp = await client.post(
        path, data=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    raw = await resp.read()
    return resp.status, resp.headers, raw


async def test_rerank_one_to_n_is_corrected_in_front_of_0_29(proxied: Factory) -> None:
    """The spec's worked example through the proxy: 57 reported, 36 billed, rest unchanged."""
    fake, client = await proxied("0.29.0")
    status, headers, raw = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200
    upstream = json.loads(fake.last_body)
    body = json.loads(raw)
    assert upstream["usage"] == {"prompt_tokens": 57, "total_tokens": 57}
    assert body["usage"] == {"prompt_tokens": 36, "total_tokens": 36}
    assert body["results"] == upstream["results"]
    assert list(body) == list(upstream)
    assert raw == fake.last_body.replace(
        b'"prompt_tokens":57,"total_tokens":57', b'"prompt_tokens":36,"total_tokens":36'
    )
    assert headers["x-usage-verdict"] == "corrected"
    assert headers["x-usage-upstream-prompt-tokens"] == "57"
    assert headers["x-usage-engine-prompt-tokens"] == "36"


SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("/score", {"text_1": QUERY, "text_2": DOCS[0]}),
    ("/v1/score", {"text_1": [QUERY], "text_2": DOCS}),
    ("/score", {"text_1": [QUERY, "Where is Berlin?"], "text_2": DOCS[:2]}),
    ("/score", {"data_1": QUERY, "data_2": DOCS}),
    ("/v1/score", {"queries": QUERY, "documents": DOCS}),
    ("/score", {"queries": [QUERY, "a", "b"], "items": DOCS}),
    ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1}),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS[0]}),
    ("/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}),
    ("/invocations", {"query": QUERY, "documents": DOCS}),
    ("/invocations", {"text_1": QUERY, "text_2": DOCS}),
    ("/rerank", {"query": QUERY, "documents": ["", "   ", "x" * 50]}),
    ("/rerank", {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 6}),
    ("/rerank", {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": -1}),
    (
        "/score",
        {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 5, "truncation_side": "left"},
    ),
    ("/score", {"text_1": QUERY, "text_2": DOCS, "padding": "max_length"}),
    (
        "/rerank",
        {"model": "minilm", "query": "안녕하세요 세계 🌍", "documents": ["éàü ßø", "日本語"]},
    ),
]


@pytest.mark.parametrize(("path", "body"), SHAPES)
async def test_rewrite_bills_what_the_engine_processed(
    proxied: Factory, path: str, body: dict[str, Any]
) -> None:
    """For every audited path and shape, rewrite mode returns the engine-level count."""
    fake, client = await proxied("0.29.0")
    before = fake.prompt_tokens_total
    status, headers, raw = await post(client, path, body)
    assert status == 200, raw
    engine = fake.prompt_tokens_total - before
    assert json.loads(raw)["usage"]["prompt_tokens"] == engine
    assert json.loads(raw)["usage"]["total_tokens"] == engine
    assert headers["x-usage-verdict"] == "corrected"
    assert fake.raw_bodies[-1] == json.dumps(body).encode()


@pytest.mark.parametrize(("path", "body"), SHAPES)
async def test_fixed_upstream_is_left_alone(
    proxied: Factory, path: str, body: dict[str, Any]
) -> None:
    """In front of 0.32.0 every verdict is exact and every body byte-identical."""
    fake, client = await proxied("0.32.0")
    status, headers, raw = await post(client, path, body)
    assert status == 200
    assert raw == fake.last_body
    assert headers["x-usage-verdict"] == "exact"
    assert headers["x-usage-engine-prompt-tokens"] == headers["x-usage-upstream-prompt-tokens"]


async def test_cross_encoder_is_exact_on_old_releases(
    proxied: Factory, cross_encoder_dir: Path
) -> None:
    """Cross-encoders were always right: 51 for the worked example, verdict exact."""
    fake, client = await proxied("0.29.0", root=cross_encoder_dir, family="cross-encoder")
    status, headers, raw = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200
    assert json.loads(raw)["usage"]["prompt_tokens"] == 51
    assert raw == fake.last_body
    assert headers["x-usage-verdict"] == "exact"


async def test_annotate_mode_keeps_reported_and_adds_fields(proxied: Factory) -> None:
    """annotate: usage keeps R and gains engine_prompt_tokens and usage_verdict."""
    fake, client = await proxied("0.29.0", mode=Mode.ANNOTATE)
    _, _, raw = await post(client, "/v1/score", {"text_1": QUERY, "text_2": DOCS})
    usage = json.loads(raw)["usage"]
    assert usage["prompt_tokens"] == 57
    assert usage["engine_prompt_tokens"] == 36
    assert usage["usage_verdict"] == "corrected"
    assert json.loads(raw)["data"] == json.loads(fake.last_body)["data"]


async def test_shadow_mode_leaves_the_body_untouched(proxied: Factory) -> None:
    """shadow: the body is exactly upstream's; only the x-usage headers are added."""
    fake, client = await proxied("0.29.0", mode=Mode.SHADOW)
    _, headers, raw = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
    assert raw == fake.last_body
    assert headers["x-usage-engine-prompt-tokens"] == "36"
    assert headers["x-usage-verdict"] == "corrected"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"text_1": [QUERY, "b"], "text_2": DOCS}, 400),
        ({"model": "nope", "query": QUERY, "documents": DOCS}, 404),
        ({"query": QUERY, "documents": ["word " * 400]}, 400),
        ({"query": QUERY, "documents": []}, 400),
        ({"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 9999}, 400),
    ],
)
async def test_errors_pass_through_untouched(
    proxied: Factory, body: dict[str, Any], status: int
) -> None:
    """Upstream errors reach the client as they are, without usage headers."""
    _fake, client = await proxied("0.29.0")
    got, headers, raw = await post(client, "/rerank", body)
    assert got == status
    assert json.loads(raw)["error"]["code"] == status
    assert "x-usage-verdict" not in headers


async def test_invalid_json_is_vllms_to_judge(proxied: Factory) -> None:
    """Bytes that are not JSON go upstream byte-identical and its 400 comes back."""
    fake, client = await proxied("0.29.0")
    resp = await client.post(
        "/v1/score", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert fake.raw_bodies[-1] == b"{not json"
    assert (await resp.json())["error"]["type"] == "BadRequestError"


async def test_ok_status_with_error_body_is_not_billed(proxied: Factory) -> None:
    """Releases up to 0.17 could answer an error with HTTP 200: no usage, no audit."""
    fake, client = await proxied("0.29.0")
    fake.ok_error = True
    status, headers, raw = await post(client, "/score", {"text_1": QUERY, "text_2": DOCS})
    assert status == 200
    assert raw == fake.last_body or json.loads(raw)["object"] == "error"
    assert "x-usage-verdict" not in headers


async def test_transparent_forwarding(proxied: Factory) -> None:
    """Method, query, end-to-end headers and body reach the upstream unchanged; the path
    as vLLM's router reads it (decoded, here ``%2F``, and re-encoded)."""
    _, client = await proxied()
    payload = b"\x00\x01binary" * 1000
    resp = await client.put(
        "/echo/a%2Fb/c?x=1&y=%C3%A9",
        data=payload,
        headers={
            "Authorization": "Bearer sk-test",
            "X-Request-Id": "req-42",
            "X-Custom": "kept",
            "Connection": "X-Hop",
            "X-Hop": "dropped",
        },
    )
    echo = await resp.json()
    assert resp.status == 200
    assert resp.headers["X-Upstream"] == "fake"
    assert echo["method"] == "PUT"
    assert echo["path_qs"] == "/echo/a/b/c?x=1&y=%C3%A9"
    assert echo["headers"]["authorization"] == "Bearer sk-test"
    assert echo["headers"]["x-request-id"] == "req-42"
    assert echo["headers"]["x-custom"] == "kept"
    assert "x-hop" not in echo["headers"]
    assert echo["body_len"] == len(payload)
    import hashlib

    assert echo["body_sha256"] == hashlib.sha256(payload).hexdigest()


async def test_sse_reaches_the_client_chunk_by_chunk(proxied: Factory) -> None:
    """The first SSE chunk arrives while the upstream still holds back the rest."""
    fake, client = await proxied()
    fake.gate = asyncio.Event()
    resp = await client.post("/v1/chat/completions", json={"stream": True, "messages": []})
    assert resp.status == 200
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
    assert first.startswith(b"data: ")
    assert b"t0" in first
    fake.gate.set()
    rest = await resp.content.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert b"t1" in rest
    assert b"t2" in rest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_upstream_is_502(aiohttp_client: Any) -> None:
    """No upstream listening: 502 in vLLM's error shape, for relayed and audited paths."""
    settings = Settings(
        upstream=f"http://127.0.0.1:{_free_port()}", connect_timeout=2, accounting_timeout=0.1
    )
    client = await aiohttp_client(create_app(settings))
    for method, path in (("GET", "/v1/models"), ("POST", "/rerank")):
        resp = await client.request(method, path, json={"query": "q", "documents": ["d"]})
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == 502
        assert error["type"] == "BadGatewayError"


async def test_upstream_timeout_is_504(proxied: Factory) -> None:
    """An upstream slower than --read-timeout: 504 in vLLM's error shape."""
    fake, client = await proxied(read_timeout=0.2)
    fake.delay = 2.0
    status, _, raw = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 504
    assert json.loads(raw)["error"]["type"] == "GatewayTimeoutError"


async def test_body_above_limit_is_413(proxied: Factory) -> None:
    """An audited body above --max-body-bytes gets a vLLM-shaped 413, nothing forwarded."""
    fake, client = await proxied(max_body_bytes=1024)
    status, _, raw = await post(client, "/rerank", {"query": QUERY, "documents": ["x" * 2000]})
    assert status == 413
    assert json.loads(raw)["error"]["code"] == 413
    assert fake.raw_bodies == []


async def test_unreadable_model_is_unaudited_but_served(proxied: Factory, tmp_path: Path) -> None:
    """No tokenizer at the model root: vLLM's answer goes through untouched, 'unaudited'."""
    fake, client = await proxied("0.29.0", root=tmp_path / "missing")
    status, headers, raw = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200
    assert raw == fake.last_body
    assert headers["x-usage-verdict"] == "unaudited"
    assert "x-usage-engine-prompt-tokens" not in headers


async def test_not_ready_server_health_passthrough(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    """Any unaudited path (here /health) is relayed even before discovery succeeds."""

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    server: TestServer = await aiohttp_server(app)
    settings = Settings(upstream=str(server.make_url("")), accounting_timeout=0.1)
    client = await aiohttp_client(create_app(settings))
    resp = await client.get("/health")
    assert resp.status == 200
    assert await resp.text() == "ok"


async def test_health_and_readiness(proxied: Factory, aiohttp_client: Any) -> None:
    """/healthz always answers; /readyz is 200 once the model is discovered and loadable."""
    _, client = await proxied()
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200
    body = await ready.json()
    assert body["models"] == ["minilm"]
    assert body["upstream_version"] == "0.29.0"
    settings = Settings(upstream=f"http://127.0.0.1:{_free_port()}", connect_timeout=1)
    down = await aiohttp_client(create_app(settings))
    assert (await down.get("/healthz")).status == 200
    assert (await down.get("/readyz")).status == 503


@pytest.mark.parametrize(
    ("path", "body"), [s for s in SHAPES if "truncate_prompt_tokens" not in s[1]]
)
async def test_derivation_path_bills_the_same(
    proxied: Factory, path: str, body: dict[str, Any]
) -> None:
    """--recount-fraction 0: once three full recounts proved the model, only the query is
    counted; E = R - (N-1)Q - Np is still exact."""
    fake, client = await proxied("0.29.0", recount_fraction=0.0)
    for attempt in range(4):  # three proving recounts, then the derivation
        before = fake.prompt_tokens_total
        with capture_logs() as logs:
            status, headers, raw = await post(client, path, body)
        assert status == 200
        assert json.loads(raw)["usage"]["prompt_tokens"] == fake.prompt_tokens_total - before
        assert headers["x-usage-verdict"] == "corrected"
        (audited,) = [e for e in logs if e["event"] == "audited"]
        assert audited["method"] == ("derived" if attempt == 3 else "recount")


async def test_model_from_the_hf_cache(
    proxied: Factory, minilm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """root is an HF id: tokenizer and config.json come from the local HF cache, offline."""
    snapshot = tmp_path / "hub" / "models--acme--minilm" / "snapshots" / ("0" * 40)
    shutil.copytree(minilm_path, snapshot, ignore=shutil.ignore_patterns("*.safetensors"))
    refs = tmp_path / "hub" / "models--acme--minilm" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake, client = await proxied("0.29.0", root=Path("acme/minilm"))
    status, headers, _ = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200
    assert headers["x-usage-verdict"] == "corrected"


async def test_a_misread_model_is_never_corrected_by_the_derivation(proxied: Factory) -> None:
    """Issue #30: the proxy reads the model as a bi-encoder (its config.json says so)
    while the engine runs it as a cross-encoder (as --hf-overrides does), and the server
    does not say how it serves it (no /openapi.json). With --recount-fraction 0 in front
    of 0.29.0 the derivation used to say ``corrected`` and under-bill. Now shortcuts wait
    for agreeing full recounts: the first full recount disagrees, the model is distrusted
    for good, and every request is billed as the engine processed it (reported, for a
    cross-encoder), never corrected."""
    fake, client = await proxied(
        "0.29.0", family="cross-encoder", recount_fraction=0.0, openapi=False
    )
    rerank = {"query": QUERY, "documents": DOCS}
    for _ in range(6):
        before = fake.prompt_tokens_total
        status, headers, raw = await post(client, "/rerank", rerank)
        assert status == 200
        assert headers["x-usage-verdict"] == "mismatch"
        assert json.loads(raw)["usage"]["prompt_tokens"] == fake.prompt_tokens_total - before
    metrics = (await (await client.get("/metrics")).text()).splitlines()
    assert 'usage_proxy_recount_disagreements_total{model="minilm"} 1.0' in metrics
    assert 'usage_proxy_shortcuts_trusted{model="minilm"} 0.0' in metrics


async def test_the_servers_routes_tell_a_classifier_its_config_does_not(proxied: Factory) -> None:
    """The same model, and the server's /openapi.json serves /classify and no embeddings
    (vLLM registers the routes of the task it runs): the proxy counts it as the
    cross-encoder it is served as, and the counts agree (exact) from the first request."""
    fake, client = await proxied("0.29.0", family="cross-encoder", recount_fraction=0.0)
    for _ in range(4):
        before = fake.prompt_tokens_total
        status, headers, raw = await post(client, "/rerank", {"query": QUERY, "documents": DOCS})
        assert status == 200
        assert headers["x-usage-verdict"] == "exact"
        assert json.loads(raw)["usage"]["prompt_tokens"] == fake.prompt_tokens_total - before

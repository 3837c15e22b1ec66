"""Issue #44 on a real vLLM 0.32.0 serving a tiny random Qwen3 causal LM as a generate model
(``VLLM_ENABLE_RESPONSES_API_STORE=1``), with a real ``usage-proxy serve --api-keys`` in
front: beam search and huge echoed fields reach no engine, and one tenant cannot read,
continue, overwrite or probe (through ``cached_tokens``) another's stored responses and
prefix cache. The engine's own ``vllm:prompt_tokens_total`` is the witness of no work."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.windows import parse_engine_counters
from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import (
    start_proxy,
)
from tests.e2e.cases import StartGenerate

pytestmark = pytest.mark.e2e
RELEASE = "0.32.0"
KEYS = {"alice": "sk-alice-e2e", "bob": "sk-bob-e2e"}
# ~1100 tokens: prefix caching serves whole blocks, so a repeat is cached in part
LONG = " ".join(f"word{i}" for i in range(300))


@dataclass(frozen=True)
class Doors:
    vllm: str
    proxy: str


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory, generating: StartGenerate) -> Iterator[Doors]:
    """vLLM 0.32.0 generating, with the response store, and the proxy with two tenants."""
    logs = tmp_path_factory.mktemp("doors-logs")
    keys = logs / "keys.yaml"
    keys.write_text("".join(f"{t}: {key_digest(k)}\n" for t, k in KEYS.items()))
    store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    with generating(logs, 2048, "--enable-prompt-tokens-details", env=store) as server:
        proxy = start_proxy(server.url, logs, "--api-keys", str(keys))
        try:
            proxy.wait_ready("/readyz", 60)
            yield Doors(server.url, proxy.url)
        finally:
            proxy.stop()


def call(
    base: str, path: str, body: dict[str, Any] | None = None, tenant: str | None = None
) -> tuple[int, Any]:
    """POST ``body`` (GET without one) as ``tenant``; the status and the parsed answer."""
    headers = {"Content-Type": "application/json"}
    if tenant is not None:
        headers["Authorization"] = f"Bearer {KEYS[tenant]}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data, headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            raw = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def engine_prompt_tokens(doors: Doors) -> int:
    with urllib.request.urlopen(doors.vllm + "/metrics", timeout=30) as answer:
        return parse_engine_counters(answer.read().decode()).prompt


def test_beam_search_reaches_no_engine(doors: Doors) -> None:
    """Case 1 on the real engine: beam search reads the prompt once per beam per token (the
    engine's counter grows past what the usage reports, measured directly); through the
    proxy it is refused and the counter does not move."""
    body = {"prompt": LONG[:400], "max_tokens": 8, "use_beam_search": True, "n": 2}
    before = engine_prompt_tokens(doors)
    status, answer = call(doors.vllm, "/v1/completions", body)
    assert status == 200
    assert engine_prompt_tokens(doors) - before > answer["usage"]["prompt_tokens"]
    before = engine_prompt_tokens(doors)
    status, answer = call(doors.proxy, "/v1/completions", body, "bob")
    assert status == 400
    assert answer["error"]["param"] == "beam_search"
    assert engine_prompt_tokens(doors) == before


def test_a_huge_echoed_request_id_reaches_no_engine(doors: Doors) -> None:
    """Case 2: a 5 MB ``request_id`` on a streamed chat (echoed into every event's id,
    the usage's too) is refused before the engine works."""
    before = engine_prompt_tokens(doors)
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "request_id": "x" * (5 << 20),
    }
    status, answer = call(doors.proxy, "/v1/chat/completions", body, "bob")
    assert status == 400
    assert answer["error"]["param"] == "request_id"
    assert engine_prompt_tokens(doors) == before


def test_stored_responses_belong_to_their_tenant(doors: Doors) -> None:
    """Cases 5-7: bob cannot read, cancel, continue or overwrite alice's stored response;
    his refusals are vLLM's own answer for an unknown id, and reach no engine."""
    status, made = call(doors.proxy, "/v1/responses", {"input": "alice's plan"}, "alice")
    assert status == 200
    alice_id = made["id"]
    status, unknown = call(doors.vllm, "/v1/responses/resp_nobodys")
    assert status == 404
    status, refused = call(doors.proxy, f"/v1/responses/{alice_id}", tenant="bob")
    assert status == 404
    assert refused == json.loads(json.dumps(unknown).replace("resp_nobodys", alice_id))
    assert call(doors.proxy, f"/v1/responses/{alice_id}/cancel", {}, "bob")[0] == 404
    before = engine_prompt_tokens(doors)
    body = {"input": "go on", "previous_response_id": alice_id, "max_output_tokens": 4}
    assert call(doors.proxy, "/v1/responses", body, "bob")[0] == 404
    body = {"input": "bob's text", "request_id": alice_id, "max_output_tokens": 4}
    assert call(doors.proxy, "/v1/responses", body, "bob")[0] == 400
    assert engine_prompt_tokens(doors) == before
    status, mine = call(doors.proxy, f"/v1/responses/{alice_id}", tenant="alice")
    assert status == 200
    assert mine["output"] == made["output"]


def test_tenants_do_not_probe_each_others_prefix_cache(doors: Doors) -> None:
    """Case 8: bob sending alice's exact prompt is told no cached tokens (vLLM's cache is
    salted per tenant), while alice's own repeat is served from her cache."""

    def cached(tenant: str) -> int:
        body = {"input": LONG, "max_output_tokens": 2}
        status, answer = call(doors.proxy, "/v1/responses", body, tenant)
        assert status == 200
        return int(answer["usage"]["input_tokens_details"]["cached_tokens"])

    cached("alice")
    assert cached("alice") > 0
    assert cached("bob") == 0


def test_the_proxy_mints_response_ids_vllm_stores(doors: Doors, tmp_path: Path) -> None:
    """The id the proxy mints is the one vLLM stores the response under (its
    ``request_id``), so ownership names the real response."""
    status, made = call(doors.proxy, "/v1/responses", {"input": "x", "max_output_tokens": 2}, "bob")
    assert status == 200
    assert made["id"].startswith("resp_")
    assert call(doors.vllm, f"/v1/responses/{made['id']}")[0] == 200

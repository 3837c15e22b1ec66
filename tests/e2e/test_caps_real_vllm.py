"""Issue #58 on a real vLLM 0.32.0 serving a tiny random Qwen3 causal LM: the caps the fake
vLLM's engine (``tests/support/fakevllm/engine.py``) reads are the ones the real engine
reads (its generation counter grows by the cap the fake predicts, clamped to what the
context leaves), and through the proxy a tenant's requests never make the engine do more
than its budget (engine work: the growth of ``vllm:prompt_tokens_total`` and
``vllm:generation_tokens_total``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.ledger.windows import parse_engine_counters
from scripts.vllm_cpu import start_proxy
from tests.e2e.cases import StartGenerate
from tests.support.fakevllm.engine import read_generation

pytestmark = pytest.mark.e2e
RELEASE = "0.32.0"
CONTEXT = 1024
TALK = [{"role": "user", "content": "hi"}]
CASES = {
    # the table: each names a cap in a field its route does not have
    "chat": ("/v1/chat/completions", {"messages": TALK, "max_output_tokens": 1}),
    "completions": (
        "/v1/completions",
        {"prompt": "hi", "max_completion_tokens": 1, "max_tokens": 400},
    ),
    "responses": ("/v1/responses", {"input": "hi", "max_tokens": 1}),
    "batch": ("/v1/chat/completions/batch", {"messages": [TALK] * 8, "max_tokens": 100}),
}
# A total-token budget per case's tenant: the batch's is above its body's bytes and one cap
BUDGETS = {"chat": 300, "completions": 300, "responses": 300, "batch": 600}


@dataclass(frozen=True)
class Engine:
    vllm: str
    proxy: str


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, generating: StartGenerate) -> Iterator[Engine]:
    """vLLM 0.32.0 generating with a 1,024-token context; the proxy with one tenant per
    case, each with its total-token budget (``BUDGETS``)."""
    logs = tmp_path_factory.mktemp("caps-logs")
    limits = logs / "limits.yaml"
    tenants = {name: {"total_tokens_per_day": BUDGETS[name]} for name in CASES}
    limits.write_text(json.dumps({"tenants": tenants}))
    with generating(logs, CONTEXT) as server:
        proxy = start_proxy(
            server.url,
            logs,
            *("--limits", str(limits), "--tenant-header", "X-Tenant-Id"),
            *("--journal", str(logs / "journal.sqlite")),  # its own: no budget restored
        )
        try:
            proxy.wait_ready("/readyz", 60)
            yield Engine(server.url, proxy.url)
        finally:
            proxy.stop()


def call(url: str, body: dict[str, Any], tenant: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if tenant is not None:
        headers["X-Tenant-Id"] = tenant
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def counters(engine: Engine) -> tuple[int, int]:
    with urllib.request.urlopen(engine.vllm + "/metrics", timeout=30) as answer:
        found = parse_engine_counters(answer.read().decode())
    return found.prompt, found.generation


def worst(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body as the fake's engine at its worst runs it: every request to its cap."""
    return {**body, "ignore_eos": True}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_reads_the_cap_the_engine_reads(engine: Engine, case: str) -> None:
    """Sent straight to vLLM with ``ignore_eos``: the engine generates, per conversation,
    the cap the fake's engine reads (a field the route lacks ignored), clamped to what
    the context leaves after the prompt the engine counted."""
    path, body = CASES[case]
    prompt_before, generated_before = counters(engine)
    status, answer = call(engine.vllm + path, worst(path, body))
    assert status == 200, answer
    prompt = counters(engine)[0] - prompt_before
    generated = counters(engine)[1] - generated_before
    talks, cap, outputs = read_generation(path, body)
    each = prompt // len(talks)
    want = len(talks) * outputs * (CONTEXT - each if cap is None else min(cap, CONTEXT - each))
    assert generated == want, (prompt, generated)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_budget_bounds_the_engine_work(engine: Engine, case: str) -> None:
    """Through the proxy, three requests of a tenant with a total-token budget never
    make the engine do more than the budget (on main one request took it past: 1,024
    tokens for a chat or a Responses request, 401 for the completion, 880 for the batch of 8
    conversations at 100 each)."""
    path, body = CASES[case]
    before = sum(counters(engine))
    for _ in range(3):
        status, answer = call(engine.proxy + path, worst(path, body), tenant=case)
        assert status in (200, 400, 429), answer
    assert sum(counters(engine)) - before <= BUDGETS[case]

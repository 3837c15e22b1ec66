"""Issue #58: a chat is reserved at its prompt as vLLM renders it (the upstream's own
/tokenize) plus its cap, not at one token per body byte, so a tenant's whole budget is
spendable by ordinary chats: a chat whose prompt is c tokens is admitted while c plus its
cap is left, and refused once it is not. The whole proxy in front of the fake vLLM, whose
tokenizer is given a ChatML template."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from proxy.serving.keys import METRICS
from proxy.tokenizers.pool import FairExecutor
from tests.support.fakevllm import FakeVLLM
from tests.support.proxies import limited_proxy as budgeted
from tests.support.records import journal_records

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ACME = {"X-Tenant-Id": "acme"}
TEXT = "the quick brown fox jumps over the lazy dog " * 6


def chat(cap: int) -> dict[str, Any]:
    return {"model": "minilm", "messages": [{"role": "user", "content": TEXT}], "max_tokens": cap}


async def limited_proxy(
    aiohttp_server: Any, aiohttp_client: Any, root: Path, tmp: Path, policies: Any
) -> tuple[Any, Any]:
    """The fake vLLM (MiniLM, a ChatML template) and the proxy with ``policies``."""
    fake, client = await budgeted(aiohttp_server, aiohttp_client, root, tmp, policies)
    fake.tokenizer.chat_template = CHATML
    return fake, client


def rendered_tokens(minilm_path: Path, body: dict[str, Any]) -> int:
    """The chat's prompt as the template renders it, in tokens (no special tokens added)."""
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    text = tokenizer.apply_chat_template(
        body["messages"], chat_template=CHATML, tokenize=False, add_generation_prompt=True
    )
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


async def test_a_budget_is_spendable_to_its_last_token_by_chats(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A budget of exactly c + cap admits the chat (its bytes alone pass the budget: the
    byte bound refused it, 400); then, with R left, a chat of c + (R - c) is admitted and
    one of c + (R - c + 1) is refused (429)."""
    cap = 20
    prompt = rendered_tokens(minilm_path, chat(cap))
    assert len(json.dumps(chat(cap))) > prompt + cap  # the byte bound cannot fit it
    budget = {"tenants": {"acme": {"total_tokens_per_day": prompt + cap}}}
    _, client = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, budget)
    resp = await client.post("/v1/chat/completions", json=chat(cap), headers=ACME)
    assert resp.status == 200, await resp.text()
    await resp.read()
    assert resp.headers["x-ratelimit-remaining-tokens"] == "0"  # reserved at c + cap
    (record,) = journal_records(tmp_path / "journal.sqlite")
    billed = (record.prompt_tokens_billed or 0) + (record.completion_tokens_billed or 0)
    fits = prompt + cap - billed - prompt  # the largest cap that fits what is left
    assert fits > 0
    resp = await client.post("/v1/chat/completions", json=chat(fits + 1), headers=ACME)
    assert resp.status == 429, await resp.text()
    resp = await client.post("/v1/chat/completions", json=chat(fits), headers=ACME)
    assert resp.status == 200, await resp.text()
    await resp.read()
    assert resp.headers["x-ratelimit-remaining-tokens"] == "0"
    sample = client.app[METRICS].registry.get_sample_value
    assert sample("usage_proxy_prompt_counts_total", {"outcome": "tokenize"}) == 3


async def test_a_prompt_the_upstream_cannot_count_keeps_the_byte_bound(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A model with no chat template (vLLM's /tokenize answers 400): the chat is priced by
    its bytes as before, admitted, and the fallback is counted; the traffic goes on."""
    budget = {"tenants": {"acme": {"total_tokens_per_day": 100_000}}}
    fake, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, budget
    )
    fake.tokenizer.chat_template = None
    body = chat(20)
    resp = await client.post("/v1/chat/completions", json=body, headers=ACME)
    assert resp.status == 200, await resp.text()
    await resp.read()
    reserved = 100_000 - int(resp.headers["x-ratelimit-remaining-tokens"])
    context = 256  # the fake's max_model_len: the bound is the bytes, within the context
    # (vLLM clamps a cap the prompt leaves no room for, so both parts are reserved whole)
    assert reserved == min(len(json.dumps(body)), context) + 20
    sample = client.app[METRICS].registry.get_sample_value
    assert sample("usage_proxy_prompt_counts_total", {"outcome": "refused"}) == 1
    assert sample("usage_proxy_prompt_counts_total", {"outcome": "tokenize"}) is None


async def test_a_budgeted_chat_is_parsed_once_to_count_and_price_it(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body is parsed whole once by the proxy (in a worker thread) for both its
    /tokenize requests and its price (it was parsed for each)."""
    budget = {"tenants": {"acme": {"total_tokens_per_day": 100_000}}}
    _, client = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, budget)
    raw = json.dumps(chat(8)).encode()
    callers: list[str] = []
    loads = json.loads

    def watched(text: Any, **options: Any) -> Any:
        if text == raw:
            callers.append(sys._getframe(1).f_globals["__name__"])
        return loads(text, **options)

    monkeypatch.setattr(json, "loads", watched)
    headers = {**ACME, "Content-Type": "application/json"}
    resp = await client.post("/v1/chat/completions", data=raw, headers=headers)
    assert resp.status == 200, await resp.text()
    assert [c for c in callers if c.startswith("proxy.")] == ["proxy.limits.pricing"]


async def test_a_budgeted_embedding_of_inputs_is_priced_in_one_worker_step(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An embedding of inputs has no prompt for /tokenize: its admission parses and prices
    it in one worker-thread job (it took three: parse, find nothing to ask, price), asks
    /tokenize nothing, and reserves what it did before: its counted inputs."""
    budget = {"tenants": {"acme": {"total_tokens_per_day": 100_000}}}
    fake, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, budget
    )
    jobs: list[str] = []
    submit_for = FairExecutor.submit_for

    def watched(self: FairExecutor, tenant: str, fn: Any, /, *args: Any, **kw: Any) -> Any:
        jobs.append(tenant)
        return submit_for(self, tenant, fn, *args, **kw)

    monkeypatch.setattr(FairExecutor, "submit_for", watched)
    body = {"model": "minilm", "input": ["the capital of France", "paris"]}
    for tenant in ("nobody", "acme"):  # unlimited: its count alone; budgeted: and its price
        resp = await client.post("/v1/embeddings", json=body, headers={"X-Tenant-Id": tenant})
        assert resp.status == 200, await resp.text()
    assert jobs.count("acme") == jobs.count("nobody") + 1
    assert fake.tokenize_calls == 0
    reserved = 100_000 - int(resp.headers["x-ratelimit-remaining-tokens"])
    assert reserved == (await resp.json())["usage"]["prompt_tokens"] > 0


async def test_a_prompt_forwarded_as_token_ids_is_not_priced_by_its_messages(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A chat of "hi" whose ``kv_transfer_params.prompt_token_ids`` holds 600 ids: vLLM
    prefills the ids (the fake at its worst, as vLLM 0.32.0 reads them). Counted from its
    messages it was reserved at a few tokens and admitted under a 300-token budget, and
    the engine did 601; priced by its bytes it is refused, and the engine does nothing."""
    fake, client = await budgeted(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"total_tokens_per_day": 300}}},
        version="0.32.0",
        fake_class=_at_the_cap,
    )
    fake.tokenizer.chat_template = CHATML
    ids = list(range(1000, 1600))
    body = {**chat(1), "kv_transfer_params": {"prompt_token_ids": ids}}
    body["messages"] = [{"role": "user", "content": "hi"}]
    resp = await client.post("/v1/chat/completions", json=body, headers=ACME)
    await resp.read()
    assert fake.prompt_tokens_total + fake.generation_tokens_total <= 300, resp.status
    assert resp.status in (400, 429)


def _at_the_cap(tokenizer: Any, root: Path, **options: Any) -> FakeVLLM:
    """The fake vLLM at its worst (every engine request to its cap), context 1024."""
    return FakeVLLM(tokenizer, root, **options, max_model_len=1024, to_cap=True)

"""Issue #58: a request is priced as vLLM reads it, so no budget goes into debt. The
whole proxy in front of the fake vLLM at its worst (``to_cap``: every engine request
generates to the cap vLLM 0.32.0 gives it, read from vLLM's source), real MiniLM: a burst
of a tenant's requests never makes the engine do more than the tenant's budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_reads import LONG, burst, chat, work

CAPS = [
    # (path, body, total token budget): the table, each field the route lacks
    ("/v1/chat/completions", chat(max_output_tokens=1), 300),
    ("/v1/completions", {"prompt": "hi", "max_completion_tokens": 1, "max_tokens": 250}, 300),
    ("/v1/responses", {"input": "hi", "max_tokens": 1}, 300),
    (
        "/inference/v1/generate",
        {"token_ids": [1, 2, 3], "max_tokens": 1, "sampling_params": {"max_tokens": 250}},
        300,
    ),
    ("/v1/messages", {**chat(), "max_tokens": 250, "max_completion_tokens": 1}, 300),
]


@pytest.mark.parametrize(("path", "payload", "budget"), CAPS)
async def test_a_cap_is_read_from_the_field_the_route_has(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    path: str,
    payload: dict[str, Any],
    budget: int,
) -> None:
    """A cap in a field the route's request model does not have is ignored, as vLLM
    ignores it: the request is priced at the cap vLLM reads (or the context), so ten at
    once never take the engine past the budget (they reserved one token: 4x to 50x)."""
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"total_tokens_per_day": budget},
        path,
        json.dumps(payload).encode(),
        10,
    )
    assert work(fake) <= budget, [s for s, _ in statuses]


def batch(conversations: int) -> bytes:
    talk = [{"role": "user", "content": "hi"}]
    return json.dumps({"messages": [talk] * conversations, "max_tokens": 5}).encode()


@pytest.mark.parametrize(
    ("path", "body", "budget"),
    [
        ("/v1/chat/completions/batch", batch(200), 2000),
        ("/v2/embed", json.dumps({"texts": [LONG] * 400, "input_type": "x"}).encode(), 2000),
        (
            "/v1/embeddings",
            json.dumps({"messages": [[{"role": "user", "content": LONG}]] * 400}).encode(),
            2000,
        ),
        (
            "/generative_scoring",
            json.dumps({"query": LONG, "items": [LONG] * 400, "label_token_ids": [1]}).encode(),
            2000,
        ),
        # a field of the other embeddings route, which this one's model ignores
        ("/v1/embeddings", json.dumps({"input": [LONG] * 400, "texts": ["x"]}).encode(), 2000),
        (
            "/v2/embed",
            json.dumps({"texts": [LONG] * 400, "truncate_prompt_tokens": 1}).encode(),
            2000,
        ),
    ],
)
async def test_a_list_is_one_engine_request_per_member(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    path: str,
    body: bytes,
    budget: int,
) -> None:
    """Batch chat's conversations (33x), /v2/embed's texts (11x), an embeddings
    ``messages`` list of conversations (11x) and /generative_scoring's items (192x) were
    priced as one input: each member is one engine request, priced as such. The two
    embeddings routes share an operation, not a request model: /v1/embeddings' 400
    inputs beside Cohere's ``texts: ["x"]`` were priced as that one text, /v2/embed's
    400 texts cut by OpenAI's ``truncate_prompt_tokens`` (which Cohere's model ignores)."""
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"total_tokens_per_day": budget},
        path,
        body,
        10,
        context=256,
    )
    assert work(fake) <= budget, [s for s, _ in statuses]


@pytest.mark.parametrize("messages", [[], [{"content": "x"}]])
async def test_embeddings_read_by_input_are_priced_by_input(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    messages: Any,
) -> None:
    """An embeddings body with 400 texts in ``input`` and a ``messages`` that vLLM's union
    does not read as a conversation (it reads ``input``) was priced as one conversation
    (62x): ten at once never take the engine past the budget."""
    body = json.dumps({"input": [LONG] * 400, "messages": messages}).encode()
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"total_tokens_per_day": 2000},
        "/v1/embeddings",
        body,
        10,
        context=256,
    )
    assert work(fake) <= 2000, [s for s, _ in statuses]


async def test_a_scoring_request_not_counted_in_time_is_priced_at_its_bound(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank whose count does not come within ``--accounting-timeout`` was admitted for
    one token, so five at once ran 6x a prompt budget: it is priced at its bound (every
    query and document at the context), which this budget cannot hold: a 503 to try
    again (counted, a request may fit: tests/app/test_limits_late_counts.py)."""
    rerank = {"query": LONG, "documents": [f"{LONG} {i}" for i in range(300)]}
    body = json.dumps(rerank).encode()
    assert len(body) > 64 * 1024  # counted in the pool, not inline
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"prompt_tokens_per_day": 20000},
        "/rerank",
        body,
        5,
        accounting_timeout=0.001,
    )
    assert fake.prompt_tokens_total <= 20000, [s for s, _ in statuses]
    assert {s for s, _ in statuses} == {503}, statuses
    assert "not counted within" in statuses[0][1]


UNCAPPED_LORA_CHAT = json.dumps({**chat(), "model": "acme-lora"}).encode()


@pytest.mark.parametrize(
    ("listed", "late"),
    [(("acme-lora",), ()), ((), ("acme-lora",))],
    ids=["listed", "loaded-since-discovery"],
)
async def test_a_lora_adapter_is_priced_within_the_engines_context(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    listed: tuple[str, ...],
    late: tuple[str, ...],
) -> None:
    """vLLM lists a LoRA adapter without a ``max_model_len`` (its parent's context is the
    engine's), and serves one loaded since the proxy's last discovery before the proxy
    lists it: either was reserved at one token, so ten uncapped chats at once ran 2,560
    tokens through a 600-token budget. Priced within the engine's context, the budget
    bounds the engine and still admits them."""
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"total_tokens_per_day": 600},
        "/v1/chat/completions",
        UNCAPPED_LORA_CHAT,
        10,
        context=256,
        adapters=listed,
        late=late,
    )
    assert work(fake) <= 600, statuses
    assert 200 in [s for s, _ in statuses], statuses


async def test_a_rerank_for_a_model_loaded_since_the_last_discovery_is_bounded(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank naming an adapter the proxy has not listed yet cannot be counted (no
    tokenizer): it was reserved at one token, so ten at once ran 3x the budget; it is
    priced at its bound, every query and document at the widest served context."""
    rerank = {"model": "acme-lora", "query": LONG, "documents": [LONG] * 10}
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"prompt_tokens_per_day": 3000},
        "/rerank",
        json.dumps(rerank).encode(),
        10,
        context=256,
        late=("acme-lora",),
    )
    assert fake.prompt_tokens_total <= 3000, statuses
    assert 200 in [s for s, _ in statuses], statuses


async def test_an_escaped_image_part_is_priced_as_an_image(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """``"\\u0069mage_url"`` is ``image_url`` to a JSON parser: the media part reserves
    the context as the plain spelling does (it was priced by its body's bytes: 12x)."""
    part = '{"type": "\\u0069mage_url", "\\u0069mage_url": {"url": "http://x/y.png"}}'
    body = ('{"messages": [{"role": "user", "content": [' + part + ']}], "max_tokens": 1}').encode()
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"prompt_tokens_per_day": 4096},
        "/v1/chat/completions",
        body,
        12,
        context=4096,
        media_tokens=4000,
    )
    assert fake.prompt_tokens_total <= 4096, [s for s, _ in statuses]


async def test_a_clamped_cap_does_not_let_prompts_through_a_prompt_limit(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """vLLM 0.32 clamps a cap the prompt leaves no room for: a prompt is never priced at
    the context less the cap (20 chats put 4,840 prompt tokens through a 500 limit)."""
    payload = {"messages": [{"role": "user", "content": LONG * 3}], "max_tokens": 1024}
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"prompt_tokens_per_minute": 500},
        "/v1/chat/completions",
        json.dumps(payload).encode(),
        20,
        context=1024,
    )
    assert fake.prompt_tokens_total <= 500, [s for s, _ in statuses]


async def test_a_shape_the_pricing_cannot_read_is_refused(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A /pooling request for an IO processor plugin (``data``) has no price the proxy can
    know: refused 400 in vLLM's shape under a token budget, never admitted for a token."""
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"total_tokens_per_day": 1000},
        "/pooling",
        json.dumps({"data": {"anything": 1}}).encode(),
        1,
    )
    ((status, text),) = statuses
    assert status == 400
    assert "its cost is not known before it runs" in json.loads(text)["error"]["message"]
    assert fake.seen_headers == []  # nothing forwarded

"""A chat's prompt counted by the upstream's /tokenize (the fake answers as vLLM 0.32.0's
does), and every way that can fail falling back to the byte bound: logged, counted in
usage_proxy_prompt_counts_total, never raised."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from transformers import AutoTokenizer

from proxy.accounting.dispatch import Prepared
from proxy.accounting.types import Release
from proxy.metrics import Metrics
from proxy.serving.prompts import MOST_CALLS, MOST_IN_FLIGHT, PromptCounter, tokenizes
from proxy.settings import Settings
from tests.support.fakevllm import FakeVLLM

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RELEASE = Release("0.32.0")
CHAT = {"model": "minilm", "messages": [{"role": "user", "content": "hello there"}]}


async def inline(fn: Callable[[], Any]) -> Any:
    return fn()


def chat(payload: dict[str, Any] = CHAT, operation: str = "chat") -> Prepared:
    return Prepared(json.dumps(payload).encode(), operation, "minilm")


def outcomes(metrics: Metrics) -> dict[str, float]:
    names = ("tokenize", "not_countable", "too_many", "refused", "timeout", "unreachable")
    names += ("invalid",)
    sample = metrics.registry.get_sample_value
    counts = {n: sample("usage_proxy_prompt_counts_total", {"outcome": n}) for n in names}
    return {n: v for n, v in counts.items() if v}


async def count(base: str, prepared: Prepared, timeout: float = 2.0) -> tuple[Any, Metrics]:
    metrics = Metrics(Settings(upstream=base))
    counter = PromptCounter(base, metrics, timeout=timeout)
    async with aiohttp.ClientSession() as session:
        payload = json.loads(prepared.body)
        got = await counter.count(session, prepared, payload, RELEASE, {}, inline)
    return got, metrics


@pytest.fixture
def fake(minilm_path: Path) -> FakeVLLM:
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    tokenizer.chat_template = CHATML
    return FakeVLLM(tokenizer, minilm_path, version="0.32.0")


async def test_a_chat_is_counted_as_the_upstream_renders_it(
    aiohttp_server: Any, fake: FakeVLLM
) -> None:
    """The count is the template's rendering tokenized, as vLLM's /tokenize answers."""
    server = await aiohttp_server(fake.app())
    got, metrics = await count(str(server.make_url("")), chat())
    rendered = fake.tokenizer.apply_chat_template(
        CHAT["messages"], tokenize=False, add_generation_prompt=True
    )
    assert got == len(fake.tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert outcomes(metrics) == {"tokenize": 1}


async def test_a_batch_is_the_sum_of_its_prompts(aiohttp_server: Any, fake: FakeVLLM) -> None:
    """Completions with a list of prompts: each counted (special tokens added), summed."""
    server = await aiohttp_server(fake.app())
    prompts = ["one two", "three four five"]
    got, _ = await count(str(server.make_url("")), chat({"prompt": prompts}, "completions"))
    assert got == sum(len(fake.tokenizer(p)["input_ids"]) for p in prompts)
    assert fake.tokenize_calls == 2


@pytest.mark.parametrize(
    ("operation", "payload"),
    [
        ("messages", {"messages": CHAT["messages"], "max_tokens": 1}),
        ("responses", {"input": "hello there, how are you today?"}),
    ],
)
async def test_a_truncation_the_route_does_not_read_cuts_nothing(
    aiohttp_server: Any, fake: FakeVLLM, operation: str, payload: dict[str, Any]
) -> None:
    """``truncate_prompt_tokens`` is no field of vLLM's Messages or Responses request (the
    first drops it, the second truncates by ``truncation`` only): the engine reads the
    whole prompt, so the count is not cut to it."""
    server = await aiohttp_server(fake.app())
    whole, _ = await count(str(server.make_url("")), chat(payload, operation))
    cut = {**payload, "truncate_prompt_tokens": 1}
    got, _ = await count(str(server.make_url("")), chat(cut, operation))
    assert isinstance(whole, int)
    assert whole > 1
    assert got == whole


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"role": "user", "content": "hi"}], "kv_transfer_params": null,'
        b' "kv_transfer_params": {"prompt_token_ids": [5, 6, 7]}}',
        b'{"messages": [{"role": "user", "content": "hi"}],'
        b' "\\u006bv_transfer_params": {"prompt_token_ids": [5, 6, 7]}}',
    ],
)
async def test_fields_are_read_as_vllm_parses_json(
    aiohttp_server: Any, fake: FakeVLLM, raw: bytes
) -> None:
    """A duplicate member (the last one wins, as in vLLM's parser) or an escaped member
    name hides no forwarded prompt ids: the prompt is not counted from its messages."""
    server = await aiohttp_server(fake.app())
    got, metrics = await count(str(server.make_url("")), Prepared(raw, "chat", "minilm"))
    assert (got, fake.tokenize_calls) == (None, 0)
    assert outcomes(metrics) == {"not_countable": 1}


async def test_a_prompt_it_cannot_render_is_not_asked(aiohttp_server: Any, fake: FakeVLLM) -> None:
    """An image part (which /tokenize would fetch): not asked, the byte bound stays."""
    server = await aiohttp_server(fake.app())
    image = {"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}}
    payload = {"messages": [{"role": "user", "content": [image]}]}
    got, metrics = await count(str(server.make_url("")), chat(payload))
    assert (got, fake.tokenize_calls) == (None, 0)
    assert outcomes(metrics) == {"not_countable": 1}


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(5)
    return web.json_response({"count": 1})


def answering(body: bytes, status: int = 200) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, status=status, content_type="application/json")

    return handler


@pytest.mark.parametrize(
    ("handler", "outcome"),
    [
        (None, "refused"),  # a server without /tokenize: 404
        (answering(b'{"error": {"message": "no template"}}', 400), "refused"),
        (slow, "timeout"),
        (answering(b"<html>gateway</html>"), "invalid"),
        (answering(b'{"tokens": [1, 2]}'), "invalid"),
    ],
)
async def test_every_failure_falls_back_to_the_byte_bound(
    aiohttp_server: Any, handler: Any, outcome: str
) -> None:
    """No /tokenize (404), a refusal, no answer within the timeout, an answer that is not
    vLLM's: None (priced by the byte bound), counted by outcome, never raised."""
    app = web.Application()
    if handler is not None:
        app.router.add_post("/tokenize", handler)
    server = await aiohttp_server(app)
    got, metrics = await count(str(server.make_url("")), chat(), timeout=0.3)
    assert got is None
    assert outcomes(metrics) == {outcome: 1}


async def test_an_unreachable_upstream_falls_back(unused_tcp_port: int) -> None:
    """Nothing listening: None, counted as unreachable."""
    got, metrics = await count(f"http://127.0.0.1:{unused_tcp_port}", chat())
    assert got is None
    assert outcomes(metrics) == {"unreachable": 1}


async def test_pooling_inputs_are_not_asked(aiohttp_server: Any, fake: FakeVLLM) -> None:
    """Embeddings of texts (the proxy counts those itself): nothing asked, nothing counted;
    given as a conversation, asked."""
    server = await aiohttp_server(fake.app())
    base = str(server.make_url(""))
    got, metrics = await count(base, chat({"input": ["a b"]}, "embeddings"))
    assert (got, outcomes(metrics), fake.tokenize_calls) == (None, {}, 0)
    got, metrics = await count(base, chat({"messages": CHAT["messages"]}, "embeddings"))
    assert got is not None
    assert outcomes(metrics) == {"tokenize": 1}


@pytest.mark.parametrize(
    ("operation", "payload", "asked"),
    [
        ("chat", CHAT, True),
        ("chat", None, True),  # not JSON: asked, and counted as not countable
        ("embeddings", {"input": ["a b"]}, False),
        ("classify", {"input": "a b"}, False),
        ("embeddings", {"messages": CHAT["messages"]}, True),
        ("embeddings", ["a b"], True),  # not an object: asked, and not countable
        ("rerank", {"query": "q", "documents": ["d"]}, False),
    ],
)
def test_which_bodies_go_to_tokenize(operation: str, payload: Any, asked: bool) -> None:
    """What admission decides on the parsed body before pricing it in the same step:
    only a chat-like prompt (a pooling request's conversation among them) is asked."""
    assert tokenizes(operation, payload) is asked


async def test_a_long_prompt_is_counted_whole(aiohttp_server: Any, fake: FakeVLLM) -> None:
    """A prompt past 1 MiB is sent in chunks, as a forwarded body is, and counted whole."""
    server = await aiohttp_server(fake.app())
    text = "word " * 300_000
    got, _ = await count(str(server.make_url("")), chat({"prompt": text}, "completions"), 30)
    assert got == len(fake.tokenizer(text)["input_ids"])


def batch(conversations: int) -> Prepared:
    turn = [{"role": "user", "content": "hi"}]
    return chat({"model": "minilm", "messages": [turn] * conversations})


async def test_a_huge_batch_is_not_asked(aiohttp_server: Any, fake: FakeVLLM) -> None:
    """A batch chat of 10,000 tiny conversations makes no /tokenize call (the byte bound
    stays, counted as too_many); one of MOST_CALLS conversations is still counted."""
    server = await aiohttp_server(fake.app())
    base = str(server.make_url(""))
    got, metrics = await count(base, batch(10_000))
    assert (got, fake.tokenize_calls) == (None, 0)
    assert outcomes(metrics) == {"too_many": 1}
    got, metrics = await count(base, batch(MOST_CALLS))
    assert got is not None
    assert (fake.tokenize_calls, outcomes(metrics)) == (MOST_CALLS, {"tokenize": 1})


async def test_counting_never_holds_the_forwarding_connections(aiohttp_server: Any) -> None:
    """Twenty batches of MOST_CALLS conversations counted at once on a session with the
    proxy's connection limit: at most MOST_IN_FLIGHT /tokenize calls are open, and another
    tenant's request through the same session is answered while they all still wait."""
    release, open_calls = asyncio.Event(), []

    async def held(request: web.Request) -> web.Response:
        open_calls.append(request)
        await release.wait()
        return web.json_response({"count": 1})

    async def other(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/tokenize", held)
    app.router.add_get("/v1/models", other)
    server = await aiohttp_server(app)
    base = str(server.make_url(""))
    settings = Settings(upstream=base)
    counter = PromptCounter(base, Metrics(settings), timeout=30)
    connector = aiohttp.TCPConnector(limit=settings.upstream_connections)
    many = batch(MOST_CALLS)
    asked = json.loads(many.body)
    async with aiohttp.ClientSession(connector=connector) as session:
        counts = [
            asyncio.create_task(counter.count(session, many, asked, RELEASE, {}, inline))
            for _ in range(20)
        ]
        while len(open_calls) < min(MOST_IN_FLIGHT, settings.upstream_connections):
            await asyncio.sleep(0.01)
        async with asyncio.timeout(5):
            async with session.get(base + "/v1/models") as answer:
                assert answer.status == 200
        assert len(open_calls) == MOST_IN_FLIGHT
        release.set()
        assert await asyncio.gather(*counts) == [MOST_CALLS] * 20

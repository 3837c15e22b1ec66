"""Issue #58 on a real vLLM 0.32.0 serving a tiny Qwen3 generate model (ChatML template):
a chat is reserved at its prompt as vLLM's own /tokenize counts it, not one token per body
byte, so a chat of ~262 prompt tokens whose body is longer than the limit is admitted under
``prompt_tokens_per_minute: 655``. The requests the proxy sends /tokenize for each route
count exactly what the engine's ``vllm:prompt_tokens_total`` grows by when the route
itself is called, and the fake vLLM's /tokenize answers as the real one does."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from transformers import AutoTokenizer

from proxy.accounting.types import Release
from proxy.limits.tokenizing import counted, route_truncation, tokenize_requests
from scripts.vllm_cpu import (
    Process,
    metric,
    post,
    prepare_models,
    provision,
    start_proxy,
)
from tests.e2e.cases import VERSIONS, StartGenerate
from tests.support.fakevllm import FakeVLLM

pytestmark = pytest.mark.e2e
RELEASE = "0.32.0"
# 264 prompt tokens under the model's ChatML template, in a body of 890 bytes (JSON
# escapes the text's non-ASCII characters, as Python's json and most clients do)
TEXT = "日本語の文章です。" * 15
CHAT = {"model": "gen", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 4}


@dataclass(frozen=True)
class Engine:
    url: str
    model: Path
    logs: Path


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, generating: StartGenerate) -> Iterator[Engine]:
    """vLLM 0.32.0 generating with the tiny Qwen3 (context 2048)."""
    logs = tmp_path_factory.mktemp("prompt-counts")
    with generating(logs, 2048) as server:
        model = prepare_models(provision(VERSIONS[0]))["generate"]
        yield Engine(server.url, model, logs)


def tokenized(url: str, operation: str, body: dict[str, Any]) -> int | None:
    """What the proxy's /tokenize requests for ``body`` count on the server at ``url``."""
    answers = []
    for request in tokenize_requests(operation, body, Release(RELEASE)):
        status, _, raw = post(url + "/tokenize", request)
        assert status == 200, raw
        answers.append(raw)
    return counted(answers) if answers else None


def test_a_chat_is_admitted_at_its_counted_prompt(engine: Engine) -> None:
    """The issue's finding: the body is longer than the limit, its prompt (as vLLM
    counts it) plus its cap fits; before, the byte bound refused it 400 ("alone costs more
    than the whole limit"). Admitted, it costs the engine exactly what was reserved."""
    prompt = tokenized(engine.url, "chat", CHAT)
    assert prompt is not None
    assert 250 <= prompt <= 275, prompt
    assert len(json.dumps(CHAT)) > 655
    limits = engine.logs / "limits.yaml"
    limits.write_text("default: {prompt_tokens_per_minute: 655}\n")
    proxy: Process = start_proxy(
        engine.url, engine.logs, "--limits", str(limits), "--journal", str(engine.logs / "j.db")
    )
    try:
        proxy.wait_ready("/readyz", 120)
        for i in range(3):  # three times of three, as the issue tried it
            if i:
                time.sleep(30)  # the minute's rate refills what the last chat took
            before = metric(engine.url)
            status, headers, raw = post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 200, raw
            assert metric(engine.url) - before == prompt
            assert json.loads(raw)["usage"]["prompt_tokens"] == prompt
            assert int(headers["x-ratelimit-remaining-tokens"]) <= 655 - prompt
    finally:
        proxy.stop()


HI = [{"role": "user", "content": "hi"}]
REUSED = [
    ("chat", "/v1/chat/completions", {"messages": HI, "max_tokens": 1}),
    ("responses", "/v1/responses", {"input": "hi", "max_output_tokens": 1}),
    ("messages", "/v1/messages", {"messages": HI, "max_tokens": 1}),
]


@pytest.mark.parametrize(("operation", "path", "said"), REUSED)
def test_prompt_ids_forwarded_for_reuse_are_not_counted_from_the_messages(
    engine: Engine, operation: str, path: str, said: dict[str, Any]
) -> None:
    """A chat, Responses or Messages request whose ``kv_transfer_params.prompt_token_ids``
    carries ids is prefilled from those ids, not from its messages, on a plain server (no
    KV connector): the messages' count is a few tokens, the engine reads them all. The
    proxy asks /tokenize nothing for it (its byte bound, one token per byte, covers the
    ids)."""
    ids = json.loads(post(engine.url + "/tokenize", {"prompt": TEXT * 2})[2])["tokens"]
    said = {**said, "model": "gen"}
    body = {**said, "kv_transfer_params": {"prompt_token_ids": ids}}
    messages_only = tokenized(engine.url, operation, said)
    assert messages_only is not None
    assert messages_only < len(ids) // 10
    before = metric(engine.url)
    status, _, raw = post(engine.url + path, body)
    assert status == 200, raw
    assert metric(engine.url) - before == len(ids)
    assert tokenize_requests(operation, body, Release(RELEASE)) == []
    assert len(json.dumps(body)) >= len(ids)
    print(f"{operation}: {len(ids)} ids prefilled, {messages_only} counted from the messages")


@pytest.mark.parametrize(
    ("operation", "path", "body"),
    [
        ("messages", "/v1/messages", {"messages": CHAT["messages"], "max_tokens": 1}),
        ("responses", "/v1/responses", {"input": TEXT, "max_output_tokens": 1}),
    ],
)
def test_a_truncation_the_route_does_not_read_is_not_applied(
    engine: Engine, operation: str, path: str, body: dict[str, Any]
) -> None:
    """``truncate_prompt_tokens: 1`` on the Messages or Responses route: vLLM prefills the
    whole prompt, so the proxy does not cut its count to it."""
    whole = tokenized(engine.url, operation, body)
    assert whole is not None
    assert whole > 100
    cut = {**body, "model": "gen", "truncate_prompt_tokens": 1}
    before = metric(engine.url)
    status, _, raw = post(engine.url + path, cut)
    assert status == 200, raw
    assert metric(engine.url) - before == whole
    assert route_truncation(operation, cut) is None


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
ROUTES = [
    ("chat", "/v1/chat/completions", CHAT),
    (
        "chat",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "tools": TOOLS,
            "tool_choice": "none",  # "auto" needs a tool parser; the tools still render
            "max_tokens": 2,
        },
    ),
    ("completions", "/v1/completions", {"prompt": ["one two three", TEXT], "max_tokens": 2}),
    (
        "responses",
        "/v1/responses",
        {"instructions": "be brief", "input": TEXT, "max_output_tokens": 2},
    ),
    (
        "responses",
        "/v1/responses",
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "and?"},
            ],
            "max_output_tokens": 2,
        },
    ),
    (
        "messages",
        "/v1/messages",
        {
            "system": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": TEXT}]}],
            "max_tokens": 2,
        },
    ),
]


@pytest.mark.parametrize(("operation", "path", "body"), ROUTES)
def test_the_count_is_what_the_route_renders(
    engine: Engine, operation: str, path: str, body: dict[str, Any]
) -> None:
    """For each route, the proxy's /tokenize requests count exactly the prompt tokens
    the engine reads when the route itself is called (its prompt counter's growth)."""
    expected = tokenized(engine.url, operation, body)
    assert expected is not None
    before = metric(engine.url)
    status, _, raw = post(engine.url + path, {**body, "model": "gen"})
    assert status == 200, raw
    assert metric(engine.url) - before == expected


@pytest.mark.parametrize(("operation", "path", "body"), ROUTES)
async def test_the_fake_tokenizes_as_vllm_does(
    engine: Engine, operation: str, path: str, body: dict[str, Any]
) -> None:
    """The fake vLLM's /tokenize, given the same model's tokenizer, answers the same
    counts as the real one (what the fake-based tests of admission rely on)."""
    tokenizer = AutoTokenizer.from_pretrained(str(engine.model))
    fake = FakeVLLM(tokenizer, engine.model, version=RELEASE, name="gen")
    server = TestServer(fake.app())
    await server.start_server()
    try:
        fake_url = str(server.make_url("")).rstrip("/")
        started = time.perf_counter()
        real = tokenized(engine.url, operation, body)
        took = time.perf_counter() - started
        assert await _off_loop(fake_url, operation, body) == real
        print(f"/tokenize {operation}: {took * 1000:.1f} ms on vLLM {RELEASE}")
    finally:
        await server.close()


async def _off_loop(url: str, operation: str, body: dict[str, Any]) -> int | None:
    """``tokenized`` against the fake served on this loop (urllib blocks: a thread)."""
    import asyncio

    return await asyncio.to_thread(tokenized, url, operation, body)

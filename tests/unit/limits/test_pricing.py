"""Prices before forwarding: exact where the proxy counts as vLLM does, else the stated
bound, never below what the engine can bill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from proxy.accounting.analysis import Analysis
from proxy.accounting.fieldkinds import Reads
from proxy.accounting.fields import FIELDS
from proxy.accounting.shapes import parse_rerank
from proxy.accounting.types import ServedModel
from proxy.limits.limiter import Cost
from proxy.limits.pricing import price_metered, price_scoring
from proxy.tokenizers.hf import HFTokenizer
from tests.support.fakevllm import FakeVLLM
from tests.support.fakevllm.engine import EngineError

MODEL = ServedModel("minilm", "minilm", 256, None, None)
CAP_READS = (Reads.CAP, Reads.CAP_FALLBACK)


def body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def test_embeddings_are_counted_exactly(minilm: HFTokenizer) -> None:
    """Texts with the model's tokenizer (special tokens added), token ids by length,
    both capped by truncate_prompt_tokens."""
    payload = {"input": ["hello there", "hi"], "model": "minilm"}
    price = price_metered("embeddings", body(payload), MODEL, minilm)
    assert (price.cost, price.exact) == (Cost(4 + 3), True)
    ids = {"input": [[1, 2, 3, 4, 5], [6, 7]], "truncate_prompt_tokens": 3}
    assert price_metered("embeddings", body(ids), MODEL, minilm).cost == Cost(3 + 2)


def test_embeddings_without_a_tokenizer_are_bounded() -> None:
    """A text the proxy cannot count is priced at the whole context (vLLM refuses more)."""
    price = price_metered("embeddings", body({"input": ["a", "b"]}), MODEL, None)
    assert (price.cost, price.exact) == (Cost(512), False)


@pytest.mark.parametrize(
    ("payload", "cost"),
    [
        ({"prompt": [1, 2, 3], "max_tokens": 10}, Cost(3, 10)),
        ({"prompt": [[1, 2], [3, 4, 5]], "max_tokens": 10}, Cost(5, 20)),
        ({"prompt": [1, 2, 3]}, Cost(3, 16)),
        ({"prompt": [1, 2, 3], "max_tokens": None}, Cost(3, 253)),
        ({"prompt": [1, 2, 3], "max_tokens": 10, "n": 2}, Cost(3, 20)),
        ({"prompt": [1, 2, 3], "max_tokens": 1000}, Cost(3, 253)),
    ],
)
def test_completions_with_token_ids(payload: dict[str, Any], cost: Cost) -> None:
    """Token-id prompts are exact; the completion is max_tokens (16 when absent, as
    CompletionRequest's default; null: what the context leaves) times n per prompt, at
    most what the context leaves."""
    assert price_metered("completions", body(payload), MODEL, None).cost == cost


def test_chat_is_bounded_by_its_bytes_and_the_context() -> None:
    """A text prompt: at most one token per byte of the body; with images, the whole
    context (vLLM 0.32 clamps the cap to what the prompt leaves: the prompt is not bounded
    by the context less the cap)."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}
    raw = body(chat)
    assert price_metered("chat", raw, MODEL, None).cost == Cost(len(raw), 8)
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    chat["messages"] = [{"role": "user", "content": [image]}]
    assert price_metered("chat", body(chat), MODEL, None).cost == Cost(256, 8)


@pytest.mark.parametrize("operation", ["chat", "completions", "responses", "messages"])
def test_a_counted_prompt_replaces_the_byte_bound(operation: str) -> None:
    """A prompt counted as vLLM renders it (its /tokenize) is reserved at that count plus
    the completion cap: a chat whose bytes pass the budget still fits it."""
    long = "word " * 200
    payload = {"messages": [{"role": "user", "content": long}], "prompt": long, "max_tokens": 8}
    payload["max_output_tokens"] = 8  # Responses reads this one alone
    raw = body(payload)
    price = price_metered(operation, raw, MODEL, None, counted_prompt=42)
    assert price.cost == Cost(42, 8)
    assert price.rule == "prompt counted + completion cap"
    assert price_metered(operation, raw, MODEL, None).cost.prompt > 42


def test_a_counted_pooling_conversation_is_exact() -> None:
    """Embeddings given as messages: the counted conversation, not the whole context."""
    raw = body({"messages": [{"role": "user", "content": "hi"}]})
    assert price_metered("embeddings", raw, MODEL, None).cost == Cost(256)
    price = price_metered("embeddings", raw, MODEL, None, counted_prompt=9)
    assert (price.cost, price.exact) == (Cost(9), True)


def test_unknown_model_or_body_is_unpriced() -> None:
    """Nothing to price by (vLLM answers 404 or 400): one token of each kind reserved (so a
    spent budget refuses it), said so."""
    price = price_metered("chat", b"[", MODEL, None)
    assert (price.cost, price.rule.startswith("unpriced")) == (Cost(1, 1), True)
    assert price_metered("chat", b"{}", None, None).cost == Cost(1, 1)


@pytest.mark.parametrize(
    ("operation", "payload"),
    [
        ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
        ("completions", {"prompt": [1, 2, 3]}),
        ("embeddings", {"input": ["hi"] * 50}),
        ("generative_scoring", {"query": "q", "items": ["a", "b"]}),
    ],
)
def test_a_model_of_unknown_context_is_refused(operation: str, payload: dict[str, Any]) -> None:
    """A served model whose context the upstream did not report (``max_model_len`` 0) has
    no bound to price by: refused under a budget, not admitted for a token (vLLM serves
    it, so its work was unbounded)."""
    unknown = ServedModel("minilm", "minilm", 0, None, None)
    price = price_metered(operation, body(payload), unknown, None)
    assert price.refusal is not None
    assert "max_model_len" in price.refusal


def test_a_scoring_request_that_was_not_counted_is_bounded_or_refused() -> None:
    """No analysis at all (the count failed): refused, never one token. A request read but
    not counted is every sequence at the context; on a model of unknown context, refused."""
    assert price_scoring(None).refusal is not None
    request = parse_rerank({"query": "q", "documents": ["a", "b", "c"]})
    assert request is not None
    read = Analysis(request, MODEL, None, "not counted before forwarding")
    assert price_scoring(read).cost == Cost(4 * MODEL.max_model_len)
    unknown = ServedModel("minilm", "minilm", 0, None, None)
    assert price_scoring(Analysis(request, unknown, None)).refusal is not None
    assert price_scoring(Analysis(request, None, None)).cost == Cost(1, 1)  # vLLM's 404


def test_a_decision_is_bounded_per_question() -> None:
    """A structured decision reads once per question at most, each read a prompt within the
    context (one token per byte of the body at most) and a reply of at most two tokens; a
    body naming an image reads each question at the whole context."""
    decision = {
        "state": "the sky is blue",
        "questions": {"a": {"type": "yes_no"}, "b": {"type": "yes_no"}},
    }
    raw = body(decision)
    assert price_metered("decisions", raw, MODEL, None).cost == Cost(2 * len(raw), 4)
    seeing = body({**decision, "images": ["http://x/y.png"]})
    assert price_metered("decisions", seeing, MODEL, None).cost == Cost(2 * 256, 4)
    assert price_metered(
        "decisions", body({"state": "x", "questions": {}}), MODEL, None
    ).cost == Cost(1, 1)


def test_an_openai_decision_is_bounded_per_question_of_its_list() -> None:
    """``/v1/decisions`` (0.33+) lists its questions: each is a read, as on
    ``/v1/systemone`` (before, a list priced as no question: one token reserved)."""
    question = {"type": "predicate", "instructions": "?"}
    raw = body({"model": "m", "input": "the sky is blue", "questions": [question] * 3})
    assert price_metered("decisions", raw, MODEL, None).cost == Cost(3 * len(raw), 6)


@pytest.mark.parametrize(
    ("operation", "payload", "cost"),
    [
        ("completions", {"prompt": ["x", "y", "z"], "max_tokens": 10}, Cost(-1, 30)),
        ("completions", {"prompt": [1, 2, 3], "max_tokens": "10", "n": "2"}, Cost(3, 20)),
        ("completions", {"prompt": [1, 2, 3], "max_tokens": 10.0, "n": 2.0}, Cost(3, 20)),
        (
            "generate",
            {"token_ids": [1, 2], "sampling_params": {"n": 4, "max_tokens": 5}},
            Cost(2, 20),
        ),
        (
            "responses",
            {"input": "x", "previous_response_id": "resp_1", "max_output_tokens": 6},
            Cost(256, 6),
        ),
    ],
)
def test_what_vllm_reads_loosely_is_priced_as_vllm_runs_it(
    operation: str, payload: dict[str, Any], cost: Cost
) -> None:
    """Review: a batch of text prompts reserved one completion (the engine makes one per
    prompt); ``n`` and caps written as "8" or 8.0 (vLLM reads them as 8) reserved one
    choice, or the whole context; generate's ``sampling_params.n`` was not read; a
    Responses request continuing a stored conversation reserved its body's bytes, where
    the engine re-reads the conversation (up to the context)."""
    price = price_metered(operation, body(payload), MODEL, None)
    if cost.prompt < 0:  # a text prompt's bound: its bytes
        assert price.cost.completion == cost.completion
    else:
        assert price.cost == cost


def test_a_counted_text_prompt_is_the_exact_prompt_part() -> None:
    """A text generation prompt counted by the caller as vLLM renders it is the prompt
    part of the price, exact (the byte bound is not used)."""
    chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    price = price_metered("chat", body(chat), MODEL, None, counted_prompt=7)
    assert (price.cost.prompt, price.exact) == (7, True)
    assert price_metered("chat", body(chat), MODEL, None).cost.prompt == len(body(chat))


# Every field any route reads as a cap, and each route's own multipliers, from the table:
# a route is sent the caps of the others too (vLLM ignores a field its model lacks).
CAP_FIELDS = sorted(
    {f.name for fields in FIELDS.values() for f in fields.values() if f.reads in CAP_READS}
)
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/chat/completions/batch": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/inference/v1/generate": "generate",
    "/v2/embed": "embeddings",
    "/v1/embeddings": "embeddings",
    "/generative_scoring": "generative_scoring",
}
WORDS = st.lists(st.sampled_from(["hi", "there", "token", "x" * 30, "ünïcode"]), max_size=30)


@pytest.fixture(scope="module")
def engine(minilm_path: Path) -> FakeVLLM:
    """The fake vLLM at its worst, its engine read without a server (``engine_work``)."""
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    return FakeVLLM(tokenizer, minilm_path, version="0.32.0", to_cap=True)


@st.composite
def requests(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A body for ``path``: its prompt or lists, and a random choice of cap and multiplier
    fields (absent, null, or a count)."""
    text = " ".join(draw(WORDS))
    talk = [{"role": "user", "content": text}]
    many = draw(st.integers(1, 4))
    bodies: dict[str, dict[str, Any]] = {
        "/v1/chat/completions": {"messages": talk},
        "/v1/chat/completions/batch": {"messages": [talk] * many},
        "/v1/completions": {"prompt": draw(st.sampled_from([text, [text] * many, [5] * many]))},
        "/v1/responses": {"input": text},
        "/v1/messages": {"messages": talk},
        "/inference/v1/generate": {"token_ids": [7] * many, "sampling_params": {}},
        "/v2/embed": {"texts": [text] * many},
        "/v1/embeddings": draw(
            st.sampled_from([{"messages": [talk] * many}, {"input": [text] * many}])
        ),
        "/generative_scoring": {"query": text, "items": [text] * many, "label_token_ids": [1]},
    }
    payload = bodies[path]
    operation = ROUTES[path]
    multipliers = [f.name for f in FIELDS[operation].values() if f.reads is Reads.CHOICES]
    for name in draw(st.lists(st.sampled_from([*CAP_FIELDS, *multipliers]), unique=True)):
        low = 1 if name in multipliers else 0
        payload[name] = draw(st.none() | st.integers(low, 300))
    if path == "/inference/v1/generate":
        for name in draw(st.lists(st.sampled_from(["max_tokens", "n"]), unique=True)):
            payload["sampling_params"][name] = draw(st.integers(1, 300))
    if path in EMBEDDINGS_SHARED:  # the route shares its operation with the other one
        payload.update(draw(EMBEDDINGS_SHARED[path](text, many)))
    return payload


def _openai_embeddings(text: str, many: int) -> st.SearchStrategy[dict[str, Any]]:
    """/v1/embeddings: its truncation, and Cohere's lists (which its model ignores)."""
    return st.fixed_dictionaries(
        {}, optional={"truncate_prompt_tokens": st.integers(1, 300), "texts": st.just(["x"])}
    )


def _cohere_embed(text: str, many: int) -> st.SearchStrategy[dict[str, Any]]:
    """/v2/embed: OpenAI's truncation, which Cohere's request model does not have."""
    return st.fixed_dictionaries({}, optional={"truncate_prompt_tokens": st.integers(1, 300)})


EMBEDDINGS_SHARED = {"/v1/embeddings": _openai_embeddings, "/v2/embed": _cohere_embed}


@pytest.mark.parametrize("path", sorted(ROUTES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_reservation_is_below_the_engines_work(
    engine: FakeVLLM, minilm: HFTokenizer, path: str, data: st.DataObject
) -> None:
    """For every route, random combinations of its caps and multipliers (and the other
    routes' caps) never reserve less prompt, nor less completion, than the worst engine
    run vLLM 0.32.0 makes of the body reports (the prompt once per engine request, every
    output), nor more than the stated margin where it is exact; a body vLLM refuses (400)
    makes no work."""
    payload = data.draw(requests(path))
    served = ServedModel("minilm", "minilm", engine.max_model_len, None, None)
    price = price_metered(ROUTES[path], body(payload), served, minilm)
    try:
        work = engine.engine_work(path, payload)
    except EngineError:
        return
    prompt, generated = sum(w.prompt for w in work), sum(w.generated * w.outputs for w in work)
    assert price.refusal is None
    assert price.cost.prompt >= prompt
    assert price.cost.completion >= generated
    # the stated margins (docs/metering.md): none for token ids and counted texts, each
    # item's special tokens for generative scoring
    if path in ("/inference/v1/generate", "/v2/embed"):
        assert price.cost == Cost(prompt, generated)
    if path == "/generative_scoring":
        assert price.cost.prompt <= prompt + 2 * len(work)

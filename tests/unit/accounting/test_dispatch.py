"""Reading metered requests the way vLLM does: lax booleans, /invocations dispatch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.accounting.dispatch import (
    ECHO_MAX_BYTES,
    UNMETERED_FEATURES,
    Prepared,
    invocation_operation,
    lax_bool,
    model_task,
    prepare,
)
from proxy.accounting.operations import STREAMING_OPERATIONS
from proxy.accounting.routes import INVOCATIONS_PATH, operation_of
from proxy.accounting.shapes import ambiguity
from proxy.accounting.types import Family, Release


def test_request_rewrite_only_for_streams_without_usage() -> None:
    """include_usage is added to streamed chat/completions that lack it, nothing else."""
    body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    prepared = prepare("/v1/chat/completions", body)
    assert prepared.strip_usage
    assert prepared.streamed
    assert prepared.model == "m"
    assert json.loads(prepared.body)["stream_options"] == {"include_usage": True}
    asked = json.dumps({"stream": True, "stream_options": {"include_usage": True}}).encode()
    kept = prepare("/v1/completions", asked)
    assert (kept.body, kept.strip_usage, kept.streamed) == (asked, False, True)
    plain = json.dumps({"stream": False}).encode()
    assert prepare("/v1/chat/completions", plain).body == plain
    assert prepare("/v1/embeddings", body).body == body
    assert prepare("/v1/chat/completions", b"{oops").body == b"{oops"


def test_continuous_usage_asked_alone_is_not_sent() -> None:
    """Regression (issue #59): ``continuous_usage_stats`` without ``include_usage`` gives
    the client no usage in vLLM; sent beside the proxy's ``include_usage`` it gave every
    chunk one. The body sent asks for the last usage alone; a client that asked for both
    is sent as it came."""
    options = {"continuous_usage_stats": True}
    body = json.dumps({"stream": True, "messages": [], "stream_options": options}).encode()
    prepared = prepare("/v1/chat/completions", body)
    assert json.loads(prepared.body)["stream_options"] == {"include_usage": True}
    both = {"include_usage": True, "continuous_usage_stats": True}
    asked = json.dumps({"stream": True, "stream_options": both}).encode()
    assert prepare("/v1/completions", asked).body == asked


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        ("true", True),
        ("True", True),
        (1, True),
        ("1", True),
        ("yes", True),
        ("on", True),
        (False, False),
        ("false", False),
        (0, False),
        ("0", False),
        (None, False),
        ("maybe", False),
        (2, False),
        ([], False),
    ],
)
def test_lax_bool_reads_like_vllm(value: Any, expected: bool) -> None:
    """pydantic lax mode, as vLLM's request models: "true", 1, "1" are true."""
    assert lax_bool(value) is expected


@pytest.mark.parametrize("stream", ["true", 1, "1", "yes"])
def test_lax_stream_values_get_usage_injected(stream: Any) -> None:
    """Regression: "stream": "true" / 1 streamed without include_usage, so no record."""
    body = json.dumps({"stream": stream, "messages": []}).encode()
    prepared = prepare("/v1/chat/completions", body)
    assert prepared.streamed
    assert prepared.strip_usage
    assert json.loads(prepared.body)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("asked", ["true", 1])
def test_lax_include_usage_is_respected(asked: Any) -> None:
    """A client that asked for usage with a lax true keeps its usage chunk."""
    body = json.dumps({"stream": True, "stream_options": {"include_usage": asked}}).encode()
    prepared = prepare("/v1/chat/completions", body)
    assert prepared.streamed
    assert not prepared.strip_usage
    assert prepared.body == body


QUERY = "What is the capital of France?"


@pytest.mark.parametrize(
    ("body", "task", "operation"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "generate", "chat"),
        ({"prompt": "hi"}, "generate", "completions"),
        ({"input": "hi"}, "embed", "embeddings"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "embed", "embeddings"),
        ({"input": "hi"}, "classify", "classify"),
        ({"query": QUERY, "documents": ["a"]}, "embed", "rerank"),
        ({"text_1": QUERY, "text_2": ["a"]}, "embed", "score"),
        ({"queries": QUERY, "items": ["a"]}, "classify", "score"),
        ({"input": "hi"}, "token_embed", "pooling"),
        ({"messages": []}, None, "chat"),
        ({"input": "hi"}, None, "embeddings"),
        ({"query": QUERY, "documents": ["a"]}, None, "rerank"),
        ([1, 2], "embed", "other"),
    ],
)
def test_invocations_dispatch_like_vllm(body: Any, task: str | None, operation: str) -> None:
    """Generation types first, then the model's pooling task, then rerank, then score."""
    assert invocation_operation(body, task) == operation


def test_invocations_prepare_labels_the_operation() -> None:
    """/invocations gets the operation of the direct endpoint, and streams get usage."""
    chat = json.dumps({"model": "llm", "stream": "true", "messages": []}).encode()
    prepared = prepare("/invocations", chat, lambda name: "generate", "llm")
    assert (prepared.operation, prepared.model, prepared.strip_usage) == ("chat", "llm", True)
    assert json.loads(prepared.body)["model"] == "llm"  # the body sent is the client's
    embed = json.dumps({"input": "hi"}).encode()
    assert prepare("/invocations", embed, lambda name: "embed").operation == "embeddings"


def test_invocations_take_the_model_from_the_adapter_header_from_0_11_1() -> None:
    """Regression (review of #30): vLLM's ``inject_adapter_id`` sets the body's ``model``
    to the SageMaker adapter header, None without it, so the default model serves a body
    naming any other; the proxy recorded the body's name ("free-tier-model"). Before 0.11.1
    the body's model is vLLM's."""
    body = json.dumps({"model": "free-tier-model", "input": ["x"]}).encode()
    assert prepare("/invocations", body).model is None  # the default model
    assert prepare("/invocations", body, adapter="tuned").model == "tuned"
    legacy = prepare("/invocations", body, adapter="tuned", adapter_names_model=False)
    assert legacy.model == "free-tier-model"
    assert Release("0.11.1").invocations_model_from_header
    assert not Release("0.11.0").invocations_model_from_header
    assert Release("0.29.0").invocations_model_from_header
    assert Release(None).invocations_model_from_header


@pytest.mark.parametrize(
    "body",
    [
        {"query": QUERY, "documents": ["a"], "text_1": "q", "text_2": ["d"]},
        {"input": {"bad": 1}, "query": QUERY, "documents": ["a"]},
        {"messages": [], "prompt": "hi"},
        {"queries": "q", "documents": [{"not": "content"}], "text_1": "q", "text_2": ["d"]},
    ],
)
def test_an_invocation_naming_two_requests_inputs_is_refused(body: dict[str, Any]) -> None:
    """vLLM's /invocations runs the first request type that validates; a body with the
    inputs of two is the proxy's to refuse, not to guess."""
    prepared = prepare("/invocations", json.dumps(body).encode())
    assert prepared.ambiguous is not None
    single = {"query": QUERY, "documents": ["a"], "text_1": "q"}  # one whole request
    assert prepare("/invocations", json.dumps(single).encode()).ambiguous is None


def test_model_task_by_family() -> None:
    """The pooling task vLLM picks per family; a generative model generates."""
    assert model_task(Family.BI_ENCODER, generates=False) == "embed"
    assert model_task(Family.CROSS_ENCODER, generates=False) == "classify"
    assert model_task(Family.LATE_INTERACTION, generates=False) == "token_embed"
    assert model_task(None, generates=True) == "generate"
    assert model_task(None, generates=False) is None


def _as_before(path: str, body: bytes) -> Prepared:
    """The oracle: the decision taken on the whole body as ``json.loads`` reads it."""
    direct = operation_of(path)
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        return Prepared(body, direct or "other", None)
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    if not direct:  # vLLM's model is the adapter header's (none here): the default
        model = None
        if (unclear := ambiguity(payload, "invocations")) is not None:
            return Prepared(body, "other", None, ambiguous=unclear)
    operation = direct or invocation_operation(payload, None)
    if operation not in STREAMING_OPERATIONS or not lax_bool(payload.get("stream")):
        return Prepared(body, operation, model)
    options = payload.get("stream_options")
    if isinstance(options, dict) and lax_bool(options.get("include_usage")):
        return Prepared(body, operation, model, streamed=True)
    options = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    options.pop("continuous_usage_stats", None)  # vLLM reads them only with include_usage
    sent = json.dumps({**payload, "stream_options": options}).encode()
    return Prepared(sent, operation, model, streamed=True, strip_usage=True)


_LAX = st.sampled_from([True, False, "true", "false", 1, 0, "yes", None, "maybe", [], {}])
_FIELD_VALUES = st.one_of(
    _LAX,
    st.text(max_size=4),
    st.dictionaries(
        st.sampled_from(["include_usage", "continuous_usage_stats", "x"]), _LAX, max_size=3
    ),
    st.lists(st.text(max_size=3), max_size=3),
)
_FIELDS = st.lists(
    st.tuples(
        st.sampled_from(["model", "stream", "stream_options", "messages", "prompt", "input"]),
        _FIELD_VALUES,
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    path=st.sampled_from(
        ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", INVOCATIONS_PATH]
    ),
    fields=_FIELDS,
    form=st.sampled_from(["object", "bom", "list", "surrogate", "bad utf-8", "cut"]),
)
@example("/v1/chat/completions", [("stream", True), ("messages", ["a"])], "bom")
@example("/v1/chat/completions", [("stream", True), ("messages", ["a"])], "surrogate")
@example("/v1/chat/completions", [("stream", True), ("stream", False)], "object")
@example("/v1/chat/completions", [("model", "m"), ("stream", "1")], "bad utf-8")
def test_requests_are_read_as_from_the_whole_body(
    path: str, fields: list[tuple[str, Any]], form: str
) -> None:
    """Property: reading a direct endpoint's request for its deciding members only gives
    the decision and the body to send that the whole body, read by ``json.loads``, gives
    (repeated members, lax booleans, a BOM, lone surrogates, invalid UTF-8, truncation)."""
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in fields) + "}"
    if form == "list":
        text = f"[{text}]"
    elif form == "surrogate":
        text = text[:-1] + ("," if fields else "") + '"note":"\\ud800"}'
    elif form == "cut":
        text = text[: len(text) // 2]
    body = text.encode()
    if form == "bom":
        body = b"\xef\xbb\xbf" + body
    elif form == "bad utf-8":
        body = body[:-1] + (b"," if fields else b"") + b'"note":"\xff"}'
    assert prepare(path, body) == _as_before(path, body)


def _prepared(path: str, body: dict[str, Any], task: str | None = None) -> Prepared:
    return prepare(path, json.dumps(body).encode(), lambda _: task)


@pytest.mark.parametrize(
    ("path", "body", "task", "feature"),
    [
        ("/v1/completions", {"prompt": "hi", "use_beam_search": True}, None, "completions"),
        ("/v1/chat/completions", {"messages": [], "use_beam_search": "1"}, None, "chat"),
        ("/invocations", {"messages": [], "use_beam_search": 1}, "generate", "chat"),
        ("/invocations", {"prompt": "x", "use_beam_search": "true"}, "generate", "completions"),
    ],
)
def test_beam_search_is_a_feature_the_proxy_cannot_bill(
    path: str, body: dict[str, Any], task: str | None, feature: str
) -> None:
    """Issue #44 case 1: beam search (read as vLLM reads a lax bool) multiplies engine work
    beyond the usage, on every route that runs completions or chat."""
    assert _prepared(path, body, task).unbillable == f"{feature}.beam_search"
    assert _prepared(path, {**body, "use_beam_search": False}, task).unbillable is None
    assert f"{feature}.beam_search" in UNMETERED_FEATURES


@pytest.mark.parametrize("stream", [True, False])
def test_prompt_embeds_alone_dispatch_as_a_completion(stream: bool) -> None:
    """Issue #44 case 3: vLLM runs an /invocations body with ``prompt_embeds`` and no
    ``prompt`` as a completion (``--enable-prompt-embeds``); it was dispatched as
    ``other``, and a stream was not asked for its usage (nothing billed)."""
    prepared = _prepared("/invocations", {"prompt_embeds": "AAAA", "stream": stream}, "generate")
    assert (prepared.operation, prepared.streamed) == ("completions", stream)
    if stream:
        assert json.loads(prepared.body)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ({"request_id": "x" * (ECHO_MAX_BYTES - 2)}, None),
        ({"request_id": "x" * (ECHO_MAX_BYTES - 1)}, "request_id"),
        ({"request_id": "é" * (ECHO_MAX_BYTES // 2)}, "request_id"),  # UTF-8 bytes count
        (
            {"request_id": "r" * 1000, "return_prompt_text": "v" * ECHO_MAX_BYTES},
            "return_prompt_text",
        ),
        ({"metadata": {"k": "v" * ECHO_MAX_BYTES}, "user": "u" * ECHO_MAX_BYTES}, None),
    ],
)
def test_echoed_fields_are_bounded_together(body: dict[str, Any], refused: str | None) -> None:
    """Issue #44 case 2: what vLLM copies into every event of a stream is bounded before
    forwarding, so the event that carries the usage stays readable."""
    prepared = _prepared("/v1/chat/completions", {"messages": [], "stream": True, **body})
    assert (prepared.refusal.param if prepared.refusal else None) == refused


def test_a_chosen_response_id_is_refused_and_state_is_read() -> None:
    """Issue #44 cases 6-8: a Responses ``request_id`` is refused (the proxy mints ids);
    ``previous_response_id`` and the client's ``cache_salt`` are read for the proxy to
    check and combine; ``n`` is how often the engine reads the prompt."""
    chosen = _prepared("/v1/responses", {"input": "x", "request_id": "resp_1"})
    assert chosen.refusal is not None
    assert chosen.refusal.param == "request_id"
    state = _prepared("/v1/responses", {"previous_response_id": "resp_2", "cache_salt": "s"})
    assert (state.refusal, state.previous_response_id, state.cache_salt) == (None, "resp_2", "s")
    assert _prepared("/v1/chat/completions", {"n": "3"}).copies == 3
    assert _prepared("/v1/chat/completions", {"n": "x"}).copies == 1
    generate = _prepared("/inference/v1/generate", {"sampling_params": {"n": 2}})
    assert generate.copies == 2
    assert _prepared("/v1/embeddings", {"n": 4}).copies == 1


def test_every_multiplying_field_of_the_table_is_enforced() -> None:
    """A field the table says multiplies engine work has a check here and a feature name
    --allow-unmetered takes: a new one is a failing test, not a door."""
    from proxy.accounting.dispatch import MULTIPLIERS, MULTIPLYING

    for fields in MULTIPLYING.values():
        for field in fields:
            assert field.name in MULTIPLIERS
            assert field.feature in UNMETERED_FEATURES


@pytest.mark.parametrize(
    ("body", "feature"),
    [
        ({"best_of": 4, "n": 1}, "completions.best_of"),
        ({"best_of": "3"}, "completions.best_of"),
        ({"best_of": 2, "n": 2}, None),
        ({"best_of": None}, None),
    ],
)
def test_best_of_beyond_n_is_a_feature_the_proxy_cannot_bill(
    body: dict[str, Any], feature: str | None
) -> None:
    """The V0 engine (to 0.10) made best_of sequences and the usage counted the n it
    returned: refused unless allowed."""
    assert _prepared("/v1/completions", {"prompt": "x", **body}).unbillable == feature


def test_every_echoed_field_of_an_operation_is_bounded() -> None:
    """The bound counts the Responses fields vLLM copies into its events (text, reasoning,
    metadata...), each read from the body."""
    body = {"input": "x", "text": {"format": {"type": "json_schema", "schema": "s" * 70000}}}
    refused = _prepared("/v1/responses", body).refusal
    assert refused is not None
    assert refused.param == "text"


def test_a_direct_request_reads_every_field_the_table_bounds_or_refuses() -> None:
    """The members read from a direct endpoint's body include each echoed and each
    multiplying field of its operation in the field table, so a new one is read, never
    passed unseen."""
    from proxy.accounting.dispatch import ECHOED_ALL, HEADS, MULTIPLYING

    for operation, names in ECHOED_ALL.items():
        assert set(names) <= set(HEADS[operation].model_fields)
    for operation, fields in MULTIPLYING.items():
        assert {f.name for f in fields} <= set(HEADS[operation].model_fields)


def test_a_responses_prompt_and_all_echoes_are_bounded() -> None:
    """Review: the Responses ``prompt`` (a stored prompt's id and variables) is copied into
    every Response event but never rendered into the engine's prompt: bounded as an echo.
    Billed echoes (instructions, tools: rendered only as far as the template renders
    them) are bounded together at 1 MiB."""
    from proxy.accounting.dispatch import ECHO_ALL_MAX_BYTES

    prompt = _prepared("/v1/responses", {"input": "x", "prompt": {"id": "A" * 70_000}})
    assert prompt.refusal is not None
    assert prompt.refusal.param == "prompt"
    tools = [{"type": "function", "name": "f", "description": "d" * ECHO_ALL_MAX_BYTES}]
    many = _prepared("/v1/responses", {"input": "x", "tools": tools})
    assert many.refusal is not None
    assert many.refusal.param == "tools"
    assert _prepared("/v1/responses", {"input": "x", "tools": tools[:0]}).refusal is None


def test_a_body_nested_deeper_than_the_proxy_reads_is_refused() -> None:
    """Review: a body the proxy's parser cannot read for its depth alone (a newer Python,
    as vLLM's images run, reads deeper) was forwarded with no check at all (beam search,
    echo bounds, ownership); it is refused. Other unreadable bodies are vLLM's to refuse."""
    deep = b'{"use_beam_search": true, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    refused = prepare("/v1/completions", deep).refusal
    assert refused is not None
    assert refused.param == "body"
    assert prepare("/v1/completions", b"{oops").refusal is None

"""What admission reads of a body: each route's cap, outputs, conversations and lists as
vLLM's request model reads them, named by the field table; media on the parsed body. The
caps and defaults are held to every release's request models (their defaults read from the
wheels into tests/data/vllm_request_fields.json by scripts/vllm_fields.py)."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.accounting.fieldkinds import Field, Reads
from proxy.accounting.operations import Operation
from proxy.accounting.routes import BY_PATH, INVOCATIONS_PATH
from proxy.limits.reading import choices, completion_cap, conversations, each, media, reading

TABLE = json.loads((Path(__file__).parents[2] / "data" / "vllm_request_fields.json").read_text())
RELEASES: dict[str, dict[str, Any]] = TABLE["releases"]
REQUIRED = {"required": True}  # the table's mark of a field without a default
REFUSED = "refused"  # vLLM answers 400: a required field is absent
LISTS = (Reads.EACH, Reads.PROMPTS, Reads.CONVERSATIONS)


@pytest.mark.parametrize(
    ("operation", "payload", "cap"),
    [
        ("chat", {"max_completion_tokens": 5, "max_tokens": 9}, 5),
        ("chat", {"max_completion_tokens": None, "max_tokens": 9}, 9),
        ("chat", {"max_output_tokens": 1}, None),
        ("completions", {}, 16),
        ("completions", {"max_tokens": None}, None),
        ("completions", {"max_completion_tokens": 1, "max_tokens": 250}, 250),
        ("responses", {"max_tokens": 1}, None),
        ("responses", {"max_output_tokens": "7"}, 7),
        ("messages", {"max_tokens": 250, "max_completion_tokens": 1}, 250),
        ("generate", {"max_tokens": 1, "sampling_params": {"max_tokens": 250}}, 250),
        ("generate", {"max_tokens": 1}, None),
    ],
)
def test_the_cap_is_the_field_the_route_reads(
    operation: str, payload: dict[str, Any], cap: int | None
) -> None:
    """One field per route (chat: max_completion_tokens, else max_tokens), its default
    when absent (completions: 16), null as no cap; other routes' fields are ignored."""
    assert completion_cap(operation, payload) == cap


def test_the_table_names_a_cap_for_every_generating_route() -> None:
    """Every generating operation has a cap the pricing reads (a field or SamplingParams)."""
    for operation in ("chat", "completions", "responses", "messages", "generate"):
        assert reading(operation, Reads.CAP) or reading(operation, Reads.SAMPLING), operation


def test_outputs_are_the_largest_multiplier() -> None:
    """``n`` and ``best_of`` (the largest), or generate's ``sampling_params.n``; a field
    the route lacks counts nothing."""
    assert choices("completions", {"n": 2, "best_of": "3"}) == 3
    assert choices("generate", {"n": 9, "sampling_params": {"n": 4}}) == 4
    assert choices("messages", {"n": 9}) == 1


def test_conversations_and_lists() -> None:
    """A list of conversations is one engine request each; one conversation is one; Cohere's
    lists by name."""
    talk = [{"role": "user", "content": "hi"}]
    assert conversations("chat", {"messages": [talk, talk]}) == [talk, talk]
    assert conversations("chat", {"messages": talk}) == [talk]
    assert conversations("classify", {"messages": talk}) is None
    assert each("embeddings", {"texts": ["a", "b"], "images": "x"}) == {
        "texts": ["a", "b"],
        "images": ["x"],
    }


def test_media_is_found_as_a_json_parser_reads_it() -> None:
    """An escaped member name is the plain one once parsed; a typed part, or a media member
    without a type, is one part each."""
    raw = b'{"content": [{"type": "\\u0069mage_url", "\\u0069mage_url": {"url": "u"}}]}'
    assert media(json.loads(raw)) == 1
    parts = [{"type": "input_image"}, {"input_audio": {}}, {"type": "text", "text": "image"}]
    assert media({"input": [{"content": parts}]}) == 2


def priced_routes(entry: dict[str, Any]) -> Iterator[tuple[str, str, Operation]]:
    """(path, body class, operation) of each route of a release that the price reads;
    /invocations' classes are each some route's, checked there."""
    for path, models in entry["routes"].items():
        route = BY_PATH.get(path)
        if route is not None and path != INVOCATIONS_PATH:
            for model in models:
                yield path, model, route.operation


def engine_cap(fields: tuple[Field, ...], defaults: dict[str, Any], payload: dict[str, Any]) -> Any:
    """The cap vLLM's model gives a body holding only ``payload``'s (null) caps: the first
    field not null, an absent one at the release's default; None: what the context leaves."""
    for field in fields:
        value = payload[field.name] if field.name in payload else defaults.get(field.name)
        if value == REQUIRED:
            return REFUSED
        if value is not None:
            return value
    return None


def cap_disagreements(where: str, op: Operation, defaults: dict[str, Any]) -> Iterator[str]:
    """The price's cap against the release's, for each body whose caps are absent or null."""
    fields = (*reading(op, Reads.CAP), *reading(op, Reads.CAP_FALLBACK))
    for nulls in itertools.product((False, True), repeat=len(fields)):
        payload = {f.name: None for f, null in zip(fields, nulls, strict=True) if null}
        engine = engine_cap(fields, defaults, payload)
        priced = completion_cap(op, payload)
        if engine != REFUSED and priced != engine:
            yield f"{where} {payload}: the price's cap {priced}, vLLM's {engine}"
    for field in reading(op, Reads.SAMPLING):
        if defaults.get(field.name) not in (None, REQUIRED):
            yield f"{where}.{field.name}: absent is {defaults[field.name]}, the price reads none"


def multiplier_disagreements(where: str, op: Operation, defaults: dict[str, Any]) -> Iterator[str]:
    """Outputs of a body without the CHOICES fields; no engine request for an absent list."""
    outputs = [defaults.get(f.name) for f in reading(op, Reads.CHOICES)]
    if REQUIRED not in outputs:
        engine = max([1, *(n for n in outputs if n is not None)])
        if choices(op, {}) != engine:
            yield f"{where}: the price's outputs {choices(op, {})}, vLLM's {engine}"
    for field in (f for reads in LISTS for f in reading(op, reads)):
        if defaults.get(field.name) not in (None, REQUIRED):
            yield f"{where}.{field.name}: absent is {defaults[field.name]}, the price reads none"


def disagreements(release: str, entry: dict[str, Any]) -> list[str]:
    """Where the price's caps and multipliers read a body otherwise than the release's
    request models do: a cap field the model lacks (vLLM ignores it), a default the table
    does not hold, or an absent (or null) field priced otherwise than its default."""
    found: list[str] = []
    for path, model, op in priced_routes(entry):
        where, defaults = f"{release} {path} {model}", entry.get("defaults", {}).get(model, {})
        for reads in (Reads.CAP, Reads.CAP_FALLBACK, Reads.SAMPLING):
            missing = [f.name for f in reading(op, reads) if f.name not in entry["models"][model]]
            found += [f"{where}.{name}: the price reads a cap vLLM ignores" for name in missing]
        for field in (f for reads in Reads for f in reading(op, reads)):
            if field.name in entry["models"][model] and field.name not in defaults:
                found.append(f"{where}.{field.name}: no default in the table (regenerate it)")
        found += cap_disagreements(where, op, defaults)
        found += multiplier_disagreements(where, op, defaults)
    return found


@pytest.mark.parametrize("release", list(RELEASES))
def test_the_price_reads_every_release_as_its_request_models(release: str) -> None:
    """For every route of the release, the cap the price reads of a body whose caps are
    absent or null is the release's (completions' 16, chat's and Responses' none, Messages'
    required), its outputs the default n, an absent list none: the defaults read from the
    release's wheel, not a second list."""
    assert disagreements(release, RELEASES[release]) == []


def test_every_release_states_the_defaults_the_price_assumes() -> None:
    """The table is not vacuous: every release has completions' default cap (16), and the
    checks above cover chat, completions, Responses, Messages and generate where served."""
    for entry in RELEASES.values():
        assert entry["defaults"]["CompletionRequest"]["max_tokens"] == 16
    served = {op for entry in RELEASES.values() for _, _, op in priced_routes(entry)}
    assert {"chat", "completions", "responses", "messages", "generate"} <= served


@pytest.mark.parametrize(
    ("model", "name", "default", "found"),
    [
        (
            "CompletionRequest",
            "max_tokens",
            32,
            "0.32.0 /v1/completions CompletionRequest {}: the price's cap 16, vLLM's 32",
        ),
        (
            "ChatCompletionRequest",
            "max_tokens",
            64,
            "0.32.0 /v1/chat/completions ChatCompletionRequest {}: the price's cap None, vLLM's 64",
        ),
        (
            "ChatCompletionRequest",
            "n",
            2,
            "0.32.0 /v1/chat/completions ChatCompletionRequest: the price's outputs 1, vLLM's 2",
        ),
        (
            "GenerateRequest",
            "sampling_params",
            {"factory": True},
            "0.32.0 /inference/v1/generate GenerateRequest.sampling_params: absent is "
            "{'factory': True}, the price reads none",
        ),
    ],
)
def test_a_default_the_price_does_not_assume_is_named(
    model: str, name: str, default: Any, found: str
) -> None:
    """The check can fail: a copy of 0.32.0's entry with one default changed is reported
    with release, route, class and the two readings."""
    entry = copy.deepcopy(RELEASES["0.32.0"])
    entry["defaults"][model][name] = default
    assert found in disagreements("0.32.0", entry)


def test_a_cap_the_release_lacks_or_a_default_not_recorded_is_named() -> None:
    """A cap field the release's model does not have is one vLLM ignores (the issue's
    'caps read from fields the route does not have'), and a field without a recorded
    default cannot be checked: both are named."""
    entry = copy.deepcopy(RELEASES["0.32.0"])
    entry["models"]["ResponsesRequest"].remove("max_output_tokens")
    del entry["defaults"]["CompletionRequest"]["max_tokens"]
    found = disagreements("0.32.0", entry)
    assert (
        "0.32.0 /v1/responses ResponsesRequest.max_output_tokens: the price reads a cap vLLM "
        "ignores" in found
    )
    assert (
        "0.32.0 /v1/completions CompletionRequest.max_tokens: no default in the table "
        "(regenerate it)" in found
    )

"""What the real-vLLM suite sends and where: the model families and their servers, the
request cases of the matrix, and the report the session prints at its end."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scripts.vllm_cpu import E2E_VERSIONS, Process

VERSIONS = E2E_VERSIONS
# Start-up has its own budget and concurrency (see conftest.py); TIMINGS collects what the
# session report prints.
STARTUP_BUDGET_S = float(os.environ.get("E2E_STARTUP_BUDGET", "900"))
START_CONCURRENCY = int(os.environ.get("E2E_START_CONCURRENCY", "3"))
TIMINGS: dict[str, float] = {}
# conftest's ``generating``: starts a generating vLLM 0.32.0, ``(logs, context, *extra,
# env=...)``, as a context manager
StartGenerate = Callable[..., contextlib.AbstractContextManager[Process]]

FAMILIES = ("bi-encoder", "cross-encoder", "late-interaction")
MODEL_NAMES = {
    "bi-encoder": "minilm",
    "cross-encoder": "tiny-ce",
    "late-interaction": "tiny-colbert",
}


@dataclass(frozen=True)
class Pair:
    """One vLLM server and the proxy (rewrite mode) in front of it."""

    vllm: str
    proxy: str
    model: str


@dataclass(frozen=True)
class Cluster:
    pairs: dict[tuple[str, str], Pair]
    timings: dict[str, float]


Q = "What is the capital of France?"
Q2 = "Where is the Eiffel Tower?"
Q3 = "Which city is in Germany?"
DOCS = ["Paris is the capital of France.", "The Eiffel Tower is in Paris.", "Berlin is in Germany."]
LONG = "The capital of France is Paris. " * 25
HANGUL_Q = "대한민국의 수도는 어디입니까"
HANGUL_DOCS = [
    "서울은 대한민국의 수도입니다",
    "부산은 항구 도시입니다",
    "제주도는 섬입니다",
    "평양",
]
UNICODE = [
    "Ça coûte 5 € — naïve façade",
    "東京は日本の首都です",
    "🙂🚀 emoji only",
    "Ελληνικά κείμενα",
]


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: Any
    # max_tokens_per_* on multi-token characters: 0.29 cuts once, 0.31+ iterates (spec 5)
    versions_may_differ: bool = False


CASES = [
    Case("rerank-1toN", "/rerank", {"query": Q, "documents": DOCS}),
    Case("v1-rerank-top_n", "/v1/rerank", {"query": Q, "documents": DOCS, "top_n": 2}),
    Case("v2-rerank-1to1-str", "/v2/rerank", {"query": Q, "documents": DOCS[0]}),
    Case("score-1to1", "/score", {"text_1": Q, "text_2": DOCS[0]}),
    Case("v1-score-1toN-list", "/v1/score", {"text_1": [Q], "text_2": DOCS}),
    Case("score-NtoN", "/score", {"text_1": [Q, Q2], "text_2": DOCS[:2]}),
    Case("score-data", "/score", {"data_1": Q, "data_2": DOCS}),
    Case("score-queries-documents", "/v1/score", {"queries": Q, "documents": DOCS}),
    Case("score-queries-items-NtoN", "/score", {"queries": [Q, Q2, Q3], "items": DOCS}),
    Case("invocations-rerank", "/invocations", {"query": Q, "documents": DOCS}),
    Case("invocations-score", "/invocations", {"text_1": Q, "text_2": DOCS}),
    Case("empty-and-blank-docs", "/rerank", {"query": Q, "documents": ["", "   ", DOCS[0]]}),
    Case("long-docs", "/rerank", {"query": Q, "documents": [LONG, LONG[:90], DOCS[2]]}),
    Case("unicode", "/rerank", {"query": "Où est la tour Eiffel? 🗼", "documents": UNICODE}),
    Case("tpt-5", "/rerank", {"query": Q, "documents": DOCS, "truncate_prompt_tokens": 5}),
    Case("tpt-minus1", "/score", {"text_1": Q, "text_2": [LONG], "truncate_prompt_tokens": -1}),
    Case("tpt-null", "/rerank", {"query": Q, "documents": DOCS, "truncate_prompt_tokens": None}),
    Case(
        "tpt-left",
        "/rerank",
        {
            "query": Q,
            "documents": [LONG, DOCS[1]],
            "truncate_prompt_tokens": 12,
            "truncation_side": "left",
        },
    ),
    Case(
        "tpt-right",
        "/score",
        {
            "text_1": [Q, Q2],
            "text_2": [LONG, DOCS[1]],
            "truncate_prompt_tokens": 7,
            "truncation_side": "right",
        },
    ),
    Case(
        "tpt-long-no-side",
        "/rerank",
        {"query": LONG, "documents": [LONG, LONG + LONG], "truncate_prompt_tokens": 100},
    ),
    Case("max-per-query", "/rerank", {"query": LONG, "documents": DOCS, "max_tokens_per_query": 5}),
    Case(
        "max-per-doc",
        "/rerank",
        {"query": Q, "documents": [LONG, DOCS[0]], "max_tokens_per_doc": 10},
    ),
    Case(
        "max-both",
        "/rerank",
        {
            "query": Q * 20,
            "documents": [LONG],
            "max_tokens_per_query": 10,
            "max_tokens_per_doc": 10,
        },
    ),
    Case(
        "max-both-hangul",
        "/rerank",
        {
            "query": HANGUL_Q,
            "documents": HANGUL_DOCS,
            "max_tokens_per_query": 3,
            "max_tokens_per_doc": 4,
        },
        versions_may_differ=True,
    ),
    Case(
        "max-doc-emoji",
        "/score",
        {"text_1": Q, "text_2": UNICODE, "max_tokens_per_doc": 3},
        versions_may_differ=True,
    ),
    Case(
        "padding-max-length",
        "/rerank",
        {"query": Q, "documents": DOCS[:2], "padding": "max_length"},
    ),
    Case("padding-do-not-pad", "/score", {"text_1": Q, "text_2": DOCS, "padding": "do_not_pad"}),
    Case("err-too-long", "/rerank", {"query": Q, "documents": ["word " * 600]}),
    Case("err-bad-pairing", "/score", {"text_1": [Q, Q2], "text_2": DOCS}),
    Case("err-unknown-model", "/rerank", {"model": "nope", "query": Q, "documents": DOCS}),
    Case("err-invalid-json", "/v1/score", b'{"text_1": "a", '),
    Case(
        "err-tpt-too-big", "/rerank", {"query": Q, "documents": DOCS, "truncate_prompt_tokens": 300}
    ),
    Case("err-empty-documents", "/rerank", {"query": Q, "documents": []}),
]

REPORT: list[dict[str, Any]] = []

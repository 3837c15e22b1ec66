"""The proxy against real vLLM CPU servers: bills what the 0.29.0 engine processed (its own
``vllm:prompt_tokens_total``), changes nothing in front of 0.32.0, never alters status or
scores. Requests run one at a time so the metric delta belongs to one request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from scripts.vllm_cpu import metric, post
from tests.e2e.conftest import FAMILIES, Cluster

pytestmark = pytest.mark.e2e

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


def _with_model(body: Any, model: str) -> Any:
    if isinstance(body, dict) and "model" not in body:
        return {"model": model, **body}
    return body


def _stable(raw: bytes) -> Any:
    """A response without its per-request id and creation time."""
    body = json.loads(raw)
    if isinstance(body, dict):
        body.pop("id", None)
        body.pop("created", None)
    return body


def _scores(body: dict[str, Any]) -> list[tuple[int, float]]:
    if "results" in body:
        return [(r["index"], r["relevance_score"]) for r in body["results"]]
    return [(d["index"], d["score"]) for d in body["data"]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matrix(cluster: Cluster, family: str, case: Case) -> None:
    """One request through both proxies and straight to both servers."""
    old = cluster.pairs[(family, "0.29.0")]
    new = cluster.pairs[(family, "0.32.0")]
    body = _with_model(case.body, old.model)

    before = metric(old.vllm)
    status, headers, raw = post(old.proxy + case.path, body)
    processed = int(metric(old.vllm) - before)
    direct_status, _, direct_raw = post(old.vllm + case.path, body)
    new_status, _, new_raw = post(new.vllm + case.path, body)
    proxied_new_status, new_headers, proxied_new_raw = post(new.proxy + case.path, body)

    assert status == direct_status
    assert proxied_new_status == new_status
    if status != 200:
        assert processed == 0
        assert "x-usage-verdict" not in headers
        assert json.loads(raw)["error"]["type"] == json.loads(direct_raw)["error"]["type"]
        REPORT.append({"family": family, "case": case.name, "status": status})
        return

    got, direct = json.loads(raw), json.loads(direct_raw)
    billed = got["usage"]["prompt_tokens"]
    reported_old = int(headers["x-usage-upstream-prompt-tokens"])
    reported_new = json.loads(new_raw)["usage"]["prompt_tokens"]
    REPORT.append(
        {
            "family": family,
            "case": case.name,
            "status": status,
            "reported_0_29": reported_old,
            "processed_0_29": processed,
            "billed": billed,
            "reported_0_32": reported_new,
            "verdict": headers["x-usage-verdict"],
        }
    )
    # The guarantee: what the client is billed is what the 0.29 engine processed.
    assert billed == processed
    assert got["usage"]["total_tokens"] == processed
    assert headers["x-usage-verdict"] in ("corrected", "exact")
    if family == "cross-encoder":
        assert headers["x-usage-verdict"] == "exact"
    if not case.versions_may_differ:
        assert billed == reported_new
    # Results and scores unchanged (same model, same request, same server).
    assert [i for i, _ in _scores(got)] == [i for i, _ in _scores(direct)]
    assert [s for _, s in _scores(got)] == pytest.approx([s for _, s in _scores(direct)], rel=1e-5)
    # In front of the fixed release nothing changes and every verdict is exact.
    assert new_headers["x-usage-verdict"] == "exact"
    assert _stable(proxied_new_raw)["usage"] == _stable(new_raw)["usage"]
    assert list(_stable(proxied_new_raw)) == list(_stable(new_raw))

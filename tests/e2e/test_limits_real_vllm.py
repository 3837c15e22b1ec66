"""Limits against real vLLM 0.29.0 (issue #38): a 1:N bi-encoder rerank, which that
release *reports* as N*Q + N*p + sum(D), is charged to the tenant's budget at the engine's
own count (the growth of ``vllm:prompt_tokens_total``), and the budget admits requests by
that count. Not run by the helper that wrote it (the real-vLLM suite is the lead's to run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.vllm_cpu import metric, post, start_proxy
from tests.e2e.cases import Cluster

pytestmark = pytest.mark.e2e

RERANK = {
    "model": "minilm",
    "query": "What is the capital of France?",
    "documents": [
        "Paris is the capital and largest city of France.",
        "The Eiffel Tower is a landmark in Paris.",
        "Berlin is the capital of Germany.",
        "Lyon is known for its cuisine.",
    ],
}


def test_a_budget_is_charged_the_engine_count_not_the_inflated_report(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Each admitted rerank takes from the budget exactly what the 0.29.0 engine
    processed, less than it reported; the budget refuses (429, nothing processed) only
    once the engine counts, not the reports, have spent it."""
    vllm = cluster.pairs[("bi-encoder", "0.29.0")].vllm
    before = metric(vllm)
    status, _, raw = post(vllm + "/rerank", RERANK)
    assert status == 200
    engine = int(metric(vllm) - before)
    reported = json.loads(raw)["usage"]["prompt_tokens"]
    assert engine < reported  # the pre-0.30 inflation this test is about

    fits = 3  # the budget holds three reranks at the engine count, fewer at the report
    limits = tmp_path / "limits.yaml"
    limits.write_text(f"default: {{prompt_tokens_per_month: {fits * engine}}}\n")
    proxy = start_proxy(
        vllm, tmp_path, "--limits", str(limits), "--journal", str(tmp_path / "j.sqlite")
    )
    try:
        proxy.wait_ready("/readyz", 60)
        for i in range(fits):
            before = metric(vllm)
            status, headers, raw = post(proxy.url + "/rerank", RERANK)
            assert status == 200, raw
            assert int(metric(vllm) - before) == engine
            assert int(headers["x-ratelimit-remaining-tokens"]) == (fits - 1 - i) * engine
        before = metric(vllm)
        status, headers, raw = post(proxy.url + "/rerank", RERANK)
        assert status == 429, raw
        assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"
        assert headers["x-should-retry"] == "false"
        assert metric(vllm) == before  # refused before the engine did any work
    finally:
        proxy.stop()

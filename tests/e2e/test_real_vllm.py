"""The proxy against real vLLM CPU servers: bills what the 0.29.0 engine processed (its own
``vllm:prompt_tokens_total``), changes nothing in front of 0.32.0, never alters status or
scores. Requests run one at a time so the metric delta belongs to one request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scripts.vllm_cpu import metric, post
from tests.e2e.cases import CASES, FAMILIES, REPORT, Case, Cluster

pytestmark = pytest.mark.e2e


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

    assert status == direct_status, raw
    assert proxied_new_status == new_status, proxied_new_raw
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

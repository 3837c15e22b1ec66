"""The ledger as a whole against real vLLM (issue #10): a mixed, concurrent workload through
a proxy with an API-key map gives one record per upstream exchange, billed to the key's
tenant, summing to exactly the growth of the engine's own ``vllm:prompt_tokens_total``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.journal_files import read_journal
from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import metric, start_proxy
from tests.e2e.cases import CASES, DOCS, Cluster, Q

pytestmark = pytest.mark.e2e

KEYS = {"acme": "sk-acme-e2e", "beta": "sk-beta-e2e"}
EXTRA = [
    ("/v1/embeddings", {"input": [Q, *DOCS]}),
    ("/v1/embeddings", {"input": "single text", "model": ""}),
    ("/invocations", {"input": ["embedded through invocations"]}),
    ("/invocations", {"query": Q, "documents": DOCS}),
    ("/invocations", {"text_1": [Q, Q], "text_2": DOCS[:2]}),
    ("/rerank", {"query": Q, "documents": DOCS, "model": ""}),
    ("/v1/score", {"queries": Q, "items": DOCS}),
    # vLLM's server decodes an encoded slash before routing: these are rerank and embeddings
    ("/v1%2Frerank", {"query": Q, "documents": DOCS}),
    ("/v1%2Fembeddings", {"input": [Q, *DOCS]}),
    # Hostile spellings (issue #26): each is the endpoint vLLM serves for it, billed as it
    ("/x/../rerank", {"query": Q, "documents": DOCS}),
    ("/v1/%2e/embeddings", {"input": [Q, *DOCS]}),
    ("/v1/rerank/", {"query": Q, "documents": DOCS}),
    ("/v1/embeddings", {"input": [Q, *DOCS], "encoding_format": "bytes"}),
    ("/invocations", {"input": [Q, "as raw tensors"], "encoding_format": "bytes"}),
    # Refused before vLLM: no usage would come back, or not an endpoint at all
    ("/v1/embeddings", {"input": [Q], "encoding_format": "bytes_only"}),
    ("/v1/audio/transcriptions", {}),
    ("/v1/%2e%2e/no-such-endpoint", {"input": [Q]}),
]


@pytest.fixture(scope="module")
def keyed_proxies(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One more proxy per release, with a key map and its own journal, in front of the
    bi-encoder servers of the cluster."""
    work = tmp_path_factory.mktemp("mixed")
    keys = work / "keys.yaml"
    keys.write_text("".join(f"{t}: {key_digest(k)}\n" for t, k in KEYS.items()))
    proxies = {}
    for version in ("0.29.0", "0.32.0"):
        pair = cluster.pairs[("bi-encoder", version)]
        journal = work / f"journal-{version}.sqlite"
        proxy = start_proxy(pair.vllm, work, "--api-keys", str(keys), "--journal", str(journal))
        proxies[version] = (pair, proxy, journal)
    for _, proxy, _ in proxies.values():
        proxy.wait_ready("/readyz", 60)
    yield proxies
    for _, proxy, _ in proxies.values():
        proxy.stop()


def send(url: str, path: str, body: Any, tenant: str, same_id: bool) -> tuple[int, str | None]:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    if same_id:
        headers["X-Request-Id"] = "constant-client-id"
    status, answer_headers, _ = post_with_headers(url + path, body, headers)
    return status, answer_headers.get("x-usage-record-id")


def post_with_headers(url: str, body: Any, headers: dict[str, str]) -> Any:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0"])
def test_mixed_concurrent_workload_sums_to_the_engine_counter(
    keyed_proxies: Any, version: str
) -> None:
    """Every shape, embeddings, /invocations, default model; four concurrent clients, one
    of them always sending the same X-Request-Id; two tenants by key."""
    pair, proxy, journal = keyed_proxies[version]
    work = [
        (case.path, {"model": pair.model, **case.body})
        for case in CASES
        if isinstance(case.body, dict)
    ]
    work += EXTRA
    jobs = [
        (path, body, "acme" if i % 2 else "beta", i % 4 == 0)
        for i, (path, body) in enumerate(work * 2)
    ]
    before = metric(pair.vllm)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda job: send(proxy.url, *job), jobs))
    grown = int(metric(pair.vllm) - before)
    records = [json.loads(b) for b in read_journal(Path(journal))]
    ok = [(job, rid) for job, (status, rid) in zip(jobs, answers, strict=True) if status == 200]
    assert len(ok) > len(jobs) // 2  # most of the matrix is valid input
    assert sorted(r["record_id"] for r in records) == sorted(rid for _, rid in ok)
    tenant_of = {rid: job[2] for job, rid in ok}
    assert all(r["tenant"] == tenant_of[r["record_id"]] for r in records)
    assert all(r["verdict"] in ("exact", "corrected", "reported") for r in records)
    billed = sum(r["prompt_tokens_billed"] for r in records)
    print(
        f"mixed workload {version}: {len(jobs)} requests, {len(ok)} answered 200, "
        f"{len(records)} records, billed {billed}, engine counter grew {grown}"
    )
    assert billed == grown
    before = metric(pair.vllm)
    status, _, body = post_with_headers(proxy.url + "/rerank", {"query": Q, "documents": DOCS}, {})
    assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
    assert metric(pair.vllm) == before  # refused without a key: never reached vLLM

    # The closed loop: the windows covering the workload show no drift; a request sent
    # straight to vLLM shows up as unbilled tokens equal to its engine count.
    settled = windows_covering(journal, 0, grown)
    assert sum(w["unbilled_prompt_tokens"] + w["overbilled_prompt_tokens"] for w in settled) == 0
    if version == "0.29.0":
        assert sum(w["reported_prompt_tokens"] for w in settled) > grown
    before = metric(pair.vllm)
    status, _, _ = post_with_headers(pair.vllm + "/rerank", {"query": Q, "documents": DOCS}, {})
    assert status == 200
    bypassed = int(metric(pair.vllm) - before)
    later = windows_covering(journal, len(settled), bypassed)
    assert sum(w["unbilled_prompt_tokens"] for w in later) == bypassed
    print(f"reconcile {version}: {len(settled)} windows, 0 drift; bypass {bypassed} unbilled")


def windows_covering(
    journal: Path, skip: int, engine: int, seconds: float = 30
) -> list[dict[str, Any]]:
    """The reconciliation windows after the first ``skip`` once they account for
    ``engine`` tokens of engine growth (the proxy reads every 0.5 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        windows = [json.loads(b) for b in read_journal(journal, kind="reconciliation")]
        mine = windows[skip:]
        if sum(w["engine_prompt_tokens"] or 0 for w in mine) >= engine:
            return mine
        time.sleep(0.2)
    raise AssertionError(f"no reconciliation windows accounting for {engine} tokens")


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0"])
def test_answers_too_large_to_hold_are_billed_from_their_end(
    cluster: Cluster, tmp_path: Path, version: str
) -> None:
    """With --max-answer-bytes below the answers' size (a 384-dimension embedding is
    about 8 KB of JSON), every metered answer passes through unheld and is still billed,
    from the usage vLLM writes at its end: exactly the engine counter's growth."""
    pair = cluster.pairs[("bi-encoder", version)]
    journal = tmp_path / "journal.sqlite"
    proxy = start_proxy(
        pair.vllm, tmp_path, "--max-answer-bytes", "2048", "--journal", str(journal)
    )
    try:
        proxy.wait_ready("/readyz", 60)
        jobs = [
            ("/v1/embeddings", {"input": [Q, *DOCS]}),
            ("/v1/embeddings", {"input": "single text", "model": ""}),
            ("/invocations", {"input": DOCS}),
        ]
        before = metric(pair.vllm)
        answers = [post_with_headers(proxy.url + path, body, {}) for path, body in jobs]
        grown = int(metric(pair.vllm) - before)
    finally:
        proxy.stop()
    assert [status for status, _, _ in answers] == [200] * len(jobs)
    assert all(len(body) > 2048 and json.loads(body)["usage"] for _, _, body in answers)
    records = [json.loads(b) for b in read_journal(journal)]
    assert [r["verdict"] for r in records] == ["reported"] * len(jobs)
    assert sum(r["prompt_tokens_billed"] for r in records) == grown > 0

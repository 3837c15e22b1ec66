"""Closed-loop reconciliation (issue #13): the engine's own counters against the records,
window by window, exactly; bypass traffic shows as unbilled, a restart as a reset."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.ledger.journal_files import read_journal
from proxy.serving.keys import METRICS, RECONCILER
from proxy.serving.upstream import SESSION
from tests.support.proxies import fake_and_proxy
from tests.support.texts import DOCS, QUERY


@pytest.fixture
async def rig(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    """Fake vLLM 0.29.0 with its counters, the proxy with reconciliation driven by hand."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, reconcile_interval=0
    )
    settler = client.app[RECONCILER]
    session = client.app[SESSION]
    assert await settler.settle_once() is None  # the baseline
    return fake, client, settler, session


async def mixed_traffic(client: Any) -> None:
    assert (await client.post("/rerank", json={"query": QUERY, "documents": DOCS})).status == 200
    assert (await client.post("/score", json={"text_1": [QUERY, QUERY], "text_2": DOCS[:2]})).ok
    assert (await client.post("/v1/embeddings", json={"input": DOCS})).status == 200
    assert (await client.post("/invocations", json={"query": QUERY, "documents": DOCS})).ok
    chat = {"stream": True, "messages": []}
    assert "[DONE]" in await (await client.post("/v1/chat/completions", json=chat)).text()
    assert (
        await client.post("/score", json={"text_1": [QUERY, "b"], "text_2": DOCS})
    ).status == 400


async def test_traffic_through_the_proxy_settles_with_zero_drift(
    rig: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every token the engine counted is billed once; in front of 0.29.0 the reported
    tokens exceed the engine's by exactly what the proxy corrected."""
    fake, client, settler, _ = rig
    before = fake.prompt_tokens_total
    await mixed_traffic(client)
    window = await settler.settle_once()
    assert window is not None
    assert window.status == "settled"
    assert window.engine_prompt_tokens == fake.prompt_tokens_total - before
    assert (window.unbilled_prompt_tokens, window.overbilled_prompt_tokens) == (0, 0)
    assert window.engine_completion_tokens == window.billed_completion_tokens == 3
    assert (window.unbilled_completion_tokens, window.overbilled_completion_tokens) == (0, 0)
    records = [json.loads(b) for b in read_journal(tmp_path / "journal.sqlite")]
    corrected = sum(r["prompt_tokens_reported"] - r["prompt_tokens_billed"] for r in records)
    assert corrected > 0
    assert window.reported_prompt_tokens - window.engine_prompt_tokens == corrected
    assert window.upstream_errors == 1  # the 400: no engine work, no record
    assert window.records == 5
    text = client.app[METRICS].render().decode()
    assert "usage_proxy_unbilled_prompt_tokens_total 0.0" in text
    assert "usage_proxy_reconcile_last_settled_timestamp_seconds 0.0" not in text
    (journaled,) = read_journal(tmp_path / "journal.sqlite", kind="reconciliation")
    assert json.loads(journaled)["window_id"] == window.window_id
    assert main(["reconcile", "--journal", str(tmp_path / "journal.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "1 window(s), prompt-token drift 0" in out


async def test_bypass_traffic_shows_as_unbilled(rig: Any, aiohttp_client: Any) -> None:
    """A request sent straight to vLLM is unbilled engine work, to the token."""
    fake, client, settler, _ = rig
    await mixed_traffic(client)
    upstream = client.app[SESSION]
    base = settler._upstream
    before = fake.prompt_tokens_total
    async with upstream.post(base + "/rerank", json={"query": QUERY, "documents": DOCS}) as r:
        assert r.status == 200
    bypassed = fake.prompt_tokens_total - before
    window = await settler.settle_once()
    assert window is not None
    assert window.unbilled_prompt_tokens == bypassed == 36
    assert window.overbilled_prompt_tokens == 0
    assert any(c.code == "unmetered_traffic" for c in window.causes)


async def test_restart_neither_invents_nor_hides_drift(rig: Any) -> None:
    """The window across a restart is marked counter_reset (no drift claimed); the next
    window is exact again, and drift in it is still found."""
    fake, client, settler, _ = rig
    await mixed_traffic(client)
    fake.prompt_tokens_total, fake.generation_tokens_total = 0, 0
    fake.started_at += 100
    await client.post("/rerank", json={"query": QUERY, "documents": DOCS})
    reset = await settler.settle_once()
    assert reset is not None
    assert reset.status == "counter_reset"
    await mixed_traffic(client)
    exact = await settler.settle_once()
    assert exact is not None
    assert (exact.status, exact.unbilled_prompt_tokens, exact.overbilled_prompt_tokens) == (
        "settled",
        0,
        0,
    )
    fake.prompt_tokens_total += 11  # engine work nobody billed, after the restart
    drift = await settler.settle_once()
    assert drift is not None
    assert drift.unbilled_prompt_tokens == 11


async def test_a_window_waits_for_a_quiet_moment(rig: Any) -> None:
    """With an exchange in flight the window does not close (it carries on)."""
    _, _, settler, _ = rig

    class Busy:
        in_flight, started, failed, refused = 1, 1, 0, 0

        async def quiet(self) -> None:
            await asyncio.Event().wait()

    local = settler._takes  # one process's: its exchanges and the tally
    real, local._traffic = local._traffic, Busy()
    assert await settler.settle_once(patience=0.2) is None
    local._traffic = real
    assert await settler.settle_once(patience=0.2) is not None


async def test_the_proxys_own_refusals_are_not_blamed_on_the_engine(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Issue #54 item 6: a tenant refused by its limit (429, never forwarded) was counted as
    a "metered request failed upstream". Refusals are counted apart, as refused requests,
    and the engine is blamed only for errors of requests that reached it."""
    limits = tmp_path / "limits.yaml"
    limits.write_text("tenants: {acme: {requests_per_minute: 1}}\n")
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        reconcile_interval=0,
        tenant_header="X-Tenant-Id",
        limits=str(limits),
        journal=str(tmp_path / "journal.sqlite"),
    )
    settler = client.app[RECONCILER]
    assert await settler.settle_once() is None  # the baseline
    acme, body = {"X-Tenant-Id": "acme"}, {"query": QUERY, "documents": DOCS}
    assert (await client.post("/rerank", json=body, headers=acme)).status == 200
    for _ in range(3):
        assert (await client.post("/rerank", json=body, headers=acme)).status == 429
    bypass = client.app[SESSION]
    async with bypass.post(settler._upstream + "/rerank", json=body) as straight:
        assert straight.status == 200  # engine work no record accounts for
    window = await settler.settle_once()
    assert window is not None
    assert (window.records, window.upstream_errors, window.refused_requests) == (1, 0, 3)
    assert window.unbilled_prompt_tokens == 36
    assert not any(c.code == "upstream_errors" for c in window.causes)


async def test_several_proxies_in_front_of_one_vllm(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Issue #54 item 6: two proxies in front of one vLLM each counted the other's requests
    as unbilled engine work, so the drift alert fired for ever. A proxy told
    --reconcile-shared-upstream claims no unbilled tokens (status ``shared``, the unbilled
    counters and so UsageLedgerDrift stay at 0) and says how much engine work its records
    do not cover; it still proves it billed no more than the engine did."""
    from proxy.serving.app import create_app
    from proxy.serving.catalog import CATALOG
    from proxy.settings import Settings

    fake, first = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, reconcile_interval=0
    )
    upstream = first.app[RECONCILER]._upstream
    second = await aiohttp_client(
        create_app(
            Settings(upstream=upstream, reconcile_interval=0, reconcile_shared_upstream=True)
        )
    )
    assert await second.app[CATALOG].wait_ready(10)
    alone, shared = first.app[RECONCILER], second.app[RECONCILER]
    assert await alone.settle_once() is None  # the baselines
    assert await shared.settle_once() is None
    body = {"query": QUERY, "documents": DOCS}
    for client in (first, second, second):
        assert (await client.post("/rerank", json=body)).status == 200
    before = fake.prompt_tokens_total
    mine = await shared.settle_once()
    assert mine is not None
    assert (mine.status, mine.billed_prompt_tokens, mine.engine_prompt_tokens) == (
        "shared",
        72,
        108,
    )
    assert (mine.unbilled_prompt_tokens, mine.overbilled_prompt_tokens) == (0, 0)
    assert str(mine.causes[0]).startswith("shared_upstream: 36 prompt and 0 completion token(s)")
    text = second.app[METRICS].render().decode()
    assert "usage_proxy_unbilled_prompt_tokens_total 0.0" in text
    assert 'usage_proxy_reconcile_windows_total{status="shared"} 1.0' in text
    theirs = await alone.settle_once()  # the first proxy, not told: the other's work
    assert theirs is not None
    assert (theirs.status, theirs.unbilled_prompt_tokens) == ("settled", 72)
    assert fake.prompt_tokens_total == before
    assert (await second.post("/rerank", json=body)).status == 200
    fake.prompt_tokens_total -= 10  # the engine did less than this proxy billed: a defect
    over = await shared.settle_once()
    assert over is not None
    assert (over.status, over.overbilled_prompt_tokens) == ("shared", 10)


async def test_the_loop_settles_by_itself(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """--reconcile-interval runs it in the background; the timestamp metric moves."""
    import asyncio

    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, reconcile_interval=0.2
    )
    await client.post("/rerank", json={"query": QUERY, "documents": DOCS})
    settler = client.app[RECONCILER]
    for _ in range(100):
        if settler.windows:
            break
        await asyncio.sleep(0.05)
    assert settler.windows
    assert settler.windows[-1].unbilled_prompt_tokens == 0


async def test_nothing_reconciled_is_not_reported_as_no_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #39 case 12: a journal without windows (an upstream without /metrics, or
    --reconcile-interval 0) printed "0 window(s), prompt-token drift 0", which reads as
    healthy. Now: exit 1 and say that nothing could be reconciled, and why it may be."""
    from proxy.ledger.journal import Journal

    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    await journal.open()
    await journal.close()
    for form in ("table", "csv", "json"):
        assert main(["reconcile", "--journal", str(path), "--format", form]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert f"no reconciliation window in {path}: nothing could be reconciled" in (captured.err)
        assert "/metrics" in captured.err
        assert "drift 0" not in captured.err

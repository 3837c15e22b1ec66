"""A realtime session under a money budget: each utterance admitted at its commit (however
vLLM spells it), a spent budget ends the session, and what a session is charged is what
its record is invoiced, across a missing done or a price rise."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.accounting.money import nanos_up
from proxy.accounting.price_schedule import load_prices
from proxy.ledger.charges import charge
from proxy.limits.limiter import Cost, Who
from proxy.limits.meters import BudgetMeter
from proxy.serving.admission import ADMISSION
from tests.support.fakevllm.audio import realtime_usage
from tests.support.proxies import fake_and_proxy, limited_proxy
from tests.support.realtime import COMMIT, FINAL, UPDATE, append, recorded, utterance

ACME = {"Authorization": "Bearer sk-acme"}


async def test_each_utterance_is_admitted_at_its_commit_and_a_spent_budget_ends_the_session(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A money budget that holds two utterances' reservations (each every token the
    context allows, 0.0512) but not a third once two are billed (0.0062 each): the
    third commit is not forwarded, the client gets vLLM's error event saying why and the
    session ends; the two are billed and the budget is not passed (before: the session
    was admitted once and ran all twenty utterances, past its budget)."""
    prices = {
        "currency": "USD",
        "models": {"minilm": {"prompt_tokens": "0.0001", "completion_tokens": "0.0001"}},
    }
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(prices))
    fake, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"cost_per_day": "0.06"}}},
        version="0.32.0",
        prices=str(tmp_path / "prices.yaml"),
    )
    ran, refusal = 0, None
    async with client.ws_connect("/v1/realtime", headers={"X-Tenant-Id": "acme"}) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        for _ in range(20):
            await ws.send_str(COMMIT)
            await ws.send_str(append(1280))
            await ws.send_str(FINAL)
            while True:
                message = await ws.receive(timeout=5)
                if message.type is not aiohttp.WSMsgType.TEXT:
                    break
                event = json.loads(message.data)
                if event["type"] == "error":
                    refusal = event
                if event["type"] in ("error", "transcription.done"):
                    break
            if refusal is not None or message.type is not aiohttp.WSMsgType.TEXT:
                break
            ran += 1
        closing = await ws.receive(timeout=5)
    assert ran == 2
    assert refusal is not None
    assert refusal["code"] == "rate_limit_exceeded"
    assert "cost_per_day" in refusal["error"]
    assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    (record,) = await recorded(tmp_path / "journal.sqlite")
    prompt, completion = realtime_usage(1280)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (
        2 * prompt,
        2 * completion,
    )
    assert fake.generation_tokens_total == 2 * completion
    (meter,) = [
        m for m in client.app[ADMISSION].limiter.meters.values() if isinstance(m, BudgetMeter)
    ]
    assert meter.reserved == 0
    assert meter.used == 2 * (prompt + completion) * 100_000  # 0.0001 in billionths


async def _money_session(
    aiohttp_server: Any, aiohttp_client: Any, root: Path, tmp_path: Path, **options: Any
) -> tuple[Any, Any]:
    """A fake vLLM 0.32.0 and the proxy with acme's cost_per_day of 0.06 USD, minilm at
    0.0001 a token: two utterances' reservations (0.0512 each) fit, a third once two are
    billed (0.0062 each) does not."""
    prices = {
        "currency": "USD",
        "models": {"minilm": {"prompt_tokens": "0.0001", "completion_tokens": "0.0001"}},
    }
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(prices))
    limits = tmp_path / "limits.yaml"
    limits.write_text(yaml.safe_dump({"tenants": {"acme": {"cost_per_day": "0.06"}}}))
    return await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        root,
        version="0.32.0",
        tenant_header="X-Tenant-Id",
        journal=str(tmp_path / "journal.sqlite"),
        limits=str(limits),
        prices=str(tmp_path / "prices.yaml"),
        **options,
    )


async def _run_utterances(ws: aiohttp.ClientWebSocketResponse, commit: str) -> int:
    """Up to twenty utterances started by ``commit``; how many were transcribed before
    an error event or the close."""
    ran = 0
    for _ in range(20):
        await ws.send_str(commit)
        await ws.send_str(append(1280))
        await ws.send_str(FINAL)
        while True:
            message = await ws.receive(timeout=5)
            if message.type is not aiohttp.WSMsgType.TEXT:
                return ran
            kind = json.loads(message.data)["type"]
            if kind == "error":
                return ran
            if kind == "transcription.done":
                break
        ran += 1
    return ran


@pytest.mark.parametrize(
    "commit",
    [
        '{"type": "input_audio_buffer.\\u0063ommit"}',  # an escape, as json.loads reads it
        json.dumps({"type": "input_audio_buffer.commit", "pad": " " * 70_000}),  # > 64 KiB
    ],
    ids=["escaped", "padded"],
)
async def test_a_commit_vllm_reads_is_admitted_however_it_is_spelt(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, commit: str
) -> None:
    """vLLM parses every text message with json.loads (escapes decoded, extra members
    kept, any size up to 16 MiB) and starts a generation at each commit: a commit spelt
    with an escape, or padded past 64 KiB, is admitted like any other, so the budget
    ends the session at the third (before: not seen as a commit, never reserved nor
    charged, all twenty ran on a budget for two and the meter stayed at zero)."""
    fake, client = await _money_session(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    async with client.ws_connect("/v1/realtime", headers={"X-Tenant-Id": "acme"}) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        ran = await _run_utterances(ws, commit)
    assert ran == 2
    (record,) = await recorded(tmp_path / "journal.sqlite")
    prompt, completion = realtime_usage(1280)
    assert fake.generation_tokens_total == 2 * completion
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (
        2 * prompt,
        2 * completion,
    )
    (meter,) = [
        m for m in client.app[ADMISSION].limiter.meters.values() if isinstance(m, BudgetMeter)
    ]
    assert (meter.used, meter.reserved) == (2 * (prompt + completion) * 100_000, 0)


async def test_an_utterance_without_its_done_is_charged_as_the_journal_bills_it(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """One utterance billed, then a client that leaves mid-generation and vLLM silent for
    --read-timeout: the session's record bills the one done, and the budget holds exactly
    that, as a restart rebuilds it from the journal (before: the budget also kept the
    second utterance's reservation, 0.0512, which no record holds, so a restart forgot
    it and the budget and the invoice disagreed)."""
    fake, client = await _money_session(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, read_timeout=0.2
    )
    async with client.ws_connect("/v1/realtime", headers={"X-Tenant-Id": "acme"}) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await utterance(ws, 1280)
        fake.delay = 5.0  # the next generation's deltas come far slower than the wait
        await ws.send_str(COMMIT)
        await ws.send_str(append(1600))
        await asyncio.sleep(0.3)
    (record,) = await recorded(tmp_path / "journal.sqlite")
    prompt, completion = realtime_usage(1280)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (prompt, completion)

    async def budget(app: Any) -> tuple[int, int]:
        """acme's budget as a reservation of nothing finds it (its meter read then)."""
        limiter = app[ADMISSION].limiter
        decision = await limiter.reserve(Who("acme", "minilm"), Cost(requests=0), time.time())
        await limiter.release(decision.ticket, time.time())
        (meter,) = [m for m in limiter.meters.values() if isinstance(m, BudgetMeter)]
        return meter.used, meter.reserved

    assert await budget(client.app) == ((prompt + completion) * 100_000, 0)
    _, restarted = await _money_session(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    assert await budget(restarted.app) == await budget(client.app)


async def test_a_session_across_a_price_rise_is_charged_what_its_record_is_invoiced(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """One utterance before a price doubles, one after, the session recorded after: its
    record is invoiced at the doubled price (the price at its time), and the budget holds
    that amount, as a restart rebuilds it from the journal (before: the first utterance
    stayed at the old price, so the budget held less than the invoice and a restart
    counted more)."""
    rise = datetime.now(UTC) + timedelta(seconds=1.5)
    prices = {
        "currency": "USD",
        "models": {
            "minilm": [
                {"from": "2026-01-01", "prompt_tokens": "0.0001", "completion_tokens": "0.0001"},
                {
                    "from": rise.isoformat(),
                    "prompt_tokens": "0.0002",
                    "completion_tokens": "0.0002",
                },
            ]
        },
    }
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(prices))
    (tmp_path / "limits.yaml").write_text(
        yaml.safe_dump({"tenants": {"acme": {"cost_per_day": "10"}}})
    )
    options = {
        "version": "0.32.0",
        "tenant_header": "X-Tenant-Id",
        "journal": str(tmp_path / "journal.sqlite"),
        "limits": str(tmp_path / "limits.yaml"),
        "prices": str(tmp_path / "prices.yaml"),
    }
    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path, **options)
    async with client.ws_connect("/v1/realtime", headers={"X-Tenant-Id": "acme"}) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await utterance(ws, 1280)
        await asyncio.sleep(max(0.0, (rise - datetime.now(UTC)).total_seconds()) + 0.1)
        await utterance(ws, 1280)
    (record,) = await recorded(tmp_path / "journal.sqlite")
    assert record.time >= rise
    invoiced = charge([record], load_prices(tmp_path / "prices.yaml"), lambda r: (r.tenant,))
    (tenant,) = invoiced.tenants
    assert tenant.amount == Decimal("0.0002") * 2 * sum(realtime_usage(1280))

    async def budget(app: Any) -> int:
        """acme's budget's usage as a reservation of nothing finds it."""
        limiter = app[ADMISSION].limiter
        decision = await limiter.reserve(Who("acme", "minilm"), Cost(requests=0), time.time())
        await limiter.release(decision.ticket, time.time())
        (meter,) = [m for m in limiter.meters.values() if isinstance(m, BudgetMeter)]
        return int(meter.used)

    assert await budget(client.app) == nanos_up(tenant.amount)
    _, restarted = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path, **options)
    assert await budget(restarted.app) == await budget(client.app)

"""The realtime WebSocket through the proxy: relayed both ways, one record per session
billing vLLM's transcription.done usage to the key's tenant."""

from __future__ import annotations

import asyncio
import base64
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
from proxy.ledger.records import UsageRecord
from proxy.limits.limiter import Cost, Who
from proxy.limits.meters import BudgetMeter
from proxy.serving.admission import ADMISSION
from tests.support.fakevllm.audio import realtime_usage
from tests.support.proxies import fake_and_proxy, limited_proxy
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}


def append(samples: int) -> str:
    """An input_audio_buffer.append of ``samples`` of silent PCM16."""
    audio = base64.b64encode(b"\0\0" * samples).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


COMMIT = json.dumps({"type": "input_audio_buffer.commit"})
FINAL = json.dumps({"type": "input_audio_buffer.commit", "final": True})
UPDATE = json.dumps({"type": "session.update", "model": "minilm"})


async def recorded(journal: Path) -> list[UsageRecord]:
    """The journal's records once the session's is there (it is recorded as it ends)."""
    for _ in range(100):
        if found := journal_records(journal):
            return found
        await asyncio.sleep(0.05)
    return []


async def events_until(ws: aiohttp.ClientWebSocketResponse, kind: str) -> list[dict[str, Any]]:
    """The events received up to and including the first of ``kind``."""
    seen = []
    while True:
        event = json.loads((await ws.receive(timeout=5)).data)
        seen.append(event)
        if event["type"] == kind:
            return seen


@pytest.fixture
async def realtime(exporting: Any) -> Any:
    """The proxy (keys: acme) in front of a fake vLLM 0.32.0 serving a realtime model."""
    fake, client, journal, _ = await exporting({"acme": "sk-acme"}, version="0.32.0")
    return fake, client, journal


async def utterance(ws: aiohttp.ClientWebSocketResponse, samples: int) -> list[dict[str, Any]]:
    await ws.send_str(COMMIT)
    await ws.send_str(append(samples))
    await ws.send_str(FINAL)
    return await events_until(ws, "transcription.done")


async def test_a_session_is_billed_its_transcription_usage(realtime: Any) -> None:
    """Both directions are relayed as sent; the session's transcription.done usage is
    recorded once, when it ends, to the key's tenant, with the session's model."""
    fake, client, journal = realtime
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        created = json.loads((await ws.receive(timeout=5)).data)
        assert created["type"] == "session.created"
        await ws.send_str(UPDATE)
        seen = await utterance(ws, 16000)
        prompt, completion = realtime_usage(16000)  # 39 and 23
        deltas = ["transcription.delta"] * completion
        assert [e["type"] for e in seen] == [*deltas, "transcription.done"]
        assert journal_records(journal) == []  # billed when the session ends
    assert seen[-1]["usage"]["prompt_tokens"] == prompt
    (record,) = await recorded(journal)
    assert (record.tenant, record.operation, record.endpoint) == (
        "acme",
        "realtime",
        "/v1/realtime",
    )
    assert (record.model, record.verdict, record.status) == ("minilm", "reported", 101)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (prompt, completion)
    assert not record.aborted  # a client ends every session: only one cut short is aborted
    assert fake.prompt_tokens_total == prompt


async def test_a_session_of_several_utterances_bills_their_sum(realtime: Any) -> None:
    """Each utterance ends with its own transcription.done: one record, their sum."""
    _, client, journal = realtime
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await utterance(ws, 12800)
        await utterance(ws, 25600)
    (record,) = await recorded(journal)
    (p1, c1), (p2, c2) = realtime_usage(12800), realtime_usage(25600)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (p1 + p2, c1 + c2)


async def test_a_client_that_leaves_mid_generation_is_billed_its_generation(
    realtime: Any,
) -> None:
    """A client that leaves without the final commit: the proxy sends it (vLLM would
    cancel the generation, unbilled), reads the transcription.done and bills it."""
    fake, client, journal = realtime
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await ws.send_str(COMMIT)
        await ws.send_str(append(2560))
    (record,) = await recorded(journal)
    prompt, completion = realtime_usage(2560)
    assert fake.generation_tokens_total == completion
    assert (record.verdict, record.aborted) == ("reported", False)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (prompt, completion)
    assert record.latency_ms < 2000  # kept no longer than the generation takes


async def test_a_session_whose_done_does_not_come_is_recorded_invalid(exporting: Any) -> None:
    """A client that leaves mid-generation and vLLM silent for --read-timeout: recorded
    invalid, aborted, with the session's duration, never free and silent; the proxy
    waits no longer than that."""
    fake, client, journal, _ = await exporting(
        {"acme": "sk-acme"}, version="0.32.0", read_timeout=0.2
    )
    fake.delay = 5.0  # the engine's deltas are far slower than the proxy waits
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await ws.send_str(COMMIT)
        await ws.send_str(append(1600))
        await asyncio.sleep(0.3)
    (record,) = await recorded(journal)
    assert record.verdict == "invalid"
    assert record.aborted
    assert 500 <= record.latency_ms < 2000
    assert record.prompt_tokens_billed is None


async def test_a_client_that_leaves_with_no_generation_running_is_not_kept(
    realtime: Any,
) -> None:
    """No commit since the last done: nothing runs, so the proxy closes at once (no final
    commit sent, no wait) and the session's one done is billed."""
    fake, client, journal = realtime
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await utterance(ws, 1280)
        await ws.send_str(append(1280))  # audio no commit started a generation for
    (record,) = await recorded(journal)
    assert record.completion_tokens_billed == realtime_usage(1280)[1]
    assert fake.generation_tokens_total == realtime_usage(1280)[1]
    assert record.latency_ms < 1000


async def test_vllms_error_events_reach_the_client(realtime: Any) -> None:
    """A commit before session.update gets vLLM's error event, as without the proxy."""
    _, client, _ = realtime
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(COMMIT)
        event = json.loads((await ws.receive(timeout=5)).data)
    assert (event["type"], event["code"]) == ("error", "model_not_validated")


async def test_a_session_needs_a_key(realtime: Any) -> None:
    """No key, no session: 401 before any upgrade, nothing recorded."""
    _, client, journal = realtime
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await client.ws_connect("/v1/realtime")
    assert caught.value.status == 401
    assert journal_records(journal) == []


async def test_a_plain_get_is_not_a_session(realtime: Any) -> None:
    """A GET without the upgrade is answered 404, as vLLM's router answers it."""
    _, client, journal = realtime
    resp = await client.get("/v1/realtime", headers=ACME)
    assert resp.status == 404
    assert journal_records(journal) == []


async def test_sessions_are_admitted_on_request_limits_and_settle_at_their_tokens(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """With a token budget and one request a minute: the first session is admitted
    unpriced and settles at its tokens when it ends; the second is refused 429 before any
    upgrade."""
    limits = tmp_path / "limits.yaml"
    policy = {"total_tokens_per_day": 1000, "requests_per_minute": 1}
    limits.write_text(yaml.safe_dump({"tenants": {"acme": policy}}))
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.32.0",
        tenant_header="X-Tenant-Id",
        journal=str(tmp_path / "journal.sqlite"),
        limits=str(limits),
    )
    acme = {"X-Tenant-Id": "acme"}
    async with client.ws_connect("/v1/realtime", headers=acme) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await utterance(ws, 12800)
    (record,) = await recorded(tmp_path / "journal.sqlite")
    (meter,) = [
        m for m in client.app[ADMISSION].limiter.meters.values() if isinstance(m, BudgetMeter)
    ]
    billed = (record.prompt_tokens_billed or 0) + (record.completion_tokens_billed or 0)
    assert billed > 0
    assert (meter.used, meter.reserved) == (billed, 0)
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await client.ws_connect("/v1/realtime", headers=acme)
    assert caught.value.status == 429


async def test_a_release_without_realtime_answers_its_own_404(exporting: Any) -> None:
    """vLLM before 0.20 has no /v1/realtime: its 404 reaches the client as the refused
    upgrade's status, and no session is recorded."""
    _, client, journal, _ = await exporting({"acme": "sk-acme"}, version="0.15.1")
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await client.ws_connect("/v1/realtime", headers=ACME)
    assert caught.value.status == 404
    assert journal_records(journal) == []


async def test_a_side_that_does_not_read_holds_back_the_other() -> None:
    """Back-pressure: the relay reads its next message only once the last one was sent
    on, so a sink that does not take it stops the reading (nothing queues in the proxy)."""
    from aiohttp import WSMessage, WSMsgType

    from proxy.serving.realtime import pump

    taken = 0

    class Source:
        def __aiter__(self) -> Source:
            return self

        async def __anext__(self) -> WSMessage:
            nonlocal taken
            taken += 1
            return WSMessage(WSMsgType.TEXT, "x" * 1024, None)

    class Stalled:
        closed = False

        async def send_str(self, data: str) -> None:
            await asyncio.Event().wait()  # a peer that never reads

    async def note(_: str) -> bool:
        return True

    task = asyncio.create_task(pump(Source(), Stalled(), note))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    assert taken == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


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


async def test_a_client_that_leaves_while_the_engine_finishes_is_billed_when_it_does(
    realtime: Any,
) -> None:
    """A client sends its final commit and leaves while the engine still works (twelve
    steps of 0.5 s, longer than the 5 s the proxy used to wait): the proxy reads on
    while vLLM's deltas keep coming and bills the transcription.done (before: it closed
    after 5 s, vLLM cancelled, the utterance was recorded invalid and free)."""
    fake, client, journal = realtime
    fake.delay = 0.5
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await ws.send_str(COMMIT)
        await ws.send_str(append(2560))
        await ws.send_str(FINAL)
    for _ in range(200):
        if found := journal_records(journal):
            break
        await asyncio.sleep(0.05)
    (record,) = found
    prompt, completion = realtime_usage(2560)
    assert completion * fake.delay > 5
    assert (record.verdict, record.aborted) == ("reported", False)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (prompt, completion)


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

"""The realtime WebSocket through the proxy: relayed both ways, one record per session
billing vLLM's transcription.done usage to the key's tenant."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.limits.meters import BudgetMeter
from proxy.serving.admission import ADMISSION
from tests.support.fakevllm.audio import realtime_usage
from tests.support.proxies import limited_proxy
from tests.support.realtime import COMMIT, FINAL, UPDATE, append, recorded, utterance
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}


@pytest.fixture
async def realtime(exporting: Any) -> Any:
    """The proxy (keys: acme) in front of a fake vLLM 0.32.0 serving a realtime model."""
    fake, client, journal, _ = await exporting({"acme": "sk-acme"}, version="0.32.0")
    return fake, client, journal


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
    policy = {"total_tokens_per_day": 1000, "requests_per_minute": 1}
    tenants = {"tenants": {"acme": policy}}
    _, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, tenants, version="0.32.0"
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

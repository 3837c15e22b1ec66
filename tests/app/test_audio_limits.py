"""Audio under limits: admitted on request limits and settled at its tokens; under a
money budget reserved at its duration's price (a long recording, concurrent ones, a WAV
that hides its length, a stream's completion cap) and refused when it cannot be priced."""

from __future__ import annotations

import asyncio
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from proxy.accounting.price_schedule import load_prices
from proxy.ledger.charges import charge
from proxy.limits.meters import BudgetMeter
from proxy.serving.admission import ADMISSION
from tests.support.audio_requests import STREAM_PROMPT, TRANSCRIPTIONS, events, form
from tests.support.fakevllm.audio import wav
from tests.support.proxies import fake_and_proxy, limited_proxy
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}


async def test_audio_is_admitted_on_request_limits_and_settles_at_its_tokens(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """With a token budget and a request rate: audio reserves the bound of its duration
    (``limits.speech``), a whole transcription settles at zero tokens, a stream at its
    prompt and completion tokens, and the request rate refuses the third."""
    policy = {"total_tokens_per_day": 2000, "requests_per_minute": 2}
    tenants = {"tenants": {"acme": policy}}
    _, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, tenants, version="0.32.0"
    )
    acme = {"X-Tenant-Id": "acme"}
    resp = await client.post(TRANSCRIPTIONS, data=form(), headers=acme)
    assert resp.status == 200
    (meter,) = [
        m for m in client.app[ADMISSION].limiter.meters.values() if isinstance(m, BudgetMeter)
    ]
    assert (meter.used, meter.reserved) == (0, 0)
    resp = await client.post(TRANSCRIPTIONS, data=form(stream="true"), headers=acme)
    assert resp.status == 200
    await resp.read()
    assert (meter.used, meter.reserved) == (STREAM_PROMPT + 3, 0)
    resp = await client.post(TRANSCRIPTIONS, data=form(), headers=acme)
    assert resp.status == 429
    seconds = [r.units.audio_seconds for r in journal_records(tmp_path / "journal.sqlite")]
    assert seconds == [3, None]


async def audio_budget(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    price: dict[str, str],
    budget: str,
) -> tuple[list[str], Any]:
    """A proxy whose tenant acme has ``budget`` a day, minilm priced at ``price``; the
    fake (each transcription held 0.2 s, as an engine's takes time) lists what reaches it."""
    seen: list[str] = []

    @web.middleware
    async def slow(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append(request.path)
            await asyncio.sleep(0.2)
        return await handler(request)

    (tmp_path / "limits.yaml").write_text(
        yaml.safe_dump({"tenants": {"acme": {"cost_per_day": budget}}})
    )
    prices = {"currency": "USD", "models": {"minilm": {"from": "2026-01-01", **price}}}
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(prices))
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.32.0",
        middlewares=(slow,),
        tenant_header="X-Tenant-Id",
        journal=str(tmp_path / "journal.sqlite"),
        limits=str(tmp_path / "limits.yaml"),
        prices=str(tmp_path / "prices.yaml"),
    )
    return seen, client


def audio_spent(tmp_path: Path) -> Decimal:
    """What the journal's records cost at the price file's prices."""
    records = journal_records(tmp_path / "journal.sqlite")
    charges = charge(records, load_prices(tmp_path / "prices.yaml"), lambda r: (r.tenant,))
    return sum((t.amount for t in charges.tenants), Decimal(0))


SECONDS_PRICED = {
    "audio_seconds": "0.05",
    "prompt_tokens": "0.000001",
    "completion_tokens": "0.000002",
}


async def test_a_long_recording_reserves_its_duration_at_its_price(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """An hour of audio at 0.05 a second is 180.00: against a budget of 1.00 it is
    refused before forwarding (400, it can never fit), never billed (before, it was
    admitted for two tokens and billed 180 USD)."""
    seen, client = await audio_budget(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, SECONDS_PRICED, "1.00"
    )
    data = aiohttp.FormData()
    data.add_field("file", io.BytesIO(wav(3600, rate=8)), filename="a.wav")
    data.add_field("model", "minilm")
    resp = await client.post(TRANSCRIPTIONS, data=data, headers={"X-Tenant-Id": "acme"})
    assert resp.status == 400
    assert "costs 180 USD" in (await resp.json())["error"]["message"]
    assert seen == []
    assert audio_spent(tmp_path) == 0


async def test_concurrent_transcriptions_never_spend_past_the_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Fifty 3 s transcriptions at once, 0.15 each, against 1.00: six are admitted, the
    others refused, and the invoice stays within the budget (before: all fifty, 7.50)."""
    seen, client = await audio_budget(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, SECONDS_PRICED, "1.00"
    )

    async def one() -> int:
        resp = await client.post(TRANSCRIPTIONS, data=form(3.0), headers={"X-Tenant-Id": "acme"})
        await resp.read()
        return resp.status

    statuses = await asyncio.gather(*(one() for _ in range(50)))
    assert statuses.count(200) == len(seen) == 6
    assert set(statuses) == {200, 429}
    assert audio_spent(tmp_path) == Decimal("0.90")


async def test_audio_on_a_model_priced_in_tokens_alone_is_refused(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A money budget on a model whose price names no audio seconds: a whole
    transcription (billed in seconds) is refused, naming the unit, before any engine
    work; a stream (billed in tokens) is admitted (before, both were admitted and the
    whole one invoiced 0.00)."""
    tokens_only = {"prompt_tokens": "0.000001", "completion_tokens": "0.000002"}
    seen, client = await audio_budget(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, tokens_only, "1.00"
    )
    acme = {"X-Tenant-Id": "acme"}
    resp = await client.post(TRANSCRIPTIONS, data=form(), headers=acme)
    assert resp.status == 400
    assert "no price for audio_seconds" in (await resp.json())["error"]["message"]
    assert seen == []
    resp = await client.post(TRANSCRIPTIONS, data=form(stream="true"), headers=acme)
    assert resp.status == 200
    await resp.read()
    assert len(seen) == 1


async def test_audio_whose_duration_cannot_be_read_is_refused_under_a_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A file libsndfile cannot read has no duration to price: refused (400, ``file``)
    under a budget, nothing forwarded; as every request whose cost cannot be known before
    it runs, never to be retried as it is (``x-should-retry: false``) and counted as
    limited for it (``unpriced``)."""
    seen, client = await audio_budget(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, SECONDS_PRICED, "1.00"
    )
    data = aiohttp.FormData()
    data.add_field("file", io.BytesIO(b"\0" * 4096), filename="a.m4a")
    resp = await client.post(TRANSCRIPTIONS, data=data, headers={"X-Tenant-Id": "acme"})
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "file"
    assert resp.headers["x-should-retry"] == "false"
    assert seen == []
    metrics = await (await client.get("/metrics")).text()
    assert 'usage_proxy_limited_requests_total{limit="unpriced"' in metrics


async def test_a_wav_whose_header_says_no_length_is_reserved_at_what_vllm_decodes(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A WAV whose data chunk says 0 bytes (as a streaming writer leaves it): libsndfile
    reads 0 frames, but vLLM 0.32.0 decodes with torchcodec (FFmpeg), which reads such a
    chunk to the end of the file: 60 s, 3.00 at 0.05 a second. Against 1.00 it is refused
    before forwarding (before: reserved at 0 s, admitted, and invoiced 3.00)."""
    seen, client = await audio_budget(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, SECONDS_PRICED, "1.00"
    )
    audio = bytearray(wav(60))
    at = audio.index(b"data") + 4
    audio[at : at + 4] = bytes(4)
    data = aiohttp.FormData()
    data.add_field("file", io.BytesIO(bytes(audio)), filename="a.wav")
    resp = await client.post(TRANSCRIPTIONS, data=data, headers={"X-Tenant-Id": "acme"})
    assert resp.status == 400, await resp.text()
    assert "costs 3 USD" in (await resp.json())["error"]["message"]
    assert seen == []
    assert audio_spent(tmp_path) == 0


async def test_a_stream_with_a_completion_cap_is_reserved_at_it(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """vLLM caps each clip's generation at the form's max_completion_tokens (the least of
    it and the context): a stream of 2.5 s capped at 3 reserves 506 prompt tokens and 3
    completion (0.000512), so a budget of 0.0008 admits it and it is billed within it
    (before: the context, 256 completion tokens, 0.001018, more than the whole budget)."""
    tokens = {"prompt_tokens": "0.000001", "completion_tokens": "0.000002"}
    seen, client = await audio_budget(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, tokens, "0.0008"
    )
    data = form(stream="true", stream_include_usage="true", max_completion_tokens="3")
    resp = await client.post(TRANSCRIPTIONS, data=data, headers={"X-Tenant-Id": "acme"})
    assert resp.status == 200, await resp.text()
    usage = [
        e["usage"] for e in events(await resp.read()) if isinstance(e, dict) and e.get("usage")
    ][-1]
    assert usage["completion_tokens"] == 3
    assert seen == [TRANSCRIPTIONS]
    assert audio_spent(tmp_path) <= Decimal("0.0008")

"""Audio through the proxy: transcriptions and translations, multipart forms relayed,
billed in seconds of audio (whole) or tokens (streamed), to the key's tenant."""

from __future__ import annotations

import asyncio
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from structlog.testing import capture_logs

from proxy.accounting.price_schedule import load_prices
from proxy.ledger.charges import charge
from proxy.limits.meters import BudgetMeter
from proxy.serving.admission import ADMISSION
from proxy.serving.tenancy import key_digest
from tests.support.fakevllm.audio import AUDIO_PROMPT, audio_tokens, wav
from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}
TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
# What real vLLM reports as a stream's prompt for the 2.5 s of ``form()``: Whisper's decoder
# prompt and the audio's 250 log-mel frames (the engine's prompt counter grows by 4).
STREAM_PROMPT = AUDIO_PROMPT + audio_tokens(2.5)


def form(seconds: float = 2.5, **fields: str) -> aiohttp.FormData:
    """An audio request as a client library sends it: the file, then the fields."""
    data = aiohttp.FormData()
    data.add_field("file", io.BytesIO(wav(seconds)), filename="a.wav", content_type="audio/wav")
    for name, value in fields.items():
        data.add_field(name, value)
    return data


def events(body: bytes) -> list[Any]:
    """The JSON data of each event of a stream ([DONE] as the string)."""
    out: list[Any] = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
async def audio(exporting: Any) -> Any:
    """The proxy (keys: acme) in front of a fake vLLM 0.32.0 serving a Whisper model."""
    fake, client, journal, _ = await exporting({"acme": "sk-acme"}, version="0.32.0")
    return fake, client, journal


async def test_a_whole_transcription_is_billed_in_seconds_of_audio(audio: Any) -> None:
    """vLLM's usage {"type": "duration", "seconds": 3} for 2.5 s of audio is recorded as
    3 audio seconds to the key's tenant, no tokens; the client gets vLLM's answer and the
    engine the form byte for byte."""
    fake, client, journal = audio
    resp = await client.post(TRANSCRIPTIONS, data=form(2.5, model="minilm"), headers=ACME)
    assert resp.status == 200
    answer = await resp.json()
    assert answer["usage"] == {"type": "duration", "seconds": 3}
    (record,) = journal_records(journal)
    assert (record.tenant, record.key_hash) == ("acme", key_digest("sk-acme")[:12])
    assert (record.operation, record.endpoint, record.model) == (
        "transcriptions",
        TRANSCRIPTIONS,
        "minilm",
    )
    assert (record.verdict, record.units.audio_seconds) == ("reported", 3)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (None, None)
    assert resp.headers["x-usage-record-id"] == record.record_id
    assert b'name="stream_include_usage"' not in fake.last_body


async def test_a_streamed_transcription_is_billed_in_tokens_and_its_usage_hidden(
    audio: Any,
) -> None:
    """A stream that did not ask for its usage: the proxy adds stream_include_usage=true
    to the form (the form stays valid, same boundary), records the tokens of vLLM's last
    chunk, and the client sees the stream it asked for, without that chunk."""
    fake, client, journal = audio
    resp = await client.post(TRANSCRIPTIONS, data=form(stream="true"), headers=ACME)
    assert resp.status == 200
    seen = events(await resp.read())
    assert seen[-1] == "[DONE]"
    assert all("usage" not in e for e in seen[:-1])
    assert [e["choices"][0]["delta"]["content"] for e in seen[:-1]] == ["t0", "t1", "t2"]
    (record,) = journal_records(journal)
    assert (record.operation, record.verdict) == ("transcriptions", "reported")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (STREAM_PROMPT, 3)
    assert record.units.audio_seconds is None
    sent = fake.last_body
    assert sent.count(b'name="stream_include_usage"') == 1
    assert sent.rstrip().endswith(b"--")


async def test_a_stream_that_asked_for_its_usage_sees_it(audio: Any) -> None:
    """With stream_include_usage the client keeps vLLM's usage chunk; the form is sent
    as it came."""
    fake, client, journal = audio
    data = form(stream="true", stream_include_usage="true")
    resp = await client.post(TRANSLATIONS, data=data, headers=ACME)
    seen = events(await resp.read())
    assert seen[-2]["choices"] == []
    assert seen[-2]["usage"]["completion_tokens"] == 3
    (record,) = journal_records(journal)
    assert (record.operation, record.completion_tokens_billed) == ("translations", 3)
    assert fake.last_body.count(b'name="stream_include_usage"') == 1


async def test_continuous_usage_asked_without_include_usage_stays_unseen(audio: Any) -> None:
    """vLLM reads stream_continuous_usage_stats only with stream_include_usage: a client
    that asked for the first alone saw no usage at all, and still sees none."""
    _fake, client, journal = audio
    data = form(stream="true", stream_continuous_usage_stats="true")
    resp = await client.post(TRANSCRIPTIONS, data=data, headers=ACME)
    seen = events(await resp.read())
    assert all("usage" not in e for e in seen[:-1])
    (record,) = journal_records(journal)
    assert record.completion_tokens_billed == 3


async def test_the_last_value_of_a_field_is_the_one_read(audio: Any) -> None:
    """A form that says stream twice is read as vLLM reads it (the last value): a client
    cannot make the proxy see a whole request that vLLM streams."""
    _fake, client, journal = audio
    data = aiohttp.FormData()
    data.add_field("stream", "false")
    data.add_field("file", wav(1.0), filename="a.wav", content_type="audio/wav")
    data.add_field("stream", "true")
    resp = await client.post(TRANSCRIPTIONS, data=data, headers=ACME)
    seen = events(await resp.read())
    assert seen[-1] == "[DONE]"
    assert all("usage" not in e for e in seen[:-1])
    (record,) = journal_records(journal)
    assert record.completion_tokens_billed == 3


@pytest.mark.parametrize(
    ("path", "fields", "feature"),
    [
        (TRANSLATIONS, {}, "translations.whole"),
        (TRANSCRIPTIONS, {"response_format": "verbose_json"}, "transcriptions.verbose_json"),
    ],
)
async def test_whole_answers_without_a_usage_are_refused(
    audio: Any, path: str, fields: dict[str, str], feature: str
) -> None:
    """vLLM answers a whole translation, and a verbose_json transcription, with no usage:
    refused (400, naming the --allow-unmetered feature), the engine never sees them."""
    fake, client, journal = audio
    before = len(fake.seen_headers)
    resp = await client.post(path, data=form(**fields), headers=ACME)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert feature in error["message"]
    assert error["param"] == ("stream" if feature.endswith("whole") else "response_format")
    assert len(fake.seen_headers) == before
    assert journal_records(journal) == []


async def test_a_refused_whole_translation_leaves_a_trace(audio: Any) -> None:
    """Regression (issue #49): a client's whole translation got 400 and left nothing an
    operator could see. The refusal is vLLM's error shape naming the opt-in and its
    feature; it is counted (``usage_proxy_refused_requests_total{status="400"}``) and
    logged with the tenant and the reason; still no usage record (no engine work)."""
    _fake, client, journal = audio
    with capture_logs() as logs:
        resp = await client.post(TRANSLATIONS, data=form(), headers=ACME)
    assert resp.status == 400
    body = await resp.json()
    assert sorted(body["error"]) == ["code", "message", "param", "type"]
    assert "--allow-unmetered translations.whole" in body["error"]["message"]
    (event,) = [e for e in logs if e["event"] == "request_refused"]
    assert (event["path"], event["tenant"], event["status"]) == (TRANSLATIONS, "acme", 400)
    assert event["reason"] == body["error"]["message"]
    metrics = await (await client.get("/metrics")).text()
    assert 'usage_proxy_refused_requests_total{status="400"} 1.0' in metrics
    assert journal_records(journal) == []


async def test_an_operator_may_relay_whole_translations_unmetered(
    exporting: Any,
) -> None:
    """--allow-unmetered translations.whole relays them, answered as vLLM answers, no
    record."""
    _, client, journal, _ = await exporting(
        {"acme": "sk-acme"}, version="0.32.0", allow_unmetered="translations.whole"
    )
    resp = await client.post(TRANSLATIONS, data=form(), headers=ACME)
    assert resp.status == 200
    assert await resp.json() == {"text": "t0 t1 t2"}
    assert journal_records(journal) == []


async def test_a_success_without_usage_is_recorded_invalid(audio: Any) -> None:
    """A 2xx transcription whose answer lost its usage is recorded invalid (the work
    shows, unbilled), never free and silent."""
    fake, client, journal = audio

    def drop_usage(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        answer = json.loads(body)
        answer.pop("usage", None)
        return json.dumps(answer).encode(), headers

    fake.tamper = drop_usage
    resp = await client.post(TRANSCRIPTIONS, data=form(), headers=ACME)
    assert resp.status == 200
    (record,) = journal_records(journal)
    assert record.verdict == "invalid"
    assert record.units.audio_seconds is None


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (b"Content-Disposition: form-data\r\n\r\ntrue", "The Content-Disposition header"),
        (
            b'Content-Disposition: form-data; name="prompt"\r\n\r\n' + b"x" * (1 << 20 | 1),
            "Part exceeded maximum size of 1024KB.",
        ),
    ],
)
async def test_a_form_vllm_cannot_parse_is_refused_as_vllm_refuses_it(
    audio: Any, part: bytes, message: str
) -> None:
    """A part without a name, or a text field over Starlette's 1 MiB: Starlette's 400
    message (vLLM's server parses forms with it), nothing forwarded, nothing recorded."""
    fake, client, journal = audio
    before = len(fake.seen_headers)
    body = b"--b\r\n" + part + b"\r\n--b--\r\n"
    headers = {**ACME, "Content-Type": "multipart/form-data; boundary=b"}
    resp = await client.post(TRANSCRIPTIONS, data=io.BytesIO(body), headers=headers)
    assert resp.status == 400
    assert (await resp.json())["error"]["message"].startswith(message)
    assert len(fake.seen_headers) == before
    assert journal_records(journal) == []


async def test_a_body_that_is_not_a_form_gets_vllms_answer(audio: Any) -> None:
    """JSON sent to the audio route is vLLM's to refuse (no file): passed on, no record."""
    _, client, journal = audio
    resp = await client.post(TRANSCRIPTIONS, json={"stream": True}, headers=ACME)
    assert resp.status == 400
    assert "file" in (await resp.json())["error"]["message"]
    assert journal_records(journal) == []


async def test_vllm_0_8_5_whole_transcriptions_are_refused(exporting: Any) -> None:
    """0.8.5 answers a whole transcription with its text alone: refused as
    transcriptions.whole; streamed, it is billed in tokens."""
    _fake, client, journal, _ = await exporting({"acme": "sk-acme"}, version="0.8.5")
    resp = await client.post(TRANSCRIPTIONS, data=form(), headers=ACME)
    assert resp.status == 400
    assert "transcriptions.whole" in (await resp.json())["error"]["message"]
    resp = await client.post(TRANSCRIPTIONS, data=form(stream="1"), headers=ACME)
    assert resp.status == 200
    await resp.read()
    (record,) = journal_records(journal)
    assert record.completion_tokens_billed == 3


async def test_a_long_recording_is_relayed_whole(audio: Any) -> None:
    """A 40 s recording (1.3 MB, above aiohttp's 1 MiB bytes-body warning) is sent to the
    engine as it came and billed 40 seconds."""
    fake, client, journal = audio
    resp = await client.post(TRANSCRIPTIONS, data=form(40.0), headers=ACME)
    assert resp.status == 200
    assert (await resp.json())["usage"]["seconds"] == 40
    assert len(fake.last_body) > 40 * 32000
    (record,) = journal_records(journal)
    assert record.units.audio_seconds == 40


async def test_audio_is_admitted_on_request_limits_and_settles_at_its_tokens(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """With a token budget and a request rate: audio reserves the bound of its duration
    (``limits.speech``), a whole transcription settles at zero tokens, a stream at its
    prompt and completion tokens, and the request rate refuses the third."""
    limits = tmp_path / "limits.yaml"
    policy = {"total_tokens_per_day": 2000, "requests_per_minute": 2}
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


@pytest.mark.parametrize(
    ("version", "response_format", "status"),
    [("0.10.2", "diarized_json", 400), ("0.29.0", "diarized_json", 200), ("0.10.2", "text", 200)],
)
async def test_each_release_answers_the_formats_it_serves(
    exporting: Any, version: str, response_format: str, status: int
) -> None:
    """A format the release refuses is vLLM's 400 (nothing recorded); one it serves is
    billed in seconds (diarized_json from 0.29, text as JSON with its usage)."""
    _, client, journal, _ = await exporting({"acme": "sk-acme"}, version=version)
    data = form(response_format=response_format)
    resp = await client.post(TRANSCRIPTIONS, data=data, headers=ACME)
    assert resp.status == status
    assert [r.units.audio_seconds for r in journal_records(journal)] == (
        [3] if status == 200 else []
    )


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

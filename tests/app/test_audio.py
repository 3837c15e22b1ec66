"""Audio through the proxy: transcriptions and translations, multipart forms relayed,
billed in seconds of audio (whole) or tokens (streamed), to the key's tenant."""

from __future__ import annotations

import io
import json
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from proxy.serving.tenancy import key_digest
from tests.support.audio_requests import STREAM_PROMPT, TRANSCRIPTIONS, TRANSLATIONS, events, form
from tests.support.fakevllm.audio import wav
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}
# What real vLLM reports as a stream's prompt for the 2.5 s of ``form()``: Whisper's decoder
# prompt and the audio's 250 log-mel frames (the engine's prompt counter grows by 4).


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

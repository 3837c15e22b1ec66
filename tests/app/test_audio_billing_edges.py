"""Audio the engine worked on is billed at the edges of a form or a session: a stream
whose form carries an epilogue, a done event in flight as the client closes, a session
closed without its final commit, a session.update naming another model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.audio_requests import STREAM_PROMPT, TRANSCRIPTIONS, events
from tests.support.fakevllm.audio import realtime_usage, wav
from tests.support.proxies import fake_and_proxy
from tests.support.realtime import COMMIT, FINAL, UPDATE, append, recorded, utterance
from tests.support.records import journal_records

ACME = {"Authorization": "Bearer sk-acme"}
# A 2.5 s stream's prompt as vLLM reports it: decoder prompt and audio tokens.


@pytest.fixture
async def fake_vllm(exporting: Any) -> Any:
    """The proxy (keys: acme) in front of a fake vLLM 0.32.0."""
    fake, client, journal, _ = await exporting({"acme": "sk-acme"}, version="0.32.0")
    return fake, client, journal


async def test_a_stream_with_an_epilogue_delimiter_is_billed(fake_vllm: Any) -> None:
    """A streamed transcription whose form carries a second closing delimiter after the
    real one (an epilogue every multipart parser ignores): the engine does the work, so
    the record must bill its tokens."""
    fake, client, journal = fake_vllm
    file_part = b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    raw = (
        b"--b\r\n" + file_part + wav(2.5) + b"\r\n"
        b'--b\r\nContent-Disposition: form-data; name="stream"\r\n\r\ntrue\r\n'
        b"--b--\r\n"
        b"\r\n--b--\r\n"  # the epilogue
    )
    headers = {**ACME, "Content-Type": "multipart/form-data; boundary=b"}
    resp = await client.post(TRANSCRIPTIONS, data=raw, headers=headers)
    assert resp.status == 200
    seen = events(await resp.read())
    assert seen[-1] == "[DONE]"  # vLLM streamed it: the engine's work was done
    assert fake.generation_tokens_total > 0
    (record,) = journal_records(journal)
    assert record.verdict == "reported"
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (STREAM_PROMPT, 3)


async def test_a_done_event_in_flight_when_the_client_closes_is_billed(
    fake_vllm: Any,
) -> None:
    """A client sends the final commit and closes at once: vLLM finishes the utterance and
    sends transcription.done before it reads the close. The proxy reads that event off
    the socket, so the session must bill it."""
    fake, client, journal = fake_vllm
    fake.delay = 0.01  # the engine needs a moment: its deltas and done follow the close
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await ws.send_str(COMMIT)
        await ws.send_str(append(16000))
        await ws.send_str(FINAL)
    (record,) = await recorded(journal)
    completion = realtime_usage(16000)[1]
    assert fake.generation_tokens_total == completion  # vLLM did the work and reported it
    assert record.verdict == "reported"
    assert record.completion_tokens_billed == completion


async def test_a_session_closed_without_its_final_commit_is_billed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, api_keys: Any, tmp_path: Path
) -> None:
    """Twenty appends transcribed as they arrive (the client reads the deltas vLLM sends
    once the audio fills its first step), then the client closes: the engine decoded
    those tokens, and the session must bill them, not record them as free (the proxy's
    final commit lets vLLM finish the utterance and report it)."""
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.32.0",
        api_keys=api_keys(acme="sk-acme"),
        journal=str(tmp_path / "journal.sqlite"),
    )
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await ws.send_str(COMMIT)  # the generation starts
        for _ in range(20):
            await ws.send_str(append(1600))
        delta = json.loads((await ws.receive(timeout=5)).data)
        assert delta["type"] == "transcription.delta"
    (record,) = await recorded(tmp_path / "journal.sqlite")
    assert fake.generation_tokens_total == realtime_usage(20 * 1600)[1]
    assert record.completion_tokens_billed == fake.generation_tokens_total


async def test_a_session_is_billed_under_the_model_that_served_it(
    fake_vllm: Any,
) -> None:
    """A session validated for the served model, then a session.update naming another
    (vLLM answers an error, or in some releases ignores its check) before the utterance:
    the engine's served model did the work, so the record names it."""
    _fake, client, journal = fake_vllm
    async with client.ws_connect("/v1/realtime", headers=ACME) as ws:
        await ws.receive(timeout=5)
        await ws.send_str(UPDATE)
        await ws.send_str(json.dumps({"type": "session.update", "model": "cheap-model"}))
        await utterance(ws, 16000)
    (record,) = await recorded(journal)
    assert record.verdict == "reported"
    assert record.model == "minilm"

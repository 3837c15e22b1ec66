"""Audio on real vLLM (issue #49): a tiny random Whisper (``scripts/prepare_models.py``,
whisper-tiny's real vocabulary) served by vLLM 0.29.0 and 0.32.0 with the wheel's audio
extra, a real ``usage-proxy serve --api-keys`` in front of each. Every billed request is
checked against the growth of the engine's own ``vllm:prompt_tokens_total`` and
``vllm:generation_tokens_total`` and against the journal; the fake vLLM the app tests use
is held to the same answers.

What real vLLM reports (both releases alike): a whole transcription, its seconds of audio
rounded up; a stream, the last 30-second clip's 4-token decoder prompt plus one audio token
per log-mel frame (100 a second), which the engine's prompt counter never counts; a whole
translation and a ``verbose_json`` answer, no usage. ``/v1/realtime`` is not served for
Whisper (vLLM registers it for realtime models alone: the handshake is 403); a tiny Voxtral
realtime (Mistral format, weights initialised by vLLM) serves it on 0.32.0, each utterance's
``transcription.done`` usage equal to what both counters grew by. (0.29.0 registers the
route for it too, but its CPU worker dies on the first utterance: docs/compatibility.md.)
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import math
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from proxy.ledger.journal_files import read_journal
from proxy.ledger.windows import SettledWindow
from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import (
    REALTIME_ARGS,
    WHISPER_ARGS,
    Process,
    metric,
    prepare_models,
    provision,
    reserved,
    start_proxy,
    start_vllm,
)
from tests.e2e.cases import STARTUP_BUDGET_S, VERSIONS
from tests.support.fakevllm.audio import SAMPLES_PER_AUDIO_TOKEN, wav
from tests.support.processes import start_fake
from tests.support.records import journal_records

pytestmark = pytest.mark.e2e
MODEL = "whisper"
REALTIME_MODEL = "voxtral"
REALTIME_RELEASE = "0.32.0"
KEY = {"Authorization": "Bearer sk-acme-audio"}
TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
# Text tokens per 30-second clip: the random model never ends a clip before its cap.
CAP = 8
DECODER_PROMPT = 4  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
CLIP_SECONDS = 30
FRAMES_PER_SECOND = 100  # Whisper: 16 kHz audio, hop length 160


@dataclass(frozen=True)
class Audio:
    """One release: the vLLM server, the proxy in front of it, its journal, and the fake
    vLLM of the same release."""

    vllm: str
    proxy: str
    journal: Path
    fake: str


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Audio]]:
    """One vLLM server per release serving whisper-tiny and one 0.32.0 server serving
    voxtral-realtime-tiny (key ``realtime``), started together; a proxy (keyed tenant, its
    own journal, reconciling every second) and a fake of the same release and model name
    in front of each."""
    work = tmp_path_factory.mktemp("audio")
    keys = work / "keys.yaml"
    keys.write_text(f"acme: {key_digest(KEY['Authorization'].removeprefix('Bearer '))}\n")
    models = prepare_models(provision(VERSIONS[0]))
    specs = {v: (v, models["whisper"], MODEL, WHISPER_ARGS) for v in VERSIONS}
    if REALTIME_RELEASE in VERSIONS:
        realtime = (REALTIME_RELEASE, models["realtime"], REALTIME_MODEL, REALTIME_ARGS)
        specs["realtime"] = realtime
    processes: list[Process] = []
    try:
        with reserved(len(specs)) as slots:
            servers = {
                key: start_vllm(
                    provision(version), model, name, work, extra_args=args, slots=[slots.pop()]
                )
                for key, (version, model, name, args) in specs.items()
            }
        processes.extend(servers.values())
        for server in servers.values():
            server.wait_ready("/health", STARTUP_BUDGET_S)
        releases, proxies = {}, []
        for key, server in servers.items():
            version, model, name, _ = specs[key]
            journal = work / f"journal-{key}.sqlite"
            args = ("--api-keys", str(keys), "--journal", str(journal))
            proxies.append(start_proxy(server.url, work, *args, "--reconcile-interval", "1"))
            processes.append(proxies[-1])
            processes.append(start_fake(model, work, version, name=name))
            releases[key] = Audio(server.url, proxies[-1].url, journal, processes[-1].url)
        for proxy in proxies:
            proxy.wait_ready("/readyz", 60)
        yield releases
    finally:
        for process in processes:
            process.stop()


def form(fields: dict[str, str], seconds: float) -> tuple[bytes, str]:
    """A multipart form as a client library sends it: the WAV file, then the fields."""
    boundary = uuid.uuid4().hex
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    parts = [head.encode() + b"Content-Type: audio/wav\r\n\r\n" + wav(seconds) + b"\r\n"]
    for name, value in fields.items():
        disposition = f'Content-Disposition: form-data; name="{name}"'
        parts.append(f"--{boundary}\r\n{disposition}\r\n\r\n{value}\r\n".encode())
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def send(
    url: str, fields: dict[str, str], seconds: float, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """POST the audio form; the status, headers and body, errors included."""
    body, kind = form({"model": MODEL, "max_completion_tokens": str(CAP), **fields}, seconds)
    request = urllib.request.Request(url, body, {"Content-Type": kind, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def counters(url: str) -> tuple[int, int]:
    """The engine's prompt and generation token counters."""
    return int(metric(url)), int(metric(url, "vllm:generation_tokens_total"))


def moved(url: str, before: tuple[int, int]) -> tuple[int, int]:
    after = counters(url)
    return after[0] - before[0], after[1] - before[1]


def usage_of(body: bytes) -> Any:
    """The usage of a whole answer, or of a stream's last usage chunk (None: none)."""
    if not body.startswith(b"data: "):
        return json.loads(body).get("usage")
    events = [b[len("data: ") :] for b in body.decode().split("\n\n") if b.startswith("data: ")]
    found = [json.loads(e)["usage"] for e in events if e != "[DONE]" and '"usage"' in e]
    return found[-1] if found else None


def expected_stream(seconds: float, language: bool) -> dict[str, int]:
    """What a Whisper stream bills and moves, as read in vLLM's code and measured here: the
    engine reads the decoder prompt and generates CAP tokens per clip (after a one-token
    language detection without a language); the usage reports the last clip's decoder
    prompt and the audio's frames, and every clip's text tokens."""
    clips, detection = math.ceil(seconds / CLIP_SECONDS), 0 if language else 1
    return {
        "engine_prompt": DECODER_PROMPT * clips + detection,
        "engine_generation": CAP * clips + detection,
        "prompt": DECODER_PROMPT + math.ceil(seconds * FRAMES_PER_SECOND),
        "completion": CAP * clips,
    }


# Requests sent to the real vLLM and to the fake alike: (path, form fields, seconds).
SAME_ANSWERS = {
    "transcription-whole": (TRANSCRIPTIONS, {"language": "en"}, 3.6),
    "transcription-text": (TRANSCRIPTIONS, {"language": "en", "response_format": "text"}, 2.5),
    "transcription-verbose": (
        TRANSCRIPTIONS,
        {"language": "en", "response_format": "verbose_json"},
        2.5,
    ),
    "translation-whole": (TRANSLATIONS, {"language": "en"}, 3.6),
    "transcription-stream": (TRANSCRIPTIONS, {"language": "en", "stream": "true"}, 3.6),
    "translation-stream": (TRANSLATIONS, {"language": "en", "stream": "true"}, 3.6),
    "stream-no-language": (TRANSCRIPTIONS, {"stream": "true"}, 3.6),
    "stream-two-clips": (TRANSCRIPTIONS, {"language": "en", "stream": "true"}, 45.0),
    "continuous-usage": (
        TRANSLATIONS,
        {"language": "en", "stream": "true", "stream_continuous_usage_stats": "true"},
        2.5,
    ),
    # refused by vLLM: the error bodies are compared whole
    "format-srt": (TRANSCRIPTIONS, {"language": "en", "response_format": "srt"}, 2.5),
    "usage-without-stream": (TRANSCRIPTIONS, {"stream_include_usage": "true"}, 2.5),
    "verbose-stream": (
        TRANSCRIPTIONS,
        {"language": "en", "response_format": "verbose_json", "stream": "true"},
        2.5,
    ),
    "unknown-model": (TRANSLATIONS, {"model": "nope", "language": "en"}, 2.5),
}


@pytest.mark.parametrize("release", VERSIONS)
@pytest.mark.parametrize("case", SAME_ANSWERS)
def test_the_fake_answers_as_real_vllm(audio: dict[str, Audio], release: str, case: str) -> None:
    """Each request straight to real vLLM and to the fake of the same release: the same
    status, the same usage (seconds, or a stream's tokens with stream_include_usage) or the
    same error body, the same growth of both engine counters."""
    path, fields, seconds = SAME_ANSWERS[case]
    if fields.get("stream"):
        fields = {**fields, "stream_include_usage": "true"}
    seen = []
    for url in (audio[release].vllm, audio[release].fake):
        before = counters(url)
        status, _, body = send(url + path, fields, seconds)
        answer = json.loads(body) if status >= 400 else usage_of(body)
        seen.append((status, answer, moved(url, before)))
    assert seen[1] == seen[0]


@pytest.mark.parametrize("release", VERSIONS)
def test_a_whole_transcription_is_billed_its_seconds(audio: dict[str, Audio], release: str) -> None:
    """3.6 s of audio: vLLM's usage says 4 seconds and the record bills 4 audio seconds to
    the key's tenant, no tokens; the engine read 4 decoder tokens and generated CAP, which
    no token bill shows (reconciliation names them ``billed_in_seconds``)."""
    pair = audio[release]
    before = counters(pair.vllm)
    status, headers, body = send(pair.proxy + TRANSCRIPTIONS, {"language": "en"}, 3.6, KEY)
    assert status == 200, body
    assert json.loads(body)["usage"] == {"type": "duration", "seconds": 4}
    assert moved(pair.vllm, before) == (DECODER_PROMPT, CAP)
    (record,) = [
        r for r in journal_records(pair.journal) if r.record_id == headers.get("x-usage-record-id")
    ]
    assert (record.tenant, record.model, record.operation) == ("acme", MODEL, "transcriptions")
    assert (record.units.audio_seconds, record.verdict) == (4, "reported")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (None, None)


@pytest.mark.parametrize("release", VERSIONS)
@pytest.mark.parametrize(
    ("path", "fields", "seconds"),
    [
        (TRANSCRIPTIONS, {"language": "en"}, 3.6),
        (TRANSLATIONS, {"language": "en", "stream_include_usage": "true"}, 3.6),
        (TRANSCRIPTIONS, {}, 3.6),
        (TRANSCRIPTIONS, {"language": "en"}, 45.0),
    ],
    ids=["transcription", "translation-usage-asked", "no-language", "two-clips"],
)
def test_a_stream_is_billed_vllms_tokens(
    audio: dict[str, Audio], release: str, path: str, fields: dict[str, str], seconds: float
) -> None:
    """A stream is billed the tokens vLLM reports: the completion tokens exactly what the
    engine's generation counter grew by (less Whisper's one-token language detection when
    the form names no language); the prompt tokens the last clip's decoder prompt plus the
    audio's frames, which the engine's prompt counter does not count (it grows by each
    clip's decoder prompt). The client sees the usage chunk only when it asked for it."""
    pair = audio[release]
    records = len(journal_records(pair.journal))
    before = counters(pair.vllm)
    status, _, body = send(pair.proxy + path, {**fields, "stream": "true"}, seconds, KEY)
    assert status == 200, body
    want = expected_stream(seconds, "language" in fields)
    assert moved(pair.vllm, before) == (want["engine_prompt"], want["engine_generation"])
    (record,) = journal_records(pair.journal)[records:]
    assert (record.tenant, record.operation) == ("acme", path.rsplit("/", 1)[1])
    assert record.prompt_tokens_billed == record.prompt_tokens_reported == want["prompt"]
    assert record.completion_tokens_billed == want["completion"]
    asked = "stream_include_usage" in fields
    total = want["prompt"] + want["completion"]
    usage = {"prompt_tokens": want["prompt"], "completion_tokens": want["completion"]}
    assert usage_of(body) == ({**usage, "total_tokens": total} if asked else None)


@pytest.mark.parametrize("release", VERSIONS)
def test_a_whole_translation_is_refused_naming_its_opt_in(
    audio: dict[str, Audio], release: str
) -> None:
    """vLLM answers a whole translation 200 without any usage, after the engine's work;
    through the proxy it is refused before vLLM (the counters do not move, no record), in
    vLLM's error shape, naming --allow-unmetered and the feature to give it."""
    pair = audio[release]
    before = counters(pair.vllm)
    status, _, body = send(pair.vllm + TRANSLATIONS, {"language": "en"}, 3.6)
    assert status == 200
    assert "usage" not in json.loads(body)
    assert moved(pair.vllm, before) == (DECODER_PROMPT, CAP)
    records = len(journal_records(pair.journal))
    before = counters(pair.vllm)
    status, _, body = send(pair.proxy + TRANSLATIONS, {"language": "en"}, 3.6, KEY)
    assert status == 400
    error = json.loads(body)["error"]
    assert sorted(error) == ["code", "message", "param", "type"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", "stream", 400)
    assert "--allow-unmetered translations.whole" in error["message"]
    assert moved(pair.vllm, before) == (0, 0)
    assert len(journal_records(pair.journal)) == records


def handshake(url: str) -> tuple[int, bytes]:
    """A WebSocket opening handshake on ``/v1/realtime``: the status and body answered."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        headers = {
            **KEY,
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        connection.request("GET", "/v1/realtime", headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize("release", VERSIONS)
def test_realtime_is_not_served_for_whisper(audio: dict[str, Audio], release: str) -> None:
    """vLLM registers /v1/realtime only for realtime models (Qwen3-ASR realtime, Voxtral
    realtime); for Whisper the handshake is 403 with an empty body. The proxy passes the
    status on, in vLLM's error shape, and records nothing."""
    pair = audio[release]
    records = len(journal_records(pair.journal))
    assert handshake(pair.vllm) == (403, b"")
    status, body = handshake(pair.proxy)
    assert status == 403
    assert json.loads(body)["error"]["code"] == 403
    assert len(journal_records(pair.journal)) == records


def windows(journal: Path) -> list[SettledWindow]:
    return [
        SettledWindow.model_validate_json(b) for b in read_journal(journal, kind="reconciliation")
    ]


def next_window(journal: Path, after: int, records: int = 0) -> SettledWindow:
    """The first settled window past the ``after`` first ones with at least ``records``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [w for w in windows(journal)[after:] if w.records >= records]
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no reconciliation window with {records} record(s) in 30 s")


@pytest.mark.parametrize("release", VERSIONS)
def test_reconciliation_names_the_audio_tokens(audio: dict[str, Audio], release: str) -> None:
    """A window holding one stream of 3.6 s: the engine's prompt counter grew by the 4
    decoder tokens, the record bills vLLM's 364; the 360 audio tokens are named as such,
    not as a counting defect, and the completion tokens agree."""
    pair = audio[release]
    # two more windows first: the stream lands in a later one, which began after this test
    # did, so no earlier engine work (requests sent straight to vLLM among them) is in it
    after = len(windows(pair.journal)) + 2
    next_window(pair.journal, after - 1)
    fields = {"language": "en", "stream": "true"}
    assert send(pair.proxy + TRANSCRIPTIONS, fields, 3.6, KEY)[0] == 200
    window = next_window(pair.journal, after, records=1)
    assert window.records == 1
    assert (window.engine_prompt_tokens, window.billed_prompt_tokens) == (4, 364)
    assert window.overbilled_prompt_tokens == 360
    assert (window.engine_completion_tokens, window.billed_completion_tokens) == (CAP, CAP)
    assert [c.code for c in window.causes] == ["audio_tokens"]


async def session(url: str, utterances: list[int], final: bool = True) -> list[dict[str, Any]]:
    """A realtime session with the served model: for each utterance, a commit, its samples
    of PCM16 (a tone) in 100 ms appends, the final commit, and every event up to its
    transcription.done; without ``final`` the last utterance is left running and the
    session closed. The events the client read."""
    seen: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(url + "/v1/realtime", headers=KEY) as ws,
    ):
        seen.append(json.loads((await ws.receive(timeout=60)).data))
        await ws.send_json({"type": "session.update", "model": REALTIME_MODEL})
        for n, samples in enumerate(utterances):
            await ws.send_json({"type": "input_audio_buffer.commit"})
            pcm = bytes((i * 7) % 256 for i in range(2 * samples))
            for at in range(0, len(pcm), 3200):
                chunk = base64.b64encode(pcm[at : at + 3200]).decode()
                await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
            if not final and n == len(utterances) - 1:
                return seen
            await ws.send_json({"type": "input_audio_buffer.commit", "final": True})
            while True:
                seen.append(json.loads((await ws.receive(timeout=120)).data))
                assert seen[-1]["type"] != "error", seen[-1]
                if seen[-1]["type"] == "transcription.done":
                    break
    return seen


def usages(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["usage"] for e in seen if e["type"] == "transcription.done"]


def realtime_pair(audio: dict[str, Audio]) -> Audio:
    if "realtime" not in audio:
        pytest.skip(f"vLLM {REALTIME_RELEASE} is not among the e2e releases")
    return audio["realtime"]


def test_the_fake_realtime_answers_as_real_vllm(audio: dict[str, Audio]) -> None:
    """A session of two utterances (0.16 s and 1 s) straight to real vLLM 0.32.0 serving
    Voxtral realtime and to the fake: the same events (a delta per generated token, then
    transcription.done), the same usages, the same growth of both engine counters."""
    pair = realtime_pair(audio)
    seen = []
    for url in (pair.vllm, pair.fake):
        before = counters(url)
        events = asyncio.run(session(url, [2 * SAMPLES_PER_AUDIO_TOKEN, 16000]))
        kinds = [e["type"] for e in events if e["type"] != "transcription.delta"]
        deltas = sum(e["type"] == "transcription.delta" for e in events)
        seen.append((kinds, deltas, usages(events), moved(url, before)))
    assert seen[1] == seen[0]


def test_a_realtime_session_is_billed_what_the_engine_counted(audio: dict[str, Audio]) -> None:
    """Two utterances through the proxy: one record for the session (operation realtime,
    status 101, the key's tenant, the served model) billing the sum of the two
    transcription.done usages, which is exactly what both engine counters grew by."""
    pair = realtime_pair(audio)
    records = len(journal_records(pair.journal))
    before = counters(pair.vllm)
    events = asyncio.run(session(pair.proxy, [16000, 32000]))
    grew = moved(pair.vllm, before)
    (record,) = wait_records(pair.journal, records)
    assert (record.operation, record.status, record.tenant) == ("realtime", 101, "acme")
    assert (record.model, record.verdict, record.aborted) == (REALTIME_MODEL, "reported", False)
    billed = (record.prompt_tokens_billed, record.completion_tokens_billed)
    reported = tuple(
        sum(u[k] for u in usages(events)) for k in ("prompt_tokens", "completion_tokens")
    )
    assert billed == reported == grew


def test_a_realtime_client_that_leaves_is_billed_the_engines_work(
    audio: dict[str, Audio],
) -> None:
    """A client that commits, sends 2 s of audio and closes without the final commit: vLLM
    would cancel the generation with no usage; the proxy sends the final commit, reads the
    transcription.done and bills it: what both counters grew by, not free."""
    pair = realtime_pair(audio)
    records = len(journal_records(pair.journal))
    before = counters(pair.vllm)
    asyncio.run(session(pair.proxy, [32000], final=False))
    (record,) = wait_records(pair.journal, records)
    assert (record.verdict, record.aborted) == ("reported", False)
    billed = (record.prompt_tokens_billed, record.completion_tokens_billed)
    assert billed == moved(pair.vllm, before)
    assert (record.completion_tokens_billed or 0) > 0  # the engine's work, billed


def wait_records(journal: Path, after: int) -> list[Any]:
    """The records journaled past the first ``after`` once there are any (a session is
    recorded as it ends, after its socket closed)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if found := journal_records(journal)[after:]:
            return found
        time.sleep(0.1)
    raise AssertionError("no record in 30 s")

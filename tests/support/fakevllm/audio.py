"""Speech to text: ``/v1/audio/transcriptions`` and ``/translations`` as vLLM serves them
(``entrypoints/speech_to_text``, 0.10.2 to 0.32.0; 0.8.5 for transcriptions alone), and the
``/v1/realtime`` WebSocket (0.20.2 to 0.32.0).

The form is read by the standard library's MIME parser (not the proxy's), as FastAPI fills
a ``Form()`` model: each field's last value, an empty one as absent, booleans in lax mode. The audio
is a WAV file whose length is its duration (vLLM decodes it; the fake reads the header).

The counts are Whisper's as real vLLM 0.29.0 and 0.32.0 serve it (tests/e2e/test_audio_real_vllm.py,
issue #49): the engine reads a 4-token decoder prompt and generates text for each 30-second
clip of the audio (its counters grow by those alone), after a one-token language detection
when the form names no language (0.19 on); a stream's usage reports the last clip's decoder
prompt plus one audio token per log-mel frame (100 a second), the text tokens of every clip.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import math
import wave
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from aiohttp import WSMsgType, web
from multidict import CIMultiDict
from pydantic import TypeAdapter, ValidationError

from tests.support.fakevllm.base import FakeState, dumps, error

LAX_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
# Whisper's decoder prompt (<|startoftranscript|>, language, task, <|notimestamps|>): what
# the engine's prompt counter grows by for each clip; the audio is encoder input.
AUDIO_PROMPT = 4
# vLLM's Whisper.get_num_audio_tokens: ceil(seconds * 16000 / hop length 160), which a
# stream's usage adds to its prompt tokens (the engine's counter never counts them).
MEL_FRAMES_PER_SECOND = 100
# Whisper reads the audio in clips of up to 30 s (vLLM splits longer audio).
CLIP_SECONDS = 30


def audio_tokens(seconds: float) -> int:
    """The audio tokens vLLM reports in a stream's prompt tokens for ``seconds`` of audio."""
    return math.ceil(seconds * MEL_FRAMES_PER_SECOND)


def wav_seconds(data: bytes) -> float:
    """A WAV file's duration as vLLM 0.32.0 decodes it (torchcodec, so FFmpeg's WAV
    demuxer): the data chunk's frames, and a chunk whose size says 0 (or 0xFFFFFFFF)
    read to the end of the file; raises wave.Error for what is no WAV."""
    with wave.open(io.BytesIO(data)) as w:
        frames, rate = w.getnframes(), w.getframerate()
        frame = w.getsampwidth() * w.getnchannels()
    at = 12
    while at + 8 <= len(data):  # the chunks, to the data chunk (wave.open found one)
        name, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if name == b"data":
            if size in (0, 0xFFFFFFFF):
                frames = (len(data) - at - 8) // frame
            break
        at += 8 + size + size % 2
    return frames / rate


def wav(seconds: float, rate: int = 16000) -> bytes:
    """A silent mono 16-bit WAV file of ``seconds``."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


@dataclass(frozen=True)
class Upload:
    """A file part."""

    data: bytes


def parse_form(content_type: str, body: bytes) -> list[tuple[str, str | Upload]] | None:
    """The parts of a multipart form in order (None: not one)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    parts: list[tuple[str, str | Upload]] = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(data, bytes):
            return None
        parts.append((name, Upload(data) if part.get_filename() else data.decode()))
    return parts


def _last(form: list[tuple[str, str | Upload]], name: str) -> Any:
    """Starlette's ``FormData.get``: the last value; FastAPI reads "" as absent."""
    values = [v for k, v in form if k == name]
    value = values[-1] if values else None
    return None if value == "" else value


def _flag(value: Any) -> bool:
    return value is not None and LAX_BOOL.validate_python(value)


class AudioAPI(FakeState):
    """The speech-to-text endpoints; the engine's counters grow as vLLM's do."""

    async def handle_transcriptions(self, request: web.Request) -> web.StreamResponse:
        return await self._speech_to_text(request, "transcription")

    async def handle_translations(self, request: web.Request) -> web.StreamResponse:
        if not self._since(0, 10):  # 0.8.5 serves transcriptions only
            return error(404, "Not Found", "Not Found")
        return await self._speech_to_text(request, "translation")

    def _formats(self) -> tuple[tuple[str, ...], str]:
        """The response formats each release accepts, and its refusal of the others."""
        if self._since(0, 29):
            return ("text", "json", "verbose_json", "diarized_json"), (
                "Currently only support response_format: "
                "`text`, `json`, `verbose_json` or `diarized_json`"
            )
        if self._since(0, 15):
            return ("text", "json", "verbose_json"), (
                "Currently only support response_format: `text`, `json` or `verbose_json`"
            )
        return ("text", "json"), "Currently only support response_format `text` or `json`"

    def _unknown(self, model: str) -> str:
        """vLLM's ``_check_model`` refusal of a name it does not serve."""
        message = f"The model `{model}` does not exist."
        if self._since(0, 32):
            message += f" Valid aliases: {', '.join(self.names)}."
        return message

    def _since(self, major: int, minor: int) -> bool:
        found = tuple(int(x) for x in self.version.split(".")[:2])
        return found >= (major, minor)

    async def _speech_to_text(self, request: web.Request, task: str) -> web.StreamResponse:
        """vLLM's ``create_transcriptions``: the form validated, the audio decoded, then the
        whole answer or the stream (``_create_speech_to_text``)."""
        self.seen_headers.append(CIMultiDict(request.headers))
        self.last_body = await request.read()
        form = parse_form(request.headers.get("Content-Type", ""), self.last_body)
        upload = _last(form or [], "file")
        if form is None or not isinstance(upload, Upload):
            return error(400, "1 validation error:\n  file: Field required", "Bad Request")
        options = ("stream_include_usage", "stream_continuous_usage_stats")
        if any(bool(_last(form, o)) for o in options) and not _last(form, "stream"):
            asked = next(o for o in options if _last(form, o))
            message = "Stream options can only be defined when `stream=True`."
            if self._since(0, 15):  # a VLLMValidationError names its parameter
                message += f" (parameter={asked})"
            return error(400, message, "BadRequestError", asked)
        try:
            stream, include, continuous = (_flag(_last(form, n)) for n in ("stream", *options))
        except ValidationError:
            return error(400, "1 validation error:\n  stream: not a boolean", "Bad Request")
        model = _last(form, "model")
        if model is not None and model not in self.names:
            return error(404, self._unknown(model), "NotFoundError", "model")
        response_format = _last(form, "response_format") or "json"
        formats, message = self._formats()
        if response_format not in formats:
            return error(400, message, "BadRequestError")
        if response_format in ("verbose_json", "diarized_json") and stream:
            message = f"{response_format} format doesn't support streaming case"
            return error(400, message, "BadRequestError")
        try:
            duration = wav_seconds(upload.data)
        except (wave.Error, EOFError):
            return error(400, "Invalid or unsupported audio file.", "BadRequestError")
        model = model or self.name
        clips = _Clips(max(1, math.ceil(duration / CLIP_SECONDS)), self._per_clip(form))
        if _last(form, "language") is None and self._since(0, 19):  # language detection
            self.prompt_tokens_total += 1
            self.generation_tokens_total += 1
        self.prompt_tokens_total += AUDIO_PROMPT * clips.count
        self.generation_tokens_total += clips.tokens
        if stream:
            prompt = self._stream_prompt(duration)
            return await self._stream(request, task, model, (include, continuous), prompt, clips)
        return self.answer(dumps(self._whole(task, response_format, duration, clips)))

    def _per_clip(self, form: list[tuple[str, str | Upload]]) -> int:
        """Text tokens generated for each clip: ``max_completion_tokens`` when the form sets
        it (a random model never stops before it), else the fake's ``chunks``."""
        cap = _last(form, "max_completion_tokens")
        return int(cap) if isinstance(cap, str) and cap.isdigit() else self.chunks

    def _stream_prompt(self, duration: float) -> int:
        """A stream's prompt tokens: the last clip's decoder prompt and the audio's tokens
        (0.8.5 leaves the 4 decoder tokens out)."""
        return (AUDIO_PROMPT if self._since(0, 10) else 0) + audio_tokens(duration)

    def _whole(
        self, task: str, response_format: str, duration: float, clips: _Clips
    ) -> dict[str, Any]:
        """A whole answer: a transcription's usage in seconds of audio, rounded up (0.10.2
        on; 0.8.5 answers the text alone); none in verbose_json, none for a translation."""
        text = " ".join(f"t{i}" for i in range(clips.tokens))
        if response_format == "verbose_json":
            return {"duration": duration, "language": "en", "text": text, "segments": []}
        if task == "translation" or not self._since(0, 10):
            return {"text": text}
        usage = {"type": "duration", "seconds": math.ceil(duration)}
        if response_format == "diarized_json":  # TranscriptionResponseDiarized
            segment = {"type": "transcript.text.segment", "id": "seg_0", "start": 0.0}
            segment.update(end=duration, text=text, speaker="A")
            return {
                "task": "transcribe",
                "duration": duration,
                "text": text,
                "segments": [segment],
                "usage": usage,
            }
        return {"text": text, "usage": usage}

    async def _stream(
        self,
        request: web.Request,
        task: str,
        model: str,
        options: tuple[bool, bool],
        prompt: int,
        clips: _Clips,
    ) -> web.StreamResponse:
        """``_speech_to_text_stream_generator``: a chunk per token, usage per chunk with
        both ``options`` (include, continuous), a last usage chunk (``choices: []``) with
        include_usage, [DONE]."""
        include, continuous = options
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        head = {"id": f"{task}-1", "object": f"{task}.chunk", "created": 1, "model": model}
        for i in range(clips.tokens):
            choice: dict[str, Any] = {"delta": {"content": f"t{i}"}}
            if (i + 1) % clips.per_clip == 0:  # each clip's generation ends
                choice.update(finish_reason="stop", stop_reason=None)
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if include and continuous:
                chunk["usage"] = _usage(prompt, i + 1)
            await reply.write(b"data: " + dumps(chunk) + b"\n\n")
            await asyncio.sleep(self.delay)
        if include:
            last = {**head, "choices": [], "usage": _usage(prompt, clips.tokens)}
            await reply.write(b"data: " + dumps(last) + b"\n\n")
        await reply.write(b"data: [DONE]\n\n")
        await reply.write_eof()
        return reply


@dataclass(frozen=True)
class _Clips:
    """The clips Whisper reads the audio in, and the text tokens generated for each."""

    count: int
    per_clip: int

    @property
    def tokens(self) -> int:
        return self.count * self.per_clip


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


# Realtime (``speech_to_text/realtime/connection.py``, 0.20.2 to 0.32.0): PCM16 at 16 kHz,
# appended base64. The counts are those of the tiny Voxtral realtime that real vLLM 0.32.0
# serves here (scripts/prepare_models.py; tests/e2e/test_audio_real_vllm.py): one audio
# token per 80 ms (1,280 samples); each utterance's prompt is the streaming prefix (BOS,
# 32 tokens of left padding, 6 of delay), the only prompt tokens the engine counts; the
# generation makes one token per audio token step over the padded audio (vLLM's
# VoxtralRealtimeBuffer), each its own transcription.delta.
SAMPLES_PER_AUDIO_TOKEN = 1280
REALTIME_PROMPT = 1 + 32 + 6
_LEFT_PAD = 32 * SAMPLES_PER_AUDIO_TOKEN
_RIGHT_PAD = 17 * SAMPLES_PER_AUDIO_TOKEN  # mistral_common's right padding, 480 ms of delay
_LOOK_AHEAD = 40  # 2.5 ms


def realtime_usage(samples: int) -> tuple[int, int]:
    """The prompt and completion tokens of one utterance of ``samples`` (both counters grow
    by them): the first step reads the prefix, each later one 1,280 samples more."""
    return REALTIME_PROMPT, _steps(_LEFT_PAD + samples + _RIGHT_PAD)


def _steps(audio: int) -> int:
    """Generation steps vLLM's buffer has audio for: the first needs the prefix's samples
    and the look-ahead, each later one 1,280 more."""
    first = REALTIME_PROMPT * SAMPLES_PER_AUDIO_TOKEN + _LOOK_AHEAD
    return 0 if audio < first else 1 + (audio - first) // SAMPLES_PER_AUDIO_TOKEN


class RealtimeAPI(FakeState):
    """``GET /v1/realtime``: vLLM's ``RealtimeConnection`` event for event."""

    async def handle_realtime(self, request: web.Request) -> web.StreamResponse:
        found = tuple(int(x) for x in self.version.split(".")[:2])
        if found < (0, 20):
            return error(404, "Not Found", "Not Found")
        ws = web.WebSocketResponse()
        if not ws.can_prepare(request).ok:
            return error(404, "Not Found", "Not Found")
        await ws.prepare(request)
        await ws.send_str(json.dumps({"type": "session.created", "id": "sess-1", "created": 1}))
        session = _Session()
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                break
            try:
                event = json.loads(message.data)
            except ValueError:
                await _send_error(ws, "Invalid JSON", "invalid_json")
                continue
            await self._realtime_event(ws, session, event)
        if session.task is not None:  # the client left: vLLM cancels the generation
            session.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await session.task
        return ws

    async def _realtime_event(
        self, ws: web.WebSocketResponse, session: _Session, event: dict[str, Any]
    ) -> None:
        kind = event.get("type")
        if kind == "session.update":
            model = event.get("model")
            if model is None:
                await _send_error(ws, "Missing required field: model", "invalid_event")
            elif model not in self.names:
                await _send_error(ws, f"The model `{model}` does not exist.", "model_not_found")
            else:
                session.validated = True
        elif kind == "input_audio_buffer.append":
            try:
                session.samples += len(base64.b64decode(event["audio"], validate=True)) // 2
            except (KeyError, ValueError):
                await _send_error(ws, "Invalid audio data", "invalid_audio")
            if session.generating:  # the generation decodes the audio as it arrives
                await self._decode(ws, session, _steps(_LEFT_PAD + session.samples))
        elif kind == "input_audio_buffer.commit":
            if not session.validated:
                message = (
                    "Model not validated. Make sure to validate the model by sending a "
                    "session.update event."
                )
                await _send_error(ws, message, "model_not_validated")
            elif not event.get("final"):
                session.generating = True
            elif session.generating and (session.task is None or session.task.done()):
                # vLLM's generation is a task of its own: the connection reads on
                session.task = asyncio.create_task(self._transcribe(ws, session))
        else:
            await _send_error(ws, f"Unknown event type: {kind}", "unknown_event")

    async def _decode(self, ws: web.WebSocketResponse, session: _Session, steps: int) -> None:
        """The generation steps the audio so far allows: the first reads the prompt (the
        engine counts it then), each makes one token, sent as its own delta."""
        if steps and not session.emitted:
            self.prompt_tokens_total += REALTIME_PROMPT
        for i in range(session.emitted, steps):
            self.generation_tokens_total += 1
            session.emitted += 1
            await ws.send_str(json.dumps({"type": "transcription.delta", "delta": f"t{i}"}))
            await asyncio.sleep(self.delay)

    async def _transcribe(self, ws: web.WebSocketResponse, session: _Session) -> None:
        """The generation the final commit completes: the right padding's steps, then the
        usage of the whole generation (``realtime_usage``; vLLM's ``UsageInfo``)."""
        prompt, completion = realtime_usage(session.samples)
        await self._decode(ws, session, completion)
        usage = {
            **_usage(prompt, completion),
            **self.prompt_details(),
            "completion_tokens_details": None,
        }
        text = "".join(f"t{i}" for i in range(completion))
        await ws.send_str(json.dumps({"type": "transcription.done", "text": text, "usage": usage}))
        session.generating, session.samples, session.emitted = False, 0, 0


@dataclass
class _Session:
    validated: bool = False
    generating: bool = False
    samples: int = 0
    emitted: int = 0  # tokens the running generation has sent
    task: asyncio.Task[None] | None = None


async def _send_error(ws: web.WebSocketResponse, message: str, code: str) -> None:
    await ws.send_str(json.dumps({"type": "error", "error": message, "code": code}))

"""Audio requests as a client sends them for tests: the multipart form (the file, then
the fields), and the events of a streamed answer."""

from __future__ import annotations

import io
import json
from typing import Any

import aiohttp

from tests.support.fakevllm.audio import AUDIO_PROMPT, audio_tokens, wav

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

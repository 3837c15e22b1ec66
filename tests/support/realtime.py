"""A realtime session's client side for tests: the events a client sends (audio, commits,
a session.update), reading the server's events up to one kind, one whole utterance, and
the session's record once it is journaled."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import aiohttp

from proxy.ledger.records import UsageRecord
from tests.support.records import journal_records

COMMIT = json.dumps({"type": "input_audio_buffer.commit"})
FINAL = json.dumps({"type": "input_audio_buffer.commit", "final": True})
UPDATE = json.dumps({"type": "session.update", "model": "minilm"})


def append(samples: int) -> str:
    """An input_audio_buffer.append of ``samples`` of silent PCM16."""
    audio = base64.b64encode(b"\0\0" * samples).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


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


async def utterance(ws: aiohttp.ClientWebSocketResponse, samples: int) -> list[dict[str, Any]]:
    """One utterance: commit, audio, final commit; the events up to its done."""
    await ws.send_str(COMMIT)
    await ws.send_str(append(samples))
    await ws.send_str(FINAL)
    return await events_until(ws, "transcription.done")

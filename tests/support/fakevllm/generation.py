"""Generation: chat and completions, the Anthropic Messages API, the Responses API and
structured decisions, whole or streamed, as vLLM serves them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from pydantic import TypeAdapter

from tests.support.fakevllm.base import FakeState, dumps

# /v1/messages and /v1/responses: a prompt of 12 tokens, 8 of them served by the prefix
# cache, and 3 generated.
PROMPT, CACHED, COMPLETION = 12, 8, 3


class GenerationAPI(FakeState):
    """The generating endpoints; the engine's counters grow as vLLM's do."""

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        """SSE when stream is true: a few chunks, spaced by ``delay`` seconds."""
        body = await request.json()
        self.seen_headers.append(CIMultiDict(request.headers))
        lax = TypeAdapter(bool)  # vLLM's request models read booleans in lax mode
        self.prompt_tokens_total += 5
        self.generation_tokens_total += 3
        if not lax.validate_python(body.get("stream") or False):
            usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            return self.answer(dumps({"id": "chat-1", "choices": [], "usage": usage}))
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        for i in range(self.chunks):
            chunk = {"id": "chat-1", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            await reply.write(b"data: " + dumps(chunk) + b"\n\n")
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay)
        options = body.get("stream_options") or {}
        if lax.validate_python(options.get("include_usage") or False):
            usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            chunk = {"id": "chat-1", "choices": [], "usage": usage}
            await reply.write(b"data: " + dumps(chunk) + b"\n\n")
        await reply.write(b"data: [DONE]\n\n")
        await reply.write_eof()
        return reply

    async def _generate(self, request: web.Request) -> tuple[dict[str, Any], bool]:
        """The request, whether it streams; the engine's counters grow as vLLM's do."""
        body = await request.json()
        self.seen_headers.append(CIMultiDict(request.headers))
        self.prompt_tokens_total += PROMPT
        self.generation_tokens_total += COMPLETION
        return body, TypeAdapter(bool).validate_python(body.get("stream") or False)

    async def _events(self, request: web.Request, events: list[tuple[str, Any]]) -> Any:
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        for name, data in events:
            await reply.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            await asyncio.sleep(self.delay)
        await reply.write_eof()
        return reply

    async def handle_messages(self, request: web.Request) -> web.StreamResponse:
        """The Anthropic Messages API as vLLM serves it (``anthropic/serving.py``):
        ``input_tokens`` is the prompt less what the cache served, reported apart; a
        stream's usage is in ``message_start`` (inside ``message``) and ``message_delta``,
        and it ends with ``message_stop``."""
        body, streamed = await self._generate(request)
        usage = {
            "input_tokens": PROMPT - CACHED,
            "output_tokens": COMPLETION,
            "cache_read_input_tokens": CACHED,
        }
        message = {
            "id": "chatcmpl-1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "model": body.get("model") or self.name,
            "stop_reason": "end_turn",
            "usage": usage,
        }
        if not streamed:
            return self.answer(dumps(message))
        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = {**usage, "output_tokens": 0}
        block = {"type": "text", "text": ""}
        text = {"type": "text_delta", "text": "hi"}
        stop = {"stop_reason": "end_turn", "stop_sequence": None}
        return await self._events(
            request,
            [
                ("message_start", {"type": "message_start", "message": start}),
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": block},
                ),
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": text}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}),
                ("message_stop", {"type": "message_stop"}),
            ],
        )

    async def handle_decisions(self, request: web.Request) -> web.Response:
        """vLLM 0.32.0's structured decisions: never streamed, one usage summing the reads
        (``generate/structured_decisions``)."""
        body, _ = await self._generate(request)
        return self.answer(
            dumps(
                {
                    "id": "dec-1",
                    "object": "structured_decision",
                    "created": 1,
                    "model": body.get("model") or self.name,
                    "answers": {},
                    "usage": {"input_tokens": PROMPT, "output_tokens": COMPLETION},
                    "diagnostics": {},
                }
            )
        )

    async def handle_responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API as vLLM serves it (``openai/responses/serving.py``):
        ``input_tokens`` is the whole prompt; a stream carries the usage in its last
        event, ``response.completed``, inside ``response``; a background request is
        answered at once, ``queued`` with no usage (the engine works on)."""
        body, streamed = await self._generate(request)
        usage = {
            "input_tokens": PROMPT,
            "input_tokens_details": {"cached_tokens": CACHED},
            "output_tokens": COMPLETION,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": PROMPT + COMPLETION,
        }
        background = TypeAdapter(bool).validate_python(body.get("background") or False)

        def response(status: str, usage: Any) -> dict[str, Any]:
            return {
                "id": "resp_1",
                "created_at": 1,
                "model": body.get("model") or self.name,
                "object": "response",
                "output": [],
                "background": background,
                "status": status,
                "usage": usage,
                "user": None,
            }

        if background and not streamed:
            return self.answer(dumps(response("queued", None)))
        if not streamed:
            return self.answer(dumps(response("completed", usage)))
        return await self._events(
            request,
            [
                (
                    "response.created",
                    {
                        "type": "response.created",
                        "sequence_number": 0,
                        "response": response("in_progress", None),
                    },
                ),
                (
                    "response.output_text.delta",
                    {"type": "response.output_text.delta", "sequence_number": 1, "delta": "hi"},
                ),
                (
                    "response.completed",
                    {
                        "type": "response.completed",
                        "sequence_number": 2,
                        "response": response("completed", usage),
                    },
                ),
            ],
        )

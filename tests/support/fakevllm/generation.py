"""Generation: chat and completions, the Anthropic Messages API, the Responses API and
structured decisions, whole or streamed, as vLLM serves them."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from pydantic import TypeAdapter

from tests.support.fakevllm.base import FakeState, dumps, error

# /v1/messages and /v1/responses: a prompt of 12 tokens, 8 of them served by the prefix
# cache, and 3 generated.
PROMPT, CACHED, COMPLETION = 12, 8, 3
# /v1/chat/completions and /v1/completions: a prompt of 5 tokens, 3 generated per choice.
CHAT_PROMPT, CHAT_COMPLETION = 5, 3
LAX_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


def beam_search_work(prompt: int, beams: int, steps: int) -> tuple[int, int]:
    """The engine's (prompt, generated) tokens of vLLM's beam search
    (``generate/beam_search/online.py``): each step runs one engine request per live beam
    (one at the first step), each re-reading the prompt and the tokens so far and
    generating one token."""
    live = [1] + [beams] * (steps - 1)
    return sum(n * (prompt + t) for t, n in enumerate(live)), sum(live)


def _running_usage(generated: int) -> dict[str, int]:
    """A streamed chat's usage with continuous usage stats, ``generated`` tokens in."""
    total = CHAT_PROMPT + generated
    return {"prompt_tokens": CHAT_PROMPT, "completion_tokens": generated, "total_tokens": total}


class GenerationAPI(FakeState):
    """The generating endpoints; the engine's counters grow as vLLM's do."""

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        """SSE when stream is true: a few chunks, spaced by ``delay`` seconds. ``n``
        choices each read the prompt (the engine's counter grows n times, the usage reports
        it once); ``use_beam_search`` runs vLLM's beam search (never streamed: 400); a
        client ``request_id`` is echoed in every chunk's ``id``."""
        body = await request.json()
        self.last_body = await request.read()
        self.seen_headers.append(CIMultiDict(request.headers))
        lax = LAX_BOOL  # vLLM's request models read booleans in lax mode
        streamed = lax.validate_python(body.get("stream") or False)
        n = int(body.get("n") or 1)
        prefix = "cmpl" if request.path.endswith("/v1/completions") else "chatcmpl"
        answer_id = f"{prefix}-{body['request_id']}" if body.get("request_id") else "chat-1"
        if lax.validate_python(body.get("use_beam_search") or False):
            if streamed:
                message = "Streaming is not currently supported with beam search"
                return error(400, message, "BadRequestError")
            steps = int(body.get("max_tokens") or 16)
            prompt, generated = beam_search_work(CHAT_PROMPT, n, steps)
            self.prompt_tokens_total += prompt
            self.generation_tokens_total += generated
            usage = {"prompt_tokens": CHAT_PROMPT, "completion_tokens": n * steps}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return self.answer(dumps({"id": answer_id, "choices": [], "usage": usage}))
        self.prompt_tokens_total += CHAT_PROMPT * n
        self.generation_tokens_total += CHAT_COMPLETION * n
        details = self._chat_details(request.path.endswith("/batch"))
        usage = {
            "prompt_tokens": CHAT_PROMPT,
            "completion_tokens": CHAT_COMPLETION * n,
            "total_tokens": CHAT_PROMPT + CHAT_COMPLETION * n,
            **self.prompt_details(details),
            "completion_tokens_details": None,  # no reasoning parser
        }
        if not streamed:
            await asyncio.sleep(self.answer_delay)
            return self.answer(dumps({"id": answer_id, "choices": [], "usage": usage}))
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        options = body.get("stream_options") or {}
        # vLLM's should_include_usage: continuous usage stats only along with include_usage
        continuous = lax.validate_python(options.get("include_usage") or False) and (
            lax.validate_python(options.get("continuous_usage_stats") or False)
        )
        if continuous:
            await reply.write(b"data: " + dumps(self._role_chunk(answer_id, details)) + b"\n\n")
        for i in range(self.chunks):
            chunk: dict[str, Any] = {
                "id": answer_id,
                "choices": [{"index": 0, "delta": {"content": f"t{i}"}}],
            }
            if continuous:  # the content chunks' usage has no prompt_tokens_details
                chunk["usage"] = _running_usage(i + 1)
            await reply.write(b"data: " + dumps(chunk) + b"\n\n")
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay)
        if lax.validate_python(options.get("include_usage") or False):
            chunk = {"id": answer_id, "choices": [], "usage": usage}
            await reply.write(b"data: " + dumps(chunk) + b"\n\n")
        await reply.write(b"data: [DONE]\n\n")
        await reply.write_eof()
        return reply

    def _chat_details(self, batch: bool) -> dict[str, Any] | None:
        """``prompt_tokens_details`` with --enable-prompt-tokens-details: the cached
        prompt tokens. ``/v1/chat/completions/batch`` reports them from 0.34.0 on (summed
        over its conversations: here the fake's one prompt); before, never."""
        if not self.prompt_tokens_details or (batch and self.series < (0, 34)):
            return None
        return {
            "cached_tokens": self.cached_tokens,
            "created_cache_tokens": None,
            "multimodal_tokens": None,
        }

    def _role_chunk(self, answer_id: str, details: dict[str, Any] | None) -> dict[str, Any]:
        """A stream's first chunk (the role) with continuous usage stats: no tokens
        generated yet; from 0.34.0 on it carries the prompt's cached split, as the last
        usage does (before, its ``prompt_tokens_details`` was null)."""
        delta = {"role": "assistant", "content": ""}
        usage = _running_usage(0)
        if self.series >= (0, 34):
            usage |= self.prompt_details(details)
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        return {"id": answer_id, "choices": choices, "usage": usage}

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

    async def handle_openai_decisions(self, request: web.Request) -> web.Response:
        """vLLM 0.33.0+'s ``/v1/decisions`` (``openai/decisions``): the same reads as
        ``/v1/systemone``, never streamed, the usage in the Responses shape with
        ``cache_write_tokens`` (both details inside ``input_tokens``); ``joint`` (a
        StrictBool) on a model that is not DiffusionGemma is its 400 before any engine
        work. A 404 before 0.33 (no such route)."""
        major, minor = (int(x) for x in self.version.split(".")[:2])
        if (major, minor) < (0, 33):
            raise web.HTTPNotFound()
        first = await request.json()
        if first.get("joint") is True:
            self.seen_headers.append(CIMultiDict(request.headers))
            message = (
                "joint: this model reads each question on its own; joint reads need DiffusionGemma"
            )
            return error(400, message, "BadRequestError")
        body, _ = await self._generate(request)
        details = {"cached_tokens": CACHED, "cache_write_tokens": PROMPT - CACHED}
        usage = {
            "input_tokens": PROMPT,
            "input_tokens_details": details,
            "output_tokens": COMPLETION,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": PROMPT + COMPLETION,
        }
        name = body.get("model") or self.name
        answer = {"type": "predicate", "name": None, "probability": 0.5}
        return self.answer(dumps({"model": name, "answers": [answer], "usage": usage}))

    async def handle_responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API as vLLM serves it (``openai/responses/serving.py``):
        ``input_tokens`` is the whole prompt; a stream carries the usage in its last
        event, ``response.completed``, inside ``response``; a background request is
        answered at once, ``queued`` with no usage (the engine works on). With the store
        on (``VLLM_ENABLE_RESPONSES_API_STORE=1``) a response is kept under its
        ``request_id`` (the client's, or ``resp_`` and a random uuid), overwriting any
        response of that id; ``previous_response_id`` naming no stored response is 404
        before any engine work. With ``prefix_cache`` the cached tokens are those of a
        prompt seen before with the same ``cache_salt``."""
        first = await request.json()
        previous = first.get("previous_response_id")
        if previous is not None and previous not in self.stored_responses:
            return response_not_found(previous)
        body, streamed = await self._generate(request)
        cached = CACHED
        if self.prefix_cache:
            key = (body.get("cache_salt"), json.dumps(body.get("input")))
            cached = CACHED if key in self.cached_prompts else 0
            self.cached_prompts.add(key)
        usage = {
            "input_tokens": PROMPT,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": COMPLETION,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": PROMPT + COMPLETION,
        }
        background = LAX_BOOL.validate_python(body.get("background") or False)
        response_id = body.get("request_id") or f"resp_{uuid.uuid4().hex}"

        def response(status: str, usage: Any) -> dict[str, Any]:
            return {
                "id": response_id,
                "created_at": 1,
                "model": body.get("model") or self.name,
                "object": "response",
                "output": [],
                "background": background,
                "status": status,
                "usage": usage,
                "user": body.get("user"),
                "metadata": body.get("metadata"),
                "previous_response_id": previous,
            }

        if self.store_responses and LAX_BOOL.validate_python(body.get("store", True)):
            self.stored_responses[response_id] = response("completed", usage)
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

    async def handle_stored_response(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/responses/{id}``: the stored response, or vLLM's 404."""
        response_id = request.match_info["response_id"]
        stored = self.stored_responses.get(response_id)
        if stored is None:
            return response_not_found(response_id)
        return self.answer(dumps(stored))

    async def handle_cancel_response(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses/{id}/cancel``: vLLM cancels only queued or running
        (background) responses; a finished one is 400, an unknown one 404."""
        response_id = request.match_info["response_id"]
        if response_id not in self.stored_responses:
            return response_not_found(response_id)
        return error(
            400, "Cannot cancel a synchronous response.", "invalid_request_error", "response_id"
        )


def response_not_found(response_id: str) -> web.Response:
    """vLLM's ``_make_not_found_error``."""
    message = f"Response with id '{response_id}' not found."
    return error(404, message, "invalid_request_error", "response_id")

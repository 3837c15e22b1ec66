"""The engine at its worst (``FakeState.to_cap``): every engine request generates to the
cap vLLM 0.32.0 gives it (as with ``ignore_eos``), for the routes whose price depends on
how vLLM reads the body. Read from vLLM 0.32.0's source, independently of the proxy:

- the cap: chat (and its batch) ``max_completion_tokens``, else ``max_tokens``
  (``chat_completion/serving.py``); completions ``max_tokens``, 16 when absent
  (``CompletionRequest``); Responses ``max_output_tokens``; Messages ``max_tokens``
  (required); generate ``sampling_params.max_tokens``. A field the route's model does not
  have is ignored. ``get_max_tokens`` clamps the cap to what the context leaves after the
  prompt; a cap above the context is a 400 (``TokenizeParams``), as is a prompt longer
  than the context.
- one engine request per conversation of ``/v1/chat/completions/batch``, per prompt of a
  completion's list, per ``/v2/embed`` text, image or input, per conversation of an
  embeddings ``messages`` list (or per ``input`` where vLLM's union reads that:
  ``pooled_conversations``), per ``/generative_scoring`` item (the query and the item
  cut to the context less one, one token generated). ``/v1/embeddings`` keeps
  ``truncate_prompt_tokens`` of each prompt; ``/v2/embed`` (Cohere's model) has no such
  field, nor ``input``, and OpenAI's model no ``texts``, ``images`` or ``inputs``.
- a prompt's tokens: its text with the real tokenizer (roles and contents in order),
  ``media_tokens`` per media part (the processor's placeholders), token ids by length.
- chat, Responses and Messages prefill ``kv_transfer_params.prompt_token_ids`` instead of
  the rendered messages when given (decode-side reuse, ``_reused_prompt_token_ids``: on
  any server; not with ``echo`` or media).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from tests.support.fakevllm.base import FakeState, dumps, error

MEDIA_PARTS = {"image_url", "input_image", "image", "audio_url", "input_audio", "video_url"}


class EngineError(Exception):
    """What vLLM answers 400 before any engine work."""


@dataclass(frozen=True)
class Work:
    """One engine request: its prompt, the tokens it generates, its outputs."""

    prompt: int
    generated: int
    outputs: int = 1


class EngineAPI(FakeState):
    """The generating and pooling routes at their worst, answered in each route's shape."""

    async def handle_engine(self, request: web.Request) -> web.Response:
        """Reads the body as vLLM 0.32.0 does, grows the counters by its engine work and
        answers the route's usage (the prompt once per engine request, every output)."""
        body = json.loads(await request.read())
        self.last_body = await request.read()
        self.seen_headers.append(CIMultiDict(request.headers))
        try:
            work = self.engine_work(request.path, body)
        except EngineError as refused:
            return error(400, str(refused), "BadRequestError")
        prompt = sum(w.prompt for w in work)
        generated = sum(w.generated * w.outputs for w in work)
        self.prompt_tokens_total += sum(w.prompt * w.outputs for w in work)
        self.generation_tokens_total += generated
        return self.answer(dumps(usage_answer(request.path, prompt, generated)))

    def engine_work(self, path: str, body: dict[str, Any]) -> list[Work]:
        """The engine requests ``body`` makes on ``path``."""
        context = self.max_model_len
        if path == "/v2/embed":
            texts = [self.count(t) for t in body.get("texts") or []]
            others = len(body.get("images") or []) + len(body.get("inputs") or [])
            return [Work(min(n, context), 0) for n in texts] + [Work(self.media_tokens, 0)] * others
        if path == "/v1/embeddings":
            keep = _kept(body, context)
            talks = pooled_conversations(body)
            if talks is None:
                return [Work(min(self.count(i), keep), 0) for i in pooled_inputs(body)]
            return [Work(min(self.prompt_of(t), keep), 0) for t in talks]
        if path == "/generative_scoring":
            query = self.count(body["query"])
            cut = [min(query + self.count(i, special=False), context - 1) for i in body["items"]]
            return [Work(p, 1) for p in cut]
        prompts, cap, outputs = self.read_generation(path, body)
        if cap is not None and cap > context:
            raise EngineError(f"max_tokens={cap} cannot be greater than max_model_len={context}.")
        return [
            Work(p, context - p if cap is None else min(cap, context - p), outputs) for p in prompts
        ]

    def read_generation(self, path: str, body: dict[str, Any]) -> tuple[list[int], int | None, int]:
        """(each engine request's prompt, the cap, outputs per prompt) of a generating route."""
        prompts, cap, outputs = read_generation(path, body)
        if path in ("/v1/completions", "/inference/v1/generate"):
            return [self.count(p) for p in prompts], cap, outputs
        reused = _reused_ids(path, body)
        if reused is not None:
            if len(reused) > self.max_model_len:
                raise EngineError(f"Input length ({len(reused)}) exceeds the context.")
            return [len(reused)], cap, outputs
        return [self.prompt_of(p) for p in prompts], cap, outputs

    def prompt_of(self, conversation: Any) -> int:
        """A rendered conversation's tokens: its texts, and ``media_tokens`` per media part;
        longer than the context is vLLM's 400."""
        texts: list[str] = []
        parts = 0
        for message in conversation if isinstance(conversation, list) else [conversation]:
            content = message.get("content", "") if isinstance(message, dict) else message
            texts.append(str(message.get("role", "")) if isinstance(message, dict) else "")
            for part in content if isinstance(content, list) else [content]:
                if isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                    parts += 1
                elif isinstance(part, dict):
                    texts.append(str(part.get("text", "")))
                else:
                    texts.append(str(part))
        tokens = self.count(" ".join(texts)) + parts * self.media_tokens
        if tokens > self.max_model_len:
            raise EngineError(
                f"Input length ({tokens}) exceeds model's maximum context length "
                f"({self.max_model_len})."
            )
        return tokens

    def count(self, prompt: Any, special: bool = True) -> int:
        """A text with the real tokenizer, token ids by length."""
        if _ids(prompt):
            return len(prompt)
        return len(self.tokenizer(str(prompt), add_special_tokens=special)["input_ids"])


def pooled_conversations(body: dict[str, Any], batch: bool = True) -> list[Any] | None:
    """The conversations a pooling body renders as vLLM 0.29.0 and 0.32.0's request union
    (``EmbeddingRequest``, ``ClassificationRequest``, ``PoolingRequest``: pydantic's smart
    mode, extra fields allowed) reads it, checked against both: the chat variant when
    ``messages`` is a non-empty list of messages (each an object with a role), or, for
    embeddings (``batch``), a non-empty list of such lists; else None, and the completion
    variant reads ``input`` (whatever ``messages`` holds: ``[]``, a string, messages
    without a role)."""
    messages = body.get("messages")
    if _conversation(messages):
        return [messages]
    if batch and isinstance(messages, list) and messages and all(map(_conversation, messages)):
        return list(messages)
    return None


def pooled_inputs(body: dict[str, Any]) -> list[Any]:
    """A pooling body's ``input`` as the completion variant reads it: each one prompt."""
    given = body.get("input")
    return given if isinstance(given, list) and not _ids(given) else [given]


def _kept(body: dict[str, Any], context: int) -> int:
    """The tokens an OpenAI pooling request keeps of each prompt: ``truncate_prompt_tokens``
    as vLLM 0.32.0's ``TokenizeParams`` reads it (k keeps the last k, above the context a
    400; -1 or absent, the context). Cohere's /v2/embed has no such field."""
    keep = body.get("truncate_prompt_tokens")
    if not isinstance(keep, int) or keep < 0:
        return context
    if keep > context:
        raise EngineError(f"truncate_prompt_tokens={keep} cannot be greater than {context}.")
    return keep


def _conversation(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    )


def read_generation(path: str, body: dict[str, Any]) -> tuple[list[Any], int | None, int]:
    """(each engine request's prompt: a conversation, a text or token ids; the cap; outputs
    per prompt) of a generating route, as vLLM 0.32.0 reads them."""
    if path in ("/v1/chat/completions", "/v1/chat/completions/batch"):
        cap = body.get("max_completion_tokens")
        cap = cap if cap is not None else body.get("max_tokens")
        talks = body["messages"] if path.endswith("/batch") else [body["messages"]]
        return list(talks), cap, int(body.get("n") or 1)
    if path == "/v1/completions":
        prompt = body["prompt"]
        batch = prompt if isinstance(prompt, list) and not _ids(prompt) else [prompt]
        return list(batch), body.get("max_tokens", 16), int(body.get("n") or 1)
    if path == "/v1/responses":
        items = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return [items], body.get("max_output_tokens"), 1
    if path == "/v1/messages":
        if body.get("max_tokens") is None:
            raise EngineError("max_tokens: Field required")
        return [[{"content": body.get("system") or ""}, *body["messages"]]], body["max_tokens"], 1
    params = body.get("sampling_params") or {}
    return [body["token_ids"]], params.get("max_tokens"), int(params.get("n") or 1)


def _reused_ids(path: str, body: dict[str, Any]) -> list[int] | None:
    """The prompt token ids a single conversation is prefilled from instead of its
    messages (vLLM 0.32.0's ``_reused_prompt_token_ids``), or None."""
    if path not in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        return None
    params = body.get("kv_transfer_params")
    ids = params.get("prompt_token_ids") if isinstance(params, dict) else None
    if ids is None or body.get("echo") or MEDIA_PARTS & set(_part_types(body)):
        return None
    if not _ids(ids) or any(i < 0 for i in ids):
        raise EngineError("`kv_transfer_params['prompt_token_ids']` must be a non-empty list")
    return list(ids)


def _part_types(body: dict[str, Any]) -> list[Any]:
    talk = body.get("messages") or body.get("input")
    contents = [m.get("content") for m in talk if isinstance(m, dict)] if _listed(talk) else []
    return [p.get("type") for c in contents if _listed(c) for p in c if isinstance(p, dict)]


def _listed(value: Any) -> bool:
    return isinstance(value, list)


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) for v in value)


def usage_answer(path: str, prompt: int, generated: int) -> dict[str, Any]:
    """The route's answer, with its usage where vLLM puts it."""
    if path in ("/v1/responses", "/v1/messages"):
        usage = {"input_tokens": prompt, "output_tokens": generated}
        if path == "/v1/responses":
            usage["total_tokens"] = prompt + generated
            return {"id": "resp_1", "object": "response", "status": "completed", "usage": usage}
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "usage": usage,
        }
    if path == "/v2/embed":
        return {
            "id": "embed-1",
            "embeddings": {},
            "meta": {"billed_units": {"input_tokens": prompt}},
        }
    total = prompt + generated
    usage = {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": total}
    return {"id": "cmpl-1", "object": "list", "choices": [], "data": [], "usage": usage}

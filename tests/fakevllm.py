"""A fake vLLM OpenAI-compatible server for integration and fault tests.

It reproduces the documented responses of vLLM 0.29.0 (inflated bi-encoder usage) and
0.32.0 (engine-level usage) with the real tokenizer, following vLLM's own renderer steps
(written independently of ``proxy.accounting.counts``), including each version's error bodies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from aiohttp import web
from multidict import CIMultiDict
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
# vLLM's score request union, in the order it tries the field pairs.
SCORE_FIELD_PAIRS = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


def dumps(obj: Any) -> bytes:
    """Starlette's JSONResponse rendering, which vLLM uses."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(body=dumps(body), status=status, content_type="application/json")


class _Common(BaseModel):
    """vLLM's ScoringRequestMixin fields (protocol.py), validated like vLLM does."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    truncation_side: Literal["left", "right"] | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0


Input = str | dict[str, Any]


class _Rerank(_Common):
    query: Input
    documents: Input | list[Input]
    top_n: int = Field(default=0, ge=0)


def _validate(body: Any, rerank: bool) -> None:
    """Raise FakeError (400) where vLLM's pydantic request models would."""
    try:
        if rerank:
            _Rerank.model_validate(body)
            return
        if not isinstance(body, dict):
            raise FakeError("Input should be a valid dictionary")
        for a, b in SCORE_FIELD_PAIRS:
            if a in body and b in body:
                fields = {k: v for k, v in body.items() if k not in (a, b)}
                _Common.model_validate(fields)
                TypeAdapter(Input | list[Input]).validate_python(body[a])
                TypeAdapter(Input | list[Input]).validate_python(body[b])
                return
        raise FakeError("Field required")
    except ValidationError as exc:
        raise FakeError(str(exc).splitlines()[0]) from exc


class FakeError(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# /v1/messages and /v1/responses: a prompt of 12 tokens, 8 of them served by the prefix
# cache, and 3 generated.
PROMPT, CACHED, COMPLETION = 12, 8, 3


@dataclass
class FakeVLLM:
    """Knobs: version, family, delays and faults are plain attributes tests may change."""

    tokenizer: Any
    root: Path
    version: str = "0.29.0"
    family: str = "bi-encoder"
    name: str = "minilm"
    max_model_len: int = 256
    delay: float = 0.0
    ok_error: bool = False
    gate: asyncio.Event | None = None
    raw_bodies: list[bytes] = field(default_factory=list)
    last_body: bytes = b""
    prompt_tokens_total: int = 0
    # --served-model-name a b: every name serves the one model, the first is the default.
    aliases: tuple[str, ...] = ()
    # Fault injection: rewrite each answer of a metered endpoint (body, headers) -> (same).
    tamper: Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]]] | None = None
    seen_headers: list[CIMultiDict[str]] = field(default_factory=list)
    chunks: int = 3  # content events of a streamed chat
    chunked_answers: bool = False  # JSON answers framed chunked, without Content-Length
    generation_tokens_total: int = 0
    started_at: float = field(default_factory=time.time)  # process_start_time_seconds

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def known_model(self, body: Any) -> bool:
        """Omitted, null or "" mean the default model (vLLM answers 200 to all three)."""
        model = body.get("model") if isinstance(body, dict) else None
        return not model or model in self.names

    def answer(self, body: bytes, content_type: str = "application/json") -> web.Response:
        headers = {"Content-Type": content_type}
        if self.tamper is not None:
            body, headers = self.tamper(body, headers)
        response = web.Response(body=body, headers=headers)
        if self.chunked_answers:
            response.enable_chunked_encoding()
        return response

    @property
    def fixed(self) -> bool:
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return (major, minor) >= (0, 30)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_get("/version", self.handle_version)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        posted = {path: self.handle_scoring for path in (*SCORE_PATHS, *RERANK_PATHS)}
        posted["/invocations"] = self.handle_invocations
        posted["/v1/embeddings"] = self.handle_embeddings
        posted["/v1/chat/completions"] = self.handle_chat
        posted["/v1/chat/completions/batch"] = self.handle_chat  # usage as for one chat
        posted["/v1/messages"] = self.handle_messages
        posted["/v1/responses"] = self.handle_responses
        posted["/v1/systemone"] = self.handle_decisions
        for path, handler in posted.items():
            app.router.add_post(path, handler)
        app.router.add_route("*", "/echo/{tail:.*}", self.handle_echo)
        app.router.add_get("/fake/prompt_tokens_total", self.handle_counter)
        app.router.add_get("/metrics", self.handle_metrics)

        async def decoded(request: web.Request) -> web.StreamResponse:
            """vLLM's server routes the percent-decoded path, ``%2F`` included (checked
            against uvicorn 0.54 and Starlette 1.10): ``POST /v1%2Frerank`` is a rerank."""
            handler = posted.get(request.path) if request.method == "POST" else None
            if handler is None:
                raise web.HTTPNotFound()
            return await handler(request)

        app.router.add_route("*", "/{tail:.*}", decoded)
        return app

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def handle_counter(self, request: web.Request) -> web.Response:
        """Engine-level tokens processed so far (what vllm:prompt_tokens_total tracks)."""
        return web.json_response({"prompt_tokens_total": self.prompt_tokens_total})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        """vLLM's counters as its Prometheus endpoint shows them (one model label)."""
        label = f'{{engine="0",model_name="{self.name}"}}'
        text = (
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{label} {float(self.prompt_tokens_total)}\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{label} {float(self.generation_tokens_total)}\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {self.started_at}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def handle_models(self, request: web.Request) -> web.Response:
        entries = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": str(self.root),
                "parent": None,
                "max_model_len": self.max_model_len,
            }
            for name in self.names
        ]
        return web.json_response({"object": "list", "data": entries})

    async def handle_invocations(self, request: web.Request) -> web.StreamResponse:
        """SageMaker dispatch for an embedding model: embeddings, then rerank, then score."""
        body = json.loads(await request.read())
        if isinstance(body, dict) and ("input" in body or "messages" in body):
            return await self.handle_embeddings(request)
        return await self.handle_scoring(request)

    async def handle_embeddings(self, request: web.Request) -> web.Response:
        """One engine request per input: usage was always engine-level."""
        body = json.loads(await request.read())
        self.seen_headers.append(CIMultiDict(request.headers))
        if not self.known_model(body):
            return error(404, f"The model `{body['model']}` does not exist.", "NotFoundError")
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        lengths = [len(self.tokenizer(text)["input_ids"]) for text in inputs]
        self.prompt_tokens_total += sum(lengths)
        answer = {
            "id": f"embd-{uuid.uuid4().hex[:16]}",
            "object": "list",
            "created": int(time.time()),
            "model": body.get("model") or self.name,
            "data": [
                {"index": i, "object": "embedding", "embedding": [0.0, 1.0]}
                for i in range(len(inputs))
            ],
            "usage": {
                "prompt_tokens": sum(lengths),
                "total_tokens": sum(lengths),
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }
        return self.answer(dumps(answer))

    async def handle_echo(self, request: web.Request) -> web.Response:
        """Echo method, path, query, headers and body, to check transparent forwarding."""
        body = await request.read()
        echo = {
            "method": request.method,
            "path_qs": request.rel_url.raw_path_qs,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body_len": len(body),
        }
        reply = self.answer(json.dumps(echo).encode())
        reply.headers["X-Upstream"] = "fake"
        return reply

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

    async def handle_scoring(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.raw_bodies.append(raw)
        self.seen_headers.append(CIMultiDict(request.headers))
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "JSON decode error", "BadRequestError")
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.ok_error:  # releases up to 0.17: "does not support Score API" with HTTP 200
            message = {
                "object": "error",
                "message": "The model does not support Score API",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            return web.Response(body=dumps(message), content_type="application/json")
        if not self.known_model(body):
            return error(
                404, f"The model `{body['model']}` does not exist.", "NotFoundError", "model"
            )
        rerank = request.path in RERANK_PATHS or (
            request.path == "/invocations" and isinstance(body, dict) and "query" in body
        )
        try:
            _validate(body, rerank)
            queries, docs = self._inputs(body, rerank)
            per_input, reported = self._usage(body, queries, docs)
        except FakeError as exc:
            return error(400, str(exc), "BadRequestError", exc.param)
        self.prompt_tokens_total += per_input
        pairs = zip(self._expand(queries, docs), docs, strict=True)
        scores = [self._score(q, d) for q, d in pairs]
        if rerank:
            answer = self._rerank_body(body, docs, scores, reported)
        else:
            answer = self._score_body(scores, reported)
        self.last_body = dumps(answer)
        return self.answer(self.last_body)

    # --- request handling, the way vLLM's scoring IO processors do it ---------------

    def _inputs(self, body: dict[str, Any], rerank: bool) -> tuple[list[str], list[str]]:
        if rerank:
            first, second = body.get("query"), body.get("documents")
        else:
            for a, b in SCORE_FIELD_PAIRS:
                if a in body and b in body:
                    first, second = body[a], body[b]
                    break
            else:
                raise FakeError("Field required")
        queries = first if isinstance(first, list) else [first]
        docs = second if isinstance(second, list) else [second]
        if not all(isinstance(x, str) for x in (*queries, *docs)):
            raise FakeError("MultiModalParam is not supported for BertModel")
        if not queries or not docs:
            raise FakeError("At least one text element must be given")
        if len(queries) > 1 and len(queries) != len(docs):
            raise FakeError("Input lengths must be either 1:1, 1:N or N:N")
        return queries, docs

    @staticmethod
    def _expand(queries: list[str], docs: list[str]) -> list[str]:
        return queries * len(docs) if len(queries) == 1 else queries

    def _tokens(self, body: dict[str, Any], text: str, pair: str | None = None) -> list[int]:
        """Tokenize like TokenizeParams.get_encode_kwargs + apply_post_tokenization."""
        keep = body.get("truncate_prompt_tokens")
        side = body.get("truncation_side")
        mml = self.max_model_len
        if keep is not None and keep > mml:
            raise FakeError(
                "truncate_prompt_tokens cannot be greater than max_model_len",
                "truncate_prompt_tokens",
            )
        if keep is not None and keep < 0:
            keep = mml
        if keep is not None and side is not None:
            kwargs: dict[str, Any] = {"truncation": False}
        else:
            max_length = keep if keep is not None else mml + 1
            kwargs = {"truncation": max_length is not None, "max_length": max_length}
        if keep == 0:
            ids: list[int] = []
        elif pair is None:
            ids = self.tokenizer(text, add_special_tokens=True, **kwargs)["input_ids"]
        else:
            ids = self.tokenizer(text=text, text_pair=pair, add_special_tokens=True, **kwargs)[
                "input_ids"
            ]
        if keep is not None and keep < len(ids):
            ids = ids[-keep:] if (side or self.tokenizer.truncation_side) == "left" else ids[:keep]
        if body.get("padding") == "max_length" and len(ids) < mml:
            ids = ids + [self.tokenizer.pad_token_id] * (mml - len(ids))
        if len(ids) > mml:
            raise FakeError(
                f"This model's maximum context length is {mml} tokens. However, your "
                f"request has {len(ids)} input tokens.",
                "input_tokens",
            )
        return list(ids)

    def _usage(self, body: dict[str, Any], queries: list[str], docs: list[str]) -> tuple[int, int]:
        """(engine-level tokens, reported prompt_tokens) for this version and family."""
        if self.family == "cross-encoder":
            pairs = [
                len(self._tokens(body, q, d))
                for q, d in zip(self._expand(queries, docs), docs, strict=True)
            ]
            return sum(pairs), sum(pairs)
        q_ids = [self._tokens(body, q) for q in queries]
        d_ids = [self._tokens(body, d) for d in docs]
        engine = sum(map(len, q_ids)) + sum(map(len, d_ids))
        if self.fixed:
            return engine, engine
        pad = [self.tokenizer.pad_token_id] if self.tokenizer.pad_token_id is not None else []
        q_pairs = q_ids * len(docs) if len(q_ids) == 1 else q_ids
        inflated = sum(len(q + pad + d) for q, d in zip(q_pairs, d_ids, strict=True))
        return engine, inflated

    @staticmethod
    def _score(query: str, doc: str) -> float:
        digest = hashlib.sha256(f"{query}\x00{doc}".encode()).digest()
        return int.from_bytes(digest[:7], "big") / float(1 << 56)

    def _score_body(self, scores: list[float], reported: int) -> dict[str, Any]:
        return {
            "id": f"score-{uuid.uuid4().hex[:16]}",
            "object": "list",
            "created": int(time.time()),
            "model": self.name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {
                "prompt_tokens": reported,
                "total_tokens": reported,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }

    def _rerank_body(
        self, body: dict[str, Any], docs: list[str], scores: list[float], reported: int
    ) -> dict[str, Any]:
        order = sorted(range(len(docs)), key=lambda i: scores[i], reverse=True)
        top_n = body.get("top_n") or len(docs)
        results = [
            {
                "index": i,
                "document": {"text": docs[i], "multi_modal": None},
                "relevance_score": scores[i],
            }
            for i in order[:top_n]
        ]
        return {
            "id": f"score-{uuid.uuid4().hex[:16]}",
            "model": body.get("model") or self.name,
            "usage": {"prompt_tokens": reported, "total_tokens": reported},
            "results": results,
        }


def main() -> None:
    """Run the fake as a process: ``python -m tests.fakevllm --port P --root DIR``."""
    import argparse

    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--version", default="0.29.0")
    args = parser.parse_args()
    fake = FakeVLLM(AutoTokenizer.from_pretrained(str(args.root)), args.root, version=args.version)
    web.run_app(fake.app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()

"""A fake vLLM OpenAI-compatible server for integration and fault tests.

It reproduces the documented responses of vLLM 0.29.0 (inflated bi-encoder usage) and
0.32.0 (engine-level usage) with the real tokenizer, following vLLM's own renderer steps
(written independently of ``proxy.accounting.counts``), including each version's error
bodies. Each API family lives in its own module; this one assembles the routes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from tests.support.fakevllm.audio import AudioAPI, RealtimeAPI
from tests.support.fakevllm.base import VLLM_KEEP_ALIVE, FakeState, dumps, error
from tests.support.fakevllm.discovery import DiscoveryAPI
from tests.support.fakevllm.engine import EngineAPI
from tests.support.fakevllm.generation import GenerationAPI
from tests.support.fakevllm.pooling import EmbeddingsAPI
from tests.support.fakevllm.scoring import RECEIVED, RERANK_PATHS, SCORE_PATHS, ScoringAPI
from tests.support.fakevllm.tokenization import TokenizationAPI

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
__all__ = ["VLLM_KEEP_ALIVE", "FakeState", "FakeVLLM", "dumps", "error"]


# The routes that answer at the engine's worst when ``to_cap`` is set (``engine``).
AT_THE_CAP = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/chat/completions/batch",
    "/v1/messages",
    "/v1/responses",
    "/v1/embeddings",
)


class FakeVLLM(
    ScoringAPI,
    EmbeddingsAPI,
    GenerationAPI,
    EngineAPI,
    TokenizationAPI,
    AudioAPI,
    RealtimeAPI,
    DiscoveryAPI,
):
    """Knobs: version, family, delays and faults are plain attributes tests may change."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_get("/version", self.handle_version)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/openapi.json", self.handle_openapi)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/v1/realtime", self.handle_realtime)
        posted = {path: self.handle_scoring for path in (*SCORE_PATHS, *RERANK_PATHS)}
        posted["/invocations"] = self.handle_invocations
        posted["/v1/embeddings"] = self.handle_embeddings
        posted["/v1/chat/completions"] = self.handle_chat
        posted["/v1/completions"] = self.handle_chat  # as a chat, with a prompt
        posted["/v1/chat/completions/batch"] = self.handle_chat  # usage as for one chat
        posted["/v1/messages"] = self.handle_messages
        posted["/v1/responses"] = self.handle_responses
        posted["/v1/systemone"] = self.handle_decisions
        posted["/v1/decisions"] = self.handle_openai_decisions
        posted["/v1/audio/transcriptions"] = self.handle_transcriptions
        posted["/v1/audio/translations"] = self.handle_translations
        posted["/tokenize"] = self.handle_tokenize
        for path in AT_THE_CAP:
            posted[path] = self._at_the_cap(posted[path])
        for path in ("/v2/embed", "/generative_scoring", "/inference/v1/generate"):
            posted[path] = self.handle_engine
        for path, handler in posted.items():
            app.router.add_post(path, handler)
        app.router.add_get("/v1/responses/{response_id}", self.handle_stored_response)
        app.router.add_post("/v1/responses/{response_id}/cancel", self.handle_cancel_response)
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

    def _at_the_cap(self, handler: Handler) -> Handler:
        async def route(request: web.Request) -> web.StreamResponse:
            return await (self.handle_engine if self.to_cap else handler)(request)

        return route

    async def handle_invocations(self, request: web.Request) -> web.StreamResponse:
        """SageMaker dispatch for an embedding model: embeddings, then rerank, then score.
        As vLLM's ``inject_adapter_id(adapter_path="model")`` (0.11.1 and later), the body's
        ``model`` becomes the adapter header's value, None without it (the default)."""
        raw = await request.read()
        body = json.loads(raw)
        if isinstance(body, dict):
            body["model"] = request.headers.get("X-Amzn-SageMaker-Adapter-Identifier")
            request[RECEIVED] = raw
            # what the handlers read next (aiohttp keeps the body it read here)
            request._read_bytes = json.dumps(body).encode()
        if isinstance(body, dict) and ("input" in body or "messages" in body):
            return await self.handle_embeddings(request)
        return await self.handle_scoring(request)

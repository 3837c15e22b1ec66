"""What vLLM serves besides inference: its version, models, health, Prometheus counters,
and an echo route to check transparent forwarding."""

from __future__ import annotations

import hashlib
import json
import time

from aiohttp import web

from tests.support.fakevllm.base import FakeState


class DiscoveryAPI(FakeState):
    """The endpoints the proxy discovers the model and reads the engine's counters from."""

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

    async def handle_openapi(self, request: web.Request) -> web.Response:
        """The routes a pooling model's vLLM registers: those of every model, and of the
        task it runs (embeddings for an embedding model, /classify for a classifier)."""
        if not self.openapi:
            return web.json_response({"detail": "Not Found"}, status=404)
        paths = [
            "/health",
            "/version",
            "/v1/models",
            "/tokenize",
            "/detokenize",
            "/pooling",
            "/score",
            "/v1/score",
            "/rerank",
            "/v1/rerank",
            "/v2/rerank",
            "/invocations",
            "/classify" if self.family == "cross-encoder" else "/v1/embeddings",
        ]
        spec = {"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}}
        return web.json_response({**spec, "paths": {p: {"post": {}} for p in paths}})

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
        entries += [  # vLLM 0.32.0's LoRA cards (OpenAIServingModels.show_available_models)
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": f"/adapters/{name}",
                "parent": self.name,
                "max_model_len": None,
            }
            for name in self.adapters
        ]
        return web.json_response({"object": "list", "data": entries})

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

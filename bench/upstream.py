"""A fast fake vLLM for benchmarks: correct pre-fix (0.29.0) usage, fixed added latency.

Responses are computed once per distinct body with the real tokenizer (tests/support/fakevllm/)
and then served from a cache, so the upstream costs almost nothing but its latency.

    python bench/upstream.py PORT LATENCY_MS MODEL_DIR
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fakevllm import FakeVLLM, dumps

CHUNKS = 20
CHUNK_INTERVAL = 0.005


class FastFake(FakeVLLM):
    cache: dict[bytes, tuple[int, bytes]]

    def app(self) -> web.Application:
        self.cache = {}
        app = super().app()
        app.router.add_post("/v1/embeddings", self.handle_embeddings)
        return app

    async def handle_scoring(self, request: web.Request) -> web.Response:
        body = await request.read()
        key = hashlib.sha256(request.path.encode() + body).digest()
        if key not in self.cache:
            delay, self.delay = self.delay, 0.0
            response = await super().handle_scoring(_Replay(request, body))  # type: ignore[arg-type]
            self.delay = delay
            assert isinstance(response.body, bytes)
            self.cache[key] = (response.status, response.body)
        await asyncio.sleep(self.delay)
        status, payload = self.cache[key]
        return web.Response(body=payload, status=status, content_type="application/json")

    async def handle_embeddings(self, request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(self.delay)
        usage = {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0}
        data = [{"index": 0, "object": "embedding", "embedding": [0.1] * 384}]
        return web.Response(
            body=dumps({"object": "list", "data": data, "usage": usage}),
            content_type="application/json",
        )

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await asyncio.sleep(self.delay)
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        for i in range(CHUNKS):
            chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            await reply.write(b"data: " + dumps(chunk) + b"\n\n")
            await asyncio.sleep(CHUNK_INTERVAL)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": 5 + CHUNKS}
            await reply.write(
                b"data: " + dumps({"id": "c", "choices": [], "usage": usage}) + b"\n\n"
            )
        await reply.write(b"data: [DONE]\n\n")
        await reply.write_eof()
        return reply


class _Replay:
    """Enough of a request for FakeVLLM.handle_scoring, with the body already read."""

    def __init__(self, request: web.Request, body: bytes) -> None:
        self.path = request.path
        self.headers = request.headers
        self._body = body

    async def read(self) -> bytes:
        return self._body

    def get(self, key: object, default: bytes) -> bytes:
        """Request storage: nothing is kept on a replay."""
        return default


if __name__ == "__main__":
    from transformers import AutoTokenizer

    port, latency_ms, model = int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
    fake = FastFake(AutoTokenizer.from_pretrained(str(model)), model, delay=latency_ms / 1000)
    web.run_app(fake.app(), host="127.0.0.1", port=port, print=None, access_log=None)

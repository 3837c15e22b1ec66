"""/v1/embeddings: one engine request per input, so usage was always engine-level."""

from __future__ import annotations

import json
import time
import uuid

from aiohttp import web
from multidict import CIMultiDict

from tests.support.fakevllm.base import dumps, error
from tests.support.fakevllm.engine import EngineAPI, pooled_conversations, pooled_inputs


class EmbeddingsAPI(EngineAPI):
    """The pooling endpoint of an embedding model."""

    async def handle_embeddings(self, request: web.Request) -> web.Response:
        """One engine request per input: usage was always engine-level."""
        body = json.loads(await request.read())
        self.seen_headers.append(CIMultiDict(request.headers))
        if not self.known_model(body):
            return error(404, f"The model `{body['model']}` does not exist.", "NotFoundError")
        talks = pooled_conversations(body)
        if talks is None:
            inputs = pooled_inputs(body)
            lengths = [len(self.tokenizer(text)["input_ids"]) for text in inputs]
        else:  # as vLLM's union reads the body: a chat variant, each conversation rendered
            inputs, lengths = talks, [self.prompt_of(t) for t in talks]
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
                **self.prompt_details(),
                "completion_tokens_details": None,
            },
        }
        return self.answer(dumps(answer))

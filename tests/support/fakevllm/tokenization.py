"""``POST /tokenize`` as vLLM 0.32.0 serves it (``serve/tokenize/serving.py``): a
conversation rendered with the tokenizer's chat template (or the request's), its tools and
template kwargs, then tokenized (special tokens only when asked); a text prompt tokenized
with its special tokens. Text parts are joined by newlines (vLLM's "string" content
format, which a template that does not loop over ``content`` gets)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.support.fakevllm.base import FakeState, dumps, error

NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one."
)


class TokenizationAPI(FakeState):
    """The fake's ``/tokenize``; ``tokenize_calls`` counts what it answered."""

    tokenize_calls: int = 0

    async def handle_tokenize(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if not self.known_model(body):
            message = f"The model `{body.get('model')}` does not exist."
            return error(404, message, "NotFoundError", "model")
        if "messages" in body:
            prompt = self._rendered(body)
            if prompt is None:
                return error(400, NO_TEMPLATE, "BadRequestError")
            special = bool(body.get("add_special_tokens", False))
        else:
            prompt, special = body["prompt"], bool(body.get("add_special_tokens", True))
        ids = self.tokenizer(prompt, add_special_tokens=special)["input_ids"]
        self.tokenize_calls += 1
        answer = {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}
        body = dumps({**answer, "token_strs": None})
        return web.Response(body=body, content_type="application/json")

    def _rendered(self, body: dict[str, Any]) -> str | None:
        template = body.get("chat_template") or getattr(self.tokenizer, "chat_template", None)
        if not template:
            return None
        conversation = [_as_string(m) for m in body["messages"]]
        kwargs = dict(body.get("chat_template_kwargs") or {})
        rendered = self.tokenizer.apply_chat_template(
            conversation,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
            tools=body.get("tools"),
            **kwargs,
        )
        return str(rendered)


def _as_string(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        text = "\n".join(part.get("text", "") for part in content)
        return {**message, "content": text}
    return message

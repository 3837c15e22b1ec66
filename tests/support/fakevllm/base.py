"""The fake vLLM's state and answers: the knobs tests turn, and vLLM's JSON rendering."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

# vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default (0.29.0 and 0.32.0 envs.py), given to uvicorn
# as timeout_keep_alive: a connection idle this many seconds is closed by vLLM.
VLLM_KEEP_ALIVE = 5.0


def dumps(obj: Any) -> bytes:
    """Starlette's JSONResponse rendering, which vLLM uses."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(body=dumps(body), status=status, content_type="application/json")


@dataclass
class FakeState:
    """The fake's knobs (version, family, delays, faults: plain attributes tests may
    change) and what it saw and counted, shared by every API family."""

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
    # LoRA adapters (--lora-modules): listed as vLLM 0.32.0 lists them, without a
    # max_model_len, their parent the base model; served as the base model is.
    adapters: tuple[str, ...] = ()
    # Fault injection: rewrite each answer of a metered endpoint (body, headers) -> (same).
    tamper: Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]]] | None = None
    seen_headers: list[CIMultiDict[str]] = field(default_factory=list)
    chunks: int = 3  # content events of a streamed chat
    chunked_answers: bool = False  # JSON answers framed chunked, without Content-Length
    generation_tokens_total: int = 0
    started_at: float = field(default_factory=time.time)  # process_start_time_seconds
    # /openapi.json, as vLLM serves it unless started with --disable-fastapi-docs
    openapi: bool = True
    # VLLM_ENABLE_RESPONSES_API_STORE=1: responses kept by id (GET, cancel, continue)
    store_responses: bool = True
    stored_responses: dict[str, Any] = field(default_factory=dict)
    # Seconds a whole (not streamed) chat or completion answer waits before it is sent
    answer_delay: float = 0.0
    # Prefix caching keyed by (cache_salt, prompt): off, a fixed share of every prompt is cached
    prefix_cache: bool = False
    # --enable-prompt-tokens-details: chat usage carries prompt_tokens_details (vLLM
    # 0.32.0 _make_prompt_tokens_details) with this many cached tokens
    prompt_tokens_details: bool = False
    cached_tokens: int = 4
    cached_prompts: set[tuple[Any, str]] = field(default_factory=set)
    # The engine at its worst (``engine.EngineAPI``): generation and pooling routes read
    # as vLLM 0.32.0 reads them, each engine request generating to its cap; a media part
    # costs media_tokens
    to_cap: bool = False
    media_tokens: int = 200

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def known_model(self, body: Any) -> bool:
        """Omitted, null or "" mean the default model (vLLM answers 200 to all three)."""
        model = body.get("model") if isinstance(body, dict) else None
        return not model or model in self.names or model in self.adapters

    def answer(self, body: bytes, content_type: str = "application/json") -> web.Response:
        headers = {"Content-Type": content_type}
        if self.tamper is not None:
            body, headers = self.tamper(body, headers)
        response = web.Response(body=body, headers=headers)
        if self.chunked_answers:
            response.enable_chunked_encoding()
        return response

    @property
    def series(self) -> tuple[int, int]:
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return major, minor

    def prompt_details(self, details: dict[str, Any] | None = None) -> dict[str, Any]:
        """``usage.prompt_tokens_details`` as the release writes it: ``null`` when there is
        none, left out from 0.34.0 on (its UsageInfo excludes the member when None)."""
        if details is None and self.series >= (0, 34):
            return {}
        return {"prompt_tokens_details": details}

    @property
    def fixed(self) -> bool:
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return (major, minor) >= (0, 30)

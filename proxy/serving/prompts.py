"""A generation's prompt counted by the upstream's own ``POST /tokenize`` before it is
admitted (``proxy.limits.tokenizing`` says what is asked), within the accounting timeout.

Auditing never breaks serving: a prompt that cannot be counted so (no ``/tokenize``, an
error, a timeout, an answer that is not vLLM's) is priced by the byte bound as before,
logged (``prompt_count_failed``) and counted in ``usage_proxy_prompt_counts_total``.
Bodies are parsed and answers read in worker threads; the loop only sends and receives.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog

from proxy.accounting.dispatch import Prepared
from proxy.accounting.operations import CHAT_OPERATIONS, POOLING_OPERATIONS
from proxy.accounting.types import Release
from proxy.limits.tokenizing import counted, truncation
from proxy.limits.tokenizing import tokenize_requests as requests_for
from proxy.metrics import Metrics
from proxy.serving.upstream import LARGE_BODY_BYTES, read_answer

log = structlog.get_logger("proxy.serving.prompts")
COUNTED = "tokenize"
# An answer of /tokenize larger than this is not read (a prompt of ~8M token ids).
MOST_ANSWER_BYTES = 64 << 20
Offload = Callable[[Callable[[], Any]], Awaitable[Any]]


class CountFailed(Exception):
    """Why a prompt was not counted (the metric's ``outcome``)."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


class PromptCounter:
    """Counts generation prompts with the upstream at ``base`` (its ``/tokenize``)."""

    def __init__(self, base: str, metrics: Metrics, *, timeout: float) -> None:
        self._url = base.rstrip("/") + "/tokenize"
        self._metrics = metrics
        self._timeout = timeout

    async def count(
        self,
        session: aiohttp.ClientSession,
        prepared: Prepared,
        release: Release,
        headers: dict[str, str],
        offload: Offload,
    ) -> int | None:
        """``prepared``'s prompt tokens as vLLM renders them, or None (the byte bound):
        ``offload`` runs a callable in a worker thread; ``headers`` go with each call (the
        client's authorization, as the request itself carries it upstream)."""
        operation = prepared.operation
        if operation not in CHAT_OPERATIONS | POOLING_OPERATIONS:
            return None
        try:
            async with asyncio.timeout(self._timeout):
                bodies, cut = await offload(lambda: _asked(prepared, release))
                if bodies is None:  # a pooling request of inputs: counted by the proxy
                    return None
                if not bodies:
                    raise CountFailed("not_countable", "no prompt /tokenize can render")
                answers = await asyncio.gather(*(self._ask(session, b, headers) for b in bodies))
                total: int | None = await offload(lambda: counted(list(answers), cut))
            if total is None:
                raise CountFailed("invalid", "/tokenize answered no token count")
        except CountFailed as exc:
            self._fallback(operation, exc.outcome, str(exc))
            return None
        except TimeoutError:
            self._fallback(operation, "timeout", f"no answer in {self._timeout}s")
            return None
        except aiohttp.ClientError as exc:
            self._fallback(operation, "unreachable", type(exc).__name__)
            return None
        self._metrics.prompt_counts.labels(COUNTED).inc()
        return total

    async def _ask(self, session: aiohttp.ClientSession, body: bytes, headers: Any) -> bytes:
        sent = {**headers, "Content-Type": "application/json"}
        data: bytes | io.BytesIO = body
        if len(body) > LARGE_BODY_BYTES:  # written in chunks, as a forwarded body is
            data = io.BytesIO(body)
        async with session.post(self._url, data=data, headers=sent) as answer:
            if answer.status != 200:
                raise CountFailed("refused", f"/tokenize answered {answer.status}")
            body, whole = await read_answer(answer, MOST_ANSWER_BYTES)
            if not whole:
                raise CountFailed("invalid", "/tokenize answered too much")
            return body

    def _fallback(self, operation: str, outcome: str, detail: str) -> None:
        self._metrics.prompt_counts.labels(outcome).inc()
        if outcome != "not_countable":
            log.warning("prompt_count_failed", operation=operation, why=outcome, detail=detail)
        return None


def _asked(prepared: Prepared, release: Release) -> tuple[list[bytes] | None, Any]:
    """The /tokenize bodies for ``prepared`` and its ``truncate_prompt_tokens``; None for a
    pooling request that is no conversation (nothing to ask)."""
    try:
        payload = json.loads(prepared.body)
    except ValueError:
        return [], None
    if not isinstance(payload, dict):
        return [], None
    if prepared.operation in POOLING_OPERATIONS and "messages" not in payload:
        return None, None
    cut = truncation(prepared.operation, payload)
    return requests_for(prepared.operation, payload, release), cut

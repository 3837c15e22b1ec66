"""A generation's prompt counted by the upstream's own ``POST /tokenize`` before it is
admitted (``proxy.limits.tokenizing`` says what is asked), within the accounting timeout.

Auditing never breaks serving: a prompt that cannot be counted so (no ``/tokenize``, an
error, a timeout, an answer that is not vLLM's) is priced by the byte bound as before,
logged (``prompt_count_failed``) and counted in ``usage_proxy_prompt_counts_total``.
Bodies are parsed and answers read in worker threads; the loop only sends and receives.

Counting never crowds out forwarding on the shared upstream session: a request that would
need more than ``MOST_CALLS`` calls (a batch of many conversations, a long prompt list)
keeps the byte bound (``too_many``), and at most ``MOST_IN_FLIGHT`` calls per process are
in flight at once, whatever the number of requests being counted.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog

from proxy.accounting.dispatch import Prepared
from proxy.accounting.operations import CHAT_OPERATIONS, POOLING_OPERATIONS, Operation
from proxy.accounting.types import Release
from proxy.limits.tokenizing import counted, route_truncation
from proxy.limits.tokenizing import tokenize_requests as requests_for
from proxy.metrics import Metrics
from proxy.serving.upstream import LARGE_BODY_BYTES, read_answer

log = structlog.get_logger("proxy.serving.prompts")
COUNTED = "tokenize"
# An answer of /tokenize larger than this is not read (a prompt of ~8M token ids).
MOST_ANSWER_BYTES = 64 << 20
# A request needing more /tokenize calls than this keeps the byte bound.
MOST_CALLS = 32
# /tokenize calls in flight at once per process (of --upstream-connections).
MOST_IN_FLIGHT = 16
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
        self._in_flight = asyncio.Semaphore(MOST_IN_FLIGHT)

    async def count(
        self,
        session: aiohttp.ClientSession,
        prepared: Prepared,
        payload: Any,
        release: Release,
        headers: dict[str, str],
        offload: Offload,
    ) -> int | None:
        """``prepared``'s prompt tokens as vLLM renders them, or None (the byte bound):
        ``payload`` is its body parsed (``pricing.parsed``, by the caller, who prices it
        from the same); ``offload`` runs a callable in a worker thread; ``headers`` go with
        each call (the client's authorization, as the request itself carries it upstream)."""
        operation = prepared.operation
        if not asks(operation):
            return None
        try:
            async with asyncio.timeout(self._timeout):
                bodies, cut = await offload(lambda: _asked(operation, payload, release))
                if bodies is None:  # a pooling request of inputs: counted by the proxy
                    return None
                if not bodies:
                    raise CountFailed("not_countable", "no prompt /tokenize can render")
                if len(bodies) > MOST_CALLS:
                    raise CountFailed("too_many", f"{len(bodies)} prompts to count")
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
        async with (
            self._in_flight,
            session.post(self._url, data=data, headers=sent) as answer,
        ):
            if answer.status != 200:
                raise CountFailed("refused", f"/tokenize answered {answer.status}")
            body, whole = await read_answer(answer, MOST_ANSWER_BYTES)
            if not whole:
                raise CountFailed("invalid", "/tokenize answered too much")
            return body

    def _fallback(self, operation: Operation, outcome: str, detail: str) -> None:
        self._metrics.prompt_counts.labels(outcome).inc()
        if outcome not in ("not_countable", "too_many"):
            log.warning("prompt_count_failed", operation=operation, why=outcome, detail=detail)
        return None


def asks(operation: Operation) -> bool:
    """Whether a request of ``operation`` may have its prompt counted by /tokenize."""
    return operation in CHAT_OPERATIONS | POOLING_OPERATIONS


def tokenizes(operation: Operation, payload: Any) -> bool:
    """Whether counting ``payload`` (the body parsed) of ``operation`` goes to /tokenize:
    not for a pooling request that is no conversation (the proxy counts its inputs)."""
    if not asks(operation):
        return False
    return not (
        operation in POOLING_OPERATIONS and isinstance(payload, dict) and "messages" not in payload
    )


def _asked(operation: Operation, payload: Any, release: Release) -> tuple[list[bytes] | None, Any]:
    """The /tokenize bodies for ``payload`` and its ``truncate_prompt_tokens``; None for a
    pooling request that is no conversation (nothing to ask)."""
    if not isinstance(payload, dict):
        return [], None
    if not tokenizes(operation, payload):
        return None, None
    cut = route_truncation(operation, payload)
    return requests_for(operation, payload, release), cut

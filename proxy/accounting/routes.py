"""The route table: every path the proxy treats specially, its operation and its handling.

One table for one fact. The router, the dispatcher, the records and the attribution read
it; nothing else spells a path. Paths are the upstream's decoded paths (vLLM's router
matches after percent-decoding).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Handling(enum.StrEnum):
    """What the proxy does with a POST to a route."""

    AUDITED = "audited"  # scoring: recounted, judged, recorded
    METERED = "metered"  # reports usage: recorded as reported
    DISPATCHED = "dispatched"  # /invocations: the body decides the operation
    OPEN = "open"  # probes and metrics: no engine work, reachable without a key


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    operation: str
    handling: Handling


def _routes(handling: Handling, operation: str, *paths: str) -> tuple[Route, ...]:
    return tuple(Route(path, operation, handling) for path in paths)


A, M = Handling.AUDITED, Handling.METERED
ROUTES: tuple[Route, ...] = (
    *_routes(A, "score", "/score", "/v1/score"),
    *_routes(A, "rerank", "/rerank", "/v1/rerank", "/v2/rerank"),
    *_routes(M, "embeddings", "/v1/embeddings", "/v2/embed"),
    *_routes(M, "classify", "/classify", "/v1/classify"),
    *_routes(M, "pooling", "/pooling"),
    *_routes(M, "completions", "/v1/completions"),
    # /v1/chat/completions/batch (vLLM 0.32.0): N conversations, never streamed, one usage
    *_routes(M, "chat", "/v1/chat/completions", "/v1/chat/completions/batch"),
    # Usage as input_tokens/output_tokens: in the answer, or streamed in message_delta
    # (Anthropic Messages) or the final response.completed event (Responses)
    *_routes(M, "messages", "/v1/messages"),
    *_routes(M, "responses", "/v1/responses"),
    # Structured decisions (vLLM 0.32.0): one usage summing the engine requests it made
    *_routes(M, "decisions", "/v1/systemone"),
    *_routes(Handling.DISPATCHED, "invocations", "/invocations"),
    *_routes(
        Handling.OPEN, "probe", "/health", "/healthz", "/readyz", "/ping", "/version", "/metrics"
    ),
)
BY_PATH: dict[str, Route] = {route.path: route for route in ROUTES}

SCORING_OPERATIONS = frozenset({"score", "rerank"})
STREAMING_OPERATIONS = frozenset({"chat", "completions"})
OPEN_PATHS = frozenset(r.path for r in ROUTES if r.handling is Handling.OPEN)
INVOCATIONS_PATH = "/invocations"


def paths(*handlings: Handling) -> frozenset[str]:
    return frozenset(r.path for r in ROUTES if r.handling in handlings)


def operation_of(path: str) -> str | None:
    """The operation a direct POST to ``path`` performs (None: not a metered route)."""
    route = BY_PATH.get(path)
    if route is None or route.handling not in (Handling.AUDITED, Handling.METERED):
        return None
    return route.operation

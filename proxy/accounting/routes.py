"""The route table: every (method, path) any supported vLLM release serves, classified.

One table for one fact, and closed: a request whose normalized path is not in it is
refused, never relayed. Each route is audited (scoring: recounted and judged), metered
(the engine reports usage: recorded as reported), dispatched (``/invocations``: the body
decides), free (no engine work: relayed, no record) or refused (engine control, or work
the proxy cannot meter; an operator may relay it unmetered with ``--allow-unmetered``).
The router, the dispatcher, the records and the attribution read it; nothing else spells
a path. Held against vLLM's own routers by ``tests/e2e`` (``/openapi.json`` of each
provisioned release) and ``tests/data/vllm_routes.json`` (every release's source).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from proxy.accounting.operations import Operation


class Handling(enum.StrEnum):
    AUDITED = "audited"
    METERED = "metered"
    DISPATCHED = "dispatched"
    FREE = "free"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Route:
    path: str  # as vLLM declares it; ``{name}`` matches one segment, a final ``*`` any rest
    methods: frozenset[str]
    handling: Handling
    operation: Operation  # the record's operation for audited and metered routes
    keyless: bool = False  # probes: reachable without an API key
    why: str = ""  # for refused routes: what the refusal says


def _r(
    handling: Handling,
    methods: str,
    operation: Operation,
    *paths: str,
    keyless: bool = False,
    why: str = "",
) -> tuple[Route, ...]:
    verbs = frozenset(methods.split(","))
    return tuple(Route(p, verbs, handling, operation, keyless, why) for p in paths)


Op = Operation
A, M, F, X = Handling.AUDITED, Handling.METERED, Handling.FREE, Handling.REFUSED
CONTROL = "controls the engine (adapters, sleep, weights, caches, profiling, scaling, checkpoints)"
UNMETERABLE = "does engine work whose usage vLLM does not report in a form the proxy bills"
ROUTES: tuple[Route, ...] = (
    *_r(A, "POST", Op.SCORE, "/score", "/v1/score"),
    *_r(A, "POST", Op.RERANK, "/rerank", "/v1/rerank", "/v2/rerank"),
    *_r(M, "POST", Op.EMBEDDINGS, "/v1/embeddings", "/v2/embed"),
    *_r(M, "POST", Op.CLASSIFY, "/classify"),
    *_r(M, "POST", Op.POOLING, "/pooling"),
    *_r(M, "POST", Op.COMPLETIONS, "/v1/completions"),
    # /v1/chat/completions/batch (vLLM 0.32.0): N conversations, never streamed, one usage
    *_r(M, "POST", Op.CHAT, "/v1/chat/completions", "/v1/chat/completions/batch"),
    # Usage as input_tokens/output_tokens: in the answer, or streamed in message_delta
    # (Anthropic Messages) or the final response.completed event (Responses)
    *_r(M, "POST", Op.MESSAGES, "/v1/messages"),
    *_r(M, "POST", Op.RESPONSES, "/v1/responses"),
    # Structured decisions (vLLM 0.32.0; /v1/decisions from 0.33.0, the same reads in the
    # OpenAI Decisions shape, its usage as Responses' input/output_tokens): one usage
    # summing the engine requests it made (joint reads refused: proxy.accounting.fields)
    *_r(M, "POST", Op.DECISIONS, "/v1/systemone", "/v1/decisions"),
    # Token ids in, token ids out (scale-out): usage as a completion's
    *_r(M, "POST", Op.GENERATE, "/inference/v1/generate"),
    # Scoring with a generative model: usage as vLLM reports it (no pre-fix inflation)
    *_r(M, "POST", Op.GENERATIVE_SCORING, "/generative_scoring"),
    # Multipart forms (``proxy.accounting.audio``): a whole transcription billed in seconds
    # of audio (usage type "duration"), a streamed one in tokens; a whole translation has
    # no usage (refused unless --allow-unmetered names translations.whole)
    *_r(M, "POST", Op.TRANSCRIPTIONS, "/v1/audio/transcriptions"),
    *_r(M, "POST", Op.TRANSLATIONS, "/v1/audio/translations"),
    # A WebSocket session (``proxy.serving.realtime``): billed the tokens of the
    # transcription.done events vLLM sends in it
    *_r(M, "GET", Op.REALTIME, "/v1/realtime"),
    *_r(Handling.DISPATCHED, "POST", Op.INVOCATIONS, "/invocations"),
    *_r(F, "GET", Op.PROBE, "/health", "/healthz", "/readyz", "/load", "/version", keyless=True),
    *_r(F, "GET,POST", Op.PROBE, "/ping", keyless=True),
    *_r(F, "GET", Op.PROBE, "/metrics", keyless=True),
    *_r(F, "GET", Op.KV_EVENT_SOURCES, "/kv_event_sources"),
    *_r(F, "GET", Op.MODELS, "/v1/models"),
    *_r(F, "GET", Op.DOCS, "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"),
    *_r(F, "GET", Op.DOCS, "/static/*"),
    *_r(F, "POST", Op.TOKENIZE, "/tokenize", "/detokenize", "/v1/messages/count_tokens"),
    *_r(F, "GET", Op.TOKENIZE, "/tokenizer_info"),
    # Prompts rendered to tokens and back: no engine work (derender echoes the caller's
    # own prompt_tokens in a usage object, which is never billed)
    *_r(
        F,
        "POST",
        Op.RENDER,
        "/v1/chat/completions/render",
        "/v1/completions/render",
        "/v1/chat/completions/derender",
        "/v1/completions/derender",
        "/v1/messages/render",
        "/v1/responses/render",
        "/cohere/v2/chat/render",
    ),
    # A stored response, fetched or cancelled: billed when it was made
    *_r(F, "GET", Op.RESPONSES, "/v1/responses/{response_id}"),
    *_r(F, "POST", Op.RESPONSES, "/v1/responses/{response_id}/cancel"),
    *_r(F, "GET", Op.SERVER_INFO, "/server_info", "/is_sleeping", "/is_paused", "/weight_info"),
    # The engine's state, read only (fault tolerance moves under /v1 in 0.34.0; checkpoint
    # status is 0.34.0's): no engine work
    *_r(F, "GET", Op.SERVER_INFO, "/get_world_size", "/fault_tolerance/status"),
    *_r(F, "GET", Op.SERVER_INFO, "/v1/fault_tolerance/status", "/checkpoint/status"),
    *_r(
        X,
        "POST",
        Op.CONTROL,
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",
        "/start_profile",
        "/stop_profile",
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/collective_rpc",
        "/sleep",
        "/wake_up",
        "/release_kv_cache_memory",
        "/pause",
        "/resume",
        "/abort_requests",
        "/inference/v1/abort_requests",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/start_draft_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/update_weight_version",
        "/shutdown_weight_transfer_engine",
        "/weight_checker",
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/fault_tolerance/apply",
        "/v1/fault_tolerance/apply",
        # 0.34.0: drain the engine and release what a checkpoint must not hold, or restore
        "/checkpoint/prepare",
        "/checkpoint/restore",
        why=CONTROL,
    ),
    *_r(X, "DELETE", Op.CONTROL, "/adapters/{adapter_name}", why=CONTROL),
    *_r(X, "POST", Op.COHERE_CHAT, "/cohere/v2/chat", why=UNMETERABLE),
)
BY_PATH: dict[str, Route] = {r.path: r for r in ROUTES if "{" not in r.path and "*" not in r.path}


def _pattern(path: str) -> re.Pattern[str]:
    if path.endswith("/*"):
        return re.compile(re.escape(path[:-1]) + ".+")
    return re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)))


_TEMPLATED = tuple((_pattern(r.path), r) for r in ROUTES if r.path not in BY_PATH)

KEYLESS_PATHS = frozenset(r.path for r in ROUTES if r.keyless)
INVOCATIONS_PATH = "/invocations"


def route_of(path: str) -> Route | None:
    """The route a normalized path belongs to, whatever the method (None: unknown)."""
    route = BY_PATH.get(path)
    if route is not None:
        return route
    return next((r for pattern, r in _TEMPLATED if pattern.fullmatch(path)), None)


def operation_of(path: str) -> Operation | None:
    """The operation a direct POST to ``path`` performs (None: not a metered route)."""
    route = BY_PATH.get(path)
    if route is None or route.handling not in (Handling.AUDITED, Handling.METERED):
        return None
    return route.operation

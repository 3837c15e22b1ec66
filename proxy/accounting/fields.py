"""The field table: every request field a metered route of any supported vLLM accepts, classified.

A closed world for fields, as the route table is for paths: each field of each body class
vLLM validates a metered route with (``tests/data/vllm_request_fields.json``, read from
every release's code by ``scripts/vllm_fields.py``) has its effect here, per operation,
read from vLLM's code: its work is in the usage vLLM reports (or it makes none), it
multiplies engine work beyond that usage (refused unless ``--allow-unmetered`` names its
feature), vLLM copies it into the answer or its stream events (to be bounded), or it names
state that outlives the request (owned by the tenant). ``tests/unit/accounting/test_fields.py``
fails for a field no entry classifies, so a new release's new field is a decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from proxy.accounting.chatfields import CHAT, COMPLETIONS, MESSAGES
from proxy.accounting.fieldkinds import (
    AUDIO,
    AUDIO_BEAM,
    AUDIO_PROMPT,
    AUDIO_SAMPLING,
    BEAM_ONLY,
    MODEL,
    OUTPUT_SHAPING,
    Field,
    table,
)
from proxy.accounting.generationfields import DECISIONS, GENERATE, GENERATIVE_SCORING, RESPONSES
from proxy.accounting.operations import Operation
from proxy.accounting.poolingfields import CLASSIFY, EMBEDDINGS, POOLING, RERANK, SCORE


def _audio(operation: Operation, *shaping: str) -> Mapping[str, Field]:
    """Transcriptions and translations validate the same fields (``SpeechToTextRequest``),
    but for the output ``shaping`` of one of them."""
    return table(
        operation,
        AUDIO("file"),
        AUDIO_BEAM("use_beam_search"),
        AUDIO_PROMPT("hotwords", "language", "prompt", "to_language"),
        AUDIO_SAMPLING(
            "frequency_penalty",
            "include_stop_str_in_output",
            "max_completion_tokens",
            "min_p",
            "presence_penalty",
            "repetition_penalty",
            "seed",
            "temperature",
            "top_k",
            "top_p",
            "vllm_xargs",
            "watermarking",
        ),
        BEAM_ONLY("length_penalty", "n"),
        MODEL("model"),
        OUTPUT_SHAPING(
            "response_format",
            "stream",
            "stream_continuous_usage_stats",
            "stream_include_usage",
            *shaping,
        ),
    )


TRANSCRIPTIONS = _audio(Operation.TRANSCRIPTIONS, "timestamp_granularities")
# A WebSocket session has no request body: its events (session.update's model, the audio
# appended and committed) are read as they pass (``proxy.wire.realtime_events``).
REALTIME = table(Operation.REALTIME)
TRANSLATIONS = _audio(Operation.TRANSLATIONS)

FIELDS: Mapping[Operation, Mapping[str, Field]] = MappingProxyType(
    {
        Operation.SCORE: SCORE,
        Operation.RERANK: RERANK,
        Operation.EMBEDDINGS: EMBEDDINGS,
        Operation.CLASSIFY: CLASSIFY,
        Operation.POOLING: POOLING,
        Operation.COMPLETIONS: COMPLETIONS,
        Operation.CHAT: CHAT,
        Operation.MESSAGES: MESSAGES,
        Operation.RESPONSES: RESPONSES,
        Operation.DECISIONS: DECISIONS,
        Operation.GENERATE: GENERATE,
        Operation.GENERATIVE_SCORING: GENERATIVE_SCORING,
        Operation.TRANSCRIPTIONS: TRANSCRIPTIONS,
        Operation.TRANSLATIONS: TRANSLATIONS,
        Operation.REALTIME: REALTIME,
    }
)


def field_of(operation: Operation, name: str) -> Field | None:
    """The classification of a request field of a metered operation (None: unknown)."""
    table = FIELDS.get(operation)
    return None if table is None else table.get(name)

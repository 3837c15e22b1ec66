"""The operations a request performs: one spelling for the route table, records and logs.

A ``StrEnum``, so each member is the very string the records, the logs, the metrics and
the wire have always carried (``Operation.CHAT == "chat"``): a record journaled before
the enum reads back the same.
"""

from __future__ import annotations

import enum


class Operation(enum.StrEnum):
    # audited: recounted and judged
    SCORE = "score"
    RERANK = "rerank"
    # metered: billed the usage the engine reports
    EMBEDDINGS = "embeddings"
    CLASSIFY = "classify"
    POOLING = "pooling"
    COMPLETIONS = "completions"
    CHAT = "chat"
    MESSAGES = "messages"
    RESPONSES = "responses"
    DECISIONS = "decisions"
    GENERATE = "generate"
    GENERATIVE_SCORING = "generative_scoring"
    TRANSCRIPTIONS = "transcriptions"
    TRANSLATIONS = "translations"
    REALTIME = "realtime"
    # the body decides (``/invocations``), or it fits no endpoint
    INVOCATIONS = "invocations"
    OTHER = "other"
    # free: no engine work
    PROBE = "probe"
    KV_EVENT_SOURCES = "kv_event_sources"
    MODELS = "models"
    DOCS = "docs"
    TOKENIZE = "tokenize"
    RENDER = "render"
    SERVER_INFO = "server_info"
    # refused
    CONTROL = "control"
    COHERE_CHAT = "cohere_chat"


Op = Operation
SCORING_OPERATIONS = frozenset({Op.SCORE, Op.RERANK})
STREAMING_OPERATIONS = frozenset({Op.CHAT, Op.COMPLETIONS, Op.GENERATE})
# The operations whose requests are multipart forms, read by ``proxy.accounting.audio``.
FORM_OPERATIONS = frozenset({Op.TRANSCRIPTIONS, Op.TRANSLATIONS})
# The metered routes served as WebSocket sessions.
SESSION_OPERATIONS = frozenset({Op.REALTIME})
# The operations whose requests ask for ``n`` choices, each a read of the prompt.
CHOICES_OPERATIONS = frozenset({Op.CHAT, Op.COMPLETIONS, Op.GENERATE})
# The operations whose prompt is a chat template's or a completion's, and the pooling ones.
CHAT_OPERATIONS = frozenset({Op.CHAT, Op.COMPLETIONS, Op.RESPONSES, Op.MESSAGES})
POOLING_OPERATIONS = frozenset({Op.EMBEDDINGS, Op.POOLING, Op.CLASSIFY})
GENERATION_OPERATIONS = frozenset({*CHAT_OPERATIONS, Op.GENERATE})
AUDIO_OPERATIONS = frozenset({*FORM_OPERATIONS, Op.REALTIME})

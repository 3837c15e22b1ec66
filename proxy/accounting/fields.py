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

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Effect(enum.StrEnum):
    BILLED = "billed"  # its engine work is in the usage vLLM reports (or it makes no engine work)
    MULTIPLIES = "multiplies"  # engine work beyond what usage reports (beam search, ...)
    ECHOED = "echoed"  # copied into the answer or into stream events (to be bounded in size)
    STATE = "state"  # names cross-request state: stored responses, previous_response_id,
    # cache_salt, client-chosen ids (owned by the tenant)


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    effects: frozenset[Effect]
    why: str  # one line, from vLLM's code
    feature: str | None = None  # for MULTIPLIES: the --allow-unmetered name


B, X, E, S = Effect.BILLED, Effect.MULTIPLIES, Effect.ECHOED, Effect.STATE
Group = tuple["Kind", tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Kind:
    """A reason some fields share: call it with their names to classify them."""

    effects: frozenset[Effect]
    why: str
    feature: str | None = None

    def __call__(self, *names: str) -> Group:
        return self, names


def _kind(effects: set[Effect], why: str, feature: str | None = None) -> Kind:
    return Kind(frozenset(effects), why, feature)


def _table(operation: str, *groups: Group) -> Mapping[str, Field]:
    """One operation's fields; a name classified twice is a mistake, not an override."""
    fields: dict[str, Field] = {}
    for kind, names in groups:
        feature = f"{operation}.{kind.feature}" if kind.feature else None
        for name in names:
            if name in fields:
                raise ValueError(f"{operation}.{name} is classified twice")
            fields[name] = Field(name, kind.effects, kind.why, feature)
    return MappingProxyType(fields)


MODEL = _kind({B}, "names a served model or LoRA adapter; no work of its own")
PRIORITY = _kind({B}, "scheduling order only (--scheduling-policy priority)")
UNREAD = _kind({B}, "accepted for API compatibility; vLLM's serving code never reads it")
REQUEST_ID = _kind(
    {E, S},
    "client-chosen engine request id: prefixed into the answer's id and every stream "
    "event's id (no length limit); names the request in the engine",
)
SALT = _kind(
    {S},
    "mixed into the first prefix-cache block hash: only requests with the same salt share "
    "cached blocks",
)
SESSION = _kind(
    {S},
    "client-chosen identity kept across requests: tagged on KV-cache events, keys the "
    "encoder-cache connector ({session_id}:{mm_hash})",
)
TRANSFER = _kind(
    {S},
    "disaggregated prefill / encoder cache: names KV or encoder blocks held by another "
    "request or instance, loaded instead of computed",
)
MM_FEATURES = _kind(
    {B, S},
    "pre-processed multimodal items named by hash (the encoder cache is looked up by it); "
    "their placeholder tokens are in token_ids",
)
PROMPT = _kind({B}, "the prompt the engine reads; its tokens are usage.prompt_tokens")
PROMPT_SHAPING = _kind(
    {B}, "shapes the prompt the engine reads; the tokens it yields are usage.prompt_tokens"
)
CHAT_PROMPT = _kind(
    {B}, "rendered into the prompt by the chat template; its tokens are usage.prompt_tokens"
)
SAMPLING = _kind(
    {B},
    "a parameter of the one engine request's sampling; every token it makes is in "
    "usage.completion_tokens",
)
CONSTRAINTS = _kind(
    {B}, "constrains decoding of the same engine request (grammar in the frontend, no tokens)"
)
OUTPUT_SHAPING = _kind(
    {B},
    "shapes how the same outputs are returned (logprobs of sampled positions, stream "
    "batching, ids as text, render payload); no engine work beyond the usage",
)
PROMPT_LOGPROBS = _kind(
    {B},
    "logprobs over prompt positions the engine prefills anyway (usage counts the whole "
    "prompt, cached or not)",
)
PARALLEL = _kind(
    {B},
    "n outputs of one prompt: usage counts the prompt once (as OpenAI) and all n outputs; "
    "the engine's vllm:prompt_tokens_total grows n x prompt",
)
BEAM_ONLY = _kind({B}, "read only by to_beam_search_params (use_beam_search gates the work)")
BEAM = _kind(
    {X},
    "beam search: one engine request per live beam per output token, each re-reading "
    "prompt + tokens so far; usage reports the prompt once and the returned beams",
    "beam_search",
)
BEST_OF = _kind(
    {X},
    "the V0 engine (0.8.5 on CPU; VLLM_USE_V1=0 to 0.10.2) makes best_of sequences, returns "
    "n, usage counts the n (V1 refuses best_of > 1)",
    "best_of",
)
PROMPT_BACK = _kind(
    {E},
    "copies the prompt (token ids, offsets or rendered text) into the answer or the first "
    "stream event (bounded by the context length)",
)
ECHO = _kind({B, E}, "echo=true copies the prompt (chat: the last message) into the answer")
TOOLS = _kind({B}, "tool definitions / choice rendered into the prompt or constraining decoding")
POOLING_OUTPUT = _kind(
    {B},
    "post-processes the pooled output of the same engine requests (format, dimensions, "
    "activation, padding); no engine work beyond the usage",
)
SCORE_SHAPE = _kind(
    {B},
    "selects or truncates what is scored / returned; the engine requests made are in the usage",
)
RESPONSE_ECHO = _kind(
    {E},
    "copied into the Response object (ResponsesResponse.from_request), sent whole in the "
    "answer and in response.created / in_progress / completed events; no size limit "
    "(prompt: a stored prompt's id and variables, never rendered into the engine's prompt)",
)
RESPONSE_PROMPT_ECHO = _kind(
    {B, E},
    "rendered into the prompt, and copied into the Response object of the answer and "
    "the created / in_progress / completed events",
)
RESPONSE_ID = _kind(
    {E, S},
    "becomes the response id (id=request.request_id; default resp_<uuid>): the stored "
    "response's key, echoed in every event",
)
STORED = _kind(
    {S},
    "reads or writes stored responses (VLLM_ENABLE_RESPONSES_API_STORE): shared by every "
    "caller who knows an id",
)
PREVIOUS = _kind(
    {E, S},
    "continues a stored response: its conversation is re-read as this prompt (billed), "
    "its id echoed in the Response object",
)
HISTORY = _kind(
    {B, E},
    "enable_response_messages returns the prompt and output as token ids in the Response "
    "(incl. a previous response's conversation)",
)
MESSAGES_ECHO = _kind(
    {B}, "Anthropic metadata: accepted, never read by vLLM's Messages serving (not echoed)"
)
DECISION_INPUTS = _kind(
    {B},
    "the state, questions and media each decision request reads; the one usage sums the "
    "engine requests made",
)
JOINT_READS = _kind(
    {X},
    "joint=true (diffusion models, 0.33+): one engine request per canvas of questions, the "
    "canvas padded to a width the answer does not show, its usage on the canvas's first "
    "read only; what the engine runs is neither in the usage nor known to the proxy",
    "joint",
)
GEN_SAMPLING = _kind(
    {B},
    "vLLM SamplingParams of one engine request (no beam search; V1 refuses best_of > 1); "
    "usage counts the prompt once and every output of n",
)
STORED_ECHO = _kind(
    {E, S},
    "background=true runs the request detached and stores it (needs store); echoed in "
    "the Response object",
)
DOCUMENTS_ECHO = _kind(
    {B, E},
    "scored documents, each copied back into its result (RerankDocument text or "
    "multimodal content) in the answer",
)
GENERATIVE = _kind(
    {B},
    "query and items scored by label-token logprobs; the usage sums the engine requests",
)


SCORE = _table(
    "score",
    MODEL("model"),
    POOLING_OUTPUT("activation", "padding", "softmax", "use_activation"),
    PRIORITY("priority"),
    PROMPT("data_1", "data_2", "documents", "instruction", "items", "queries", "text_1", "text_2"),
    PROMPT_SHAPING(
        "chat_template_kwargs",
        "max_tokens_per_doc",
        "max_tokens_per_query",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("additional_data", "user"),
)


RERANK = _table(
    "rerank",
    DOCUMENTS_ECHO("documents"),
    MODEL("model"),
    POOLING_OUTPUT("activation", "padding", "softmax", "use_activation"),
    PRIORITY("priority"),
    PROMPT("instruction", "query"),
    PROMPT_SHAPING(
        "chat_template_kwargs",
        "max_tokens_per_doc",
        "max_tokens_per_query",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    SCORE_SHAPE("top_n"),
    UNREAD("additional_data", "user"),
)


EMBEDDINGS = _table(
    "embeddings",
    CHAT_PROMPT("add_generation_prompt", "chat_template", "continue_final_message", "messages"),
    MODEL("model"),
    POOLING_OUTPUT(
        "dimensions",
        "embed_dtype",
        "embedding_types",
        "encoding_format",
        "endianness",
        "late_chunking_params",
        "normalize",
        "output_dimension",
        "padding",
        "use_activation",
    ),
    PRIORITY("priority"),
    PROMPT("images", "input", "input_type", "inputs", "texts"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "max_tokens",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("additional_data", "user"),
)


CLASSIFY = _table(
    "classify",
    CHAT_PROMPT("add_generation_prompt", "chat_template", "continue_final_message", "messages"),
    MODEL("model"),
    POOLING_OUTPUT("activation", "padding", "softmax", "use_activation"),
    PRIORITY("priority"),
    PROMPT("input"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("user"),
)


POOLING = _table(
    "pooling",
    CHAT_PROMPT("add_generation_prompt", "chat_template", "continue_final_message", "messages"),
    MODEL("model"),
    POOLING_OUTPUT(
        "activation",
        "dimensions",
        "embed_dtype",
        "encoding_format",
        "endianness",
        "normalize",
        "padding",
        "softmax",
        "task",
        "use_activation",
    ),
    PRIORITY("priority"),
    PROMPT("data", "input"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("additional_data", "user"),
)


COMPLETIONS = _table(
    "completions",
    BEAM("use_beam_search"),
    BEAM_ONLY("length_penalty"),
    BEST_OF("best_of"),
    CONSTRAINTS(
        "guided_choice",
        "guided_decoding_backend",
        "guided_grammar",
        "guided_json",
        "guided_regex",
        "guided_whitespace_pattern",
        "response_format",
        "structured_outputs",
    ),
    ECHO("echo"),
    MODEL("model"),
    OUTPUT_SHAPING(
        "logprob_token_ids",
        "logprobs",
        "mm_payload",
        "return_mm_kwargs",
        "return_tokens_as_token_ids",
        "return_weight_versions",
        "routed_experts_prompt_start",
        "stream",
        "stream_interval",
        "stream_options",
    ),
    PARALLEL("n"),
    PRIORITY("priority"),
    PROMPT("prompt", "prompt_embeds", "suffix"),
    PROMPT_BACK("return_token_ids", "return_token_offsets"),
    PROMPT_LOGPROBS("prompt_logprobs"),
    PROMPT_SHAPING("add_special_tokens", "truncate_prompt_tokens", "truncation_side"),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    SAMPLING(
        "allowed_token_ids",
        "bad_words",
        "frequency_penalty",
        "ignore_eos",
        "include_stop_str_in_output",
        "logit_bias",
        "logits_processors",
        "max_tokens",
        "min_p",
        "min_tokens",
        "presence_penalty",
        "repetition_detection",
        "repetition_penalty",
        "seed",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "thinking_token_budget",
        "top_k",
        "top_p",
        "vllm_xargs",
        "watermarking",
    ),
    SESSION("session_id"),
    TRANSFER("ec_transfer_params", "kv_transfer_params"),
    UNREAD("user"),
)


CHAT = _table(
    "chat",
    BEAM("use_beam_search"),
    BEAM_ONLY("early_stopping", "length_penalty"),
    BEST_OF("best_of"),
    CHAT_PROMPT(
        "add_generation_prompt", "chat_template", "continue_final_message", "documents", "messages"
    ),
    CONSTRAINTS(
        "guided_choice",
        "guided_decoding_backend",
        "guided_grammar",
        "guided_json",
        "guided_regex",
        "guided_whitespace_pattern",
        "response_format",
        "structural_tag",
        "structured_outputs",
    ),
    ECHO("echo"),
    MODEL("model"),
    OUTPUT_SHAPING(
        "logprob_token_ids",
        "logprobs",
        "mm_payload",
        "return_assistant_tokens_mask",
        "return_mm_kwargs",
        "return_tokens_as_token_ids",
        "return_weight_versions",
        "routed_experts_prompt_start",
        "stream",
        "stream_interval",
        "stream_options",
        "top_logprobs",
    ),
    PARALLEL("n"),
    PRIORITY("priority"),
    PROMPT_BACK("return_prompt_text", "return_token_ids", "return_token_offsets"),
    PROMPT_LOGPROBS("prompt_logprobs"),
    PROMPT_SHAPING(
        "add_special_tokens",
        "chat_template_kwargs",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "truncate_prompt_tokens",
        "truncation_side",
    ),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    SAMPLING(
        "allowed_token_ids",
        "bad_words",
        "frequency_penalty",
        "ignore_eos",
        "include_reasoning",
        "include_stop_str_in_output",
        "logit_bias",
        "logits_processors",
        "max_completion_tokens",
        "max_tokens",
        "min_p",
        "min_tokens",
        "presence_penalty",
        "reasoning_effort",
        "repetition_detection",
        "repetition_penalty",
        "seed",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "thinking_token_budget",
        "top_k",
        "top_p",
        "vllm_xargs",
        "watermarking",
    ),
    SESSION("session_id"),
    TOOLS("parallel_tool_calls", "tool_choice", "tools"),
    TRANSFER("ec_transfer_params", "kv_transfer_params"),
    UNREAD("user"),
)


MESSAGES = _table(
    "messages",
    CHAT_PROMPT("messages", "system"),
    CONSTRAINTS("output_config"),
    MESSAGES_ECHO("metadata"),
    MODEL("model"),
    OUTPUT_SHAPING("mm_payload", "return_mm_kwargs", "stream"),
    PROMPT_SHAPING("chat_template_kwargs"),
    SALT("cache_salt"),
    SAMPLING(
        "max_tokens",
        "min_tokens",
        "stop_sequences",
        "temperature",
        "thinking",
        "top_k",
        "top_p",
        "vllm_xargs",
        "watermarking",
    ),
    TOOLS("tool_choice", "tools"),
    TRANSFER("ec_transfer_params", "kv_transfer_params"),
)


RESPONSES = _table(
    "responses",
    CHAT_PROMPT("previous_input_messages"),
    CONSTRAINTS("structured_outputs"),
    HISTORY("enable_response_messages"),
    MODEL("model"),
    OUTPUT_SHAPING("include", "mm_payload", "return_mm_kwargs", "stream"),
    PREVIOUS("previous_response_id"),
    PRIORITY("priority"),
    PROMPT("input"),
    PROMPT_SHAPING("chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs"),
    RESPONSE_ECHO(
        "max_tool_calls",
        "metadata",
        "prompt",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "text",
        "top_logprobs",
        "truncation",
        "user",
    ),
    RESPONSE_ID("request_id"),
    RESPONSE_PROMPT_ECHO("instructions", "parallel_tool_calls", "tool_choice", "tools"),
    SALT("cache_salt"),
    SAMPLING(
        "frequency_penalty",
        "ignore_eos",
        "include_reasoning",
        "include_stop_str_in_output",
        "logit_bias",
        "max_output_tokens",
        "min_p",
        "presence_penalty",
        "repetition_penalty",
        "seed",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "thinking_token_budget",
        "top_k",
        "top_p",
        "vllm_xargs",
        "watermarking",
    ),
    SESSION("session_id"),
    STORED("store"),
    STORED_ECHO("background"),
    TRANSFER("ec_transfer_params", "kv_transfer_params"),
    UNREAD("prompt_cache_key"),
)


DECISIONS = _table(
    "decisions",
    DECISION_INPUTS("audio", "images", "input", "instructions", "questions", "state", "videos"),
    JOINT_READS("joint"),
    MODEL("model"),
    PRIORITY("priority"),
    PROMPT_SHAPING("chat_template_kwargs"),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    UNREAD("safety_identifier"),
)


GENERATE = _table(
    "generate",
    CONSTRAINTS("reasoning_ended", "reasoning_parser_kwargs"),
    GEN_SAMPLING("sampling_params"),
    MM_FEATURES("features"),
    MODEL("model"),
    OUTPUT_SHAPING(
        "assistant_tokens_mask",
        "output_mode",
        "parse_context",
        "stream",
        "stream_options",
        "token_offsets",
    ),
    PRIORITY("priority"),
    PROMPT("content_parts", "token_ids"),
    PROMPT_BACK("return_token_ids"),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
    TRANSFER("ec_transfer_params", "kv_transfer_params"),
)


GENERATIVE_SCORING = _table(
    "generative_scoring",
    GENERATIVE("apply_softmax", "item_first", "items", "label_token_ids", "query"),
    MODEL("model"),
    PRIORITY("priority"),
    PROMPT_SHAPING("add_special_tokens"),
    REQUEST_ID("request_id"),
    SALT("cache_salt"),
)

# Audio (multipart forms, ``proxy.accounting.audio``): a whole transcription is billed in
# seconds of audio (usage.seconds), a stream in tokens; vLLM cuts long audio into chunks of
# at most 30 s (Whisper), one engine request each.
AUDIO = _kind(
    {B},
    "the audio the engine reads: a whole transcription is billed in its seconds "
    "(usage.seconds, rounded up), a stream in the tokens of every chunk's engine request",
)
AUDIO_PROMPT = _kind(
    {B},
    "shapes the decoder prompt (language, task, text prompt, hotwords; bounded by the "
    "decoder's context): in a stream's prompt_tokens; a whole answer is billed in seconds",
)
AUDIO_SAMPLING = _kind(
    {B},
    "a sampling parameter of each chunk's one engine request: streamed, every token it "
    "makes is in usage.completion_tokens; whole, billed in seconds of audio",
)
AUDIO_BEAM = _kind(
    {X},
    "beam search (never streamed: vLLM refuses it): n beams per audio chunk, one engine "
    "request per live beam per token; the usage reports the audio's seconds alone",
    "beam_search",
)


def _audio(operation: str, *shaping: str) -> Mapping[str, Field]:
    """Transcriptions and translations validate the same fields (``SpeechToTextRequest``),
    but for the output ``shaping`` of one of them."""
    return _table(
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


TRANSCRIPTIONS = _audio("transcriptions", "timestamp_granularities")
# A WebSocket session has no request body: its events (session.update's model, the audio
# appended and committed) are read as they pass (``proxy.wire.realtime_events``).
REALTIME = _table("realtime")
TRANSLATIONS = _audio("translations")

FIELDS: Mapping[str, Mapping[str, Field]] = MappingProxyType(
    {
        "score": SCORE,
        "rerank": RERANK,
        "embeddings": EMBEDDINGS,
        "classify": CLASSIFY,
        "pooling": POOLING,
        "completions": COMPLETIONS,
        "chat": CHAT,
        "messages": MESSAGES,
        "responses": RESPONSES,
        "decisions": DECISIONS,
        "generate": GENERATE,
        "generative_scoring": GENERATIVE_SCORING,
        "transcriptions": TRANSCRIPTIONS,
        "translations": TRANSLATIONS,
        "realtime": REALTIME,
    }
)


def field_of(operation: str, name: str) -> Field | None:
    """The classification of a request field of a metered operation (None: unknown)."""
    table = FIELDS.get(operation)
    return None if table is None else table.get(name)

"""The vocabulary of the field table (``fields``): a field's effects, what admission's
price reads of it (``Reads``), the ``Kind`` of reason fields share (called with their
names to classify them), and every named kind, each with its one line read from vLLM's
code."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from proxy.accounting.operations import Operation


class Effect(enum.StrEnum):
    BILLED = "billed"  # its engine work is in the usage vLLM reports (or it makes no engine work)
    MULTIPLIES = "multiplies"  # engine work beyond what usage reports (beam search, ...)
    ECHOED = "echoed"  # copied into the answer or into stream events (to be bounded in size)
    STATE = "state"  # names cross-request state: stored responses, previous_response_id,
    # cache_salt, client-chosen ids (owned by the tenant)


class Reads(enum.StrEnum):
    """What the price before forwarding (``proxy.limits.pricing``) reads of a field."""

    CAP = "cap"  # the completion cap the route's request model reads
    CAP_FALLBACK = "cap fallback"  # the cap read when the CAP field is absent or null
    CHOICES = "choices"  # outputs per prompt (the largest such field counts)
    SAMPLING = "sampling"  # a nested SamplingParams: its max_tokens is the cap, its n choices
    EACH = "each"  # a list: one engine request per member
    PROMPTS = "prompts"  # a prompt (text or token ids), or a list of them: one request each
    CONVERSATIONS = "conversations"  # one conversation, or a list of them (one request each)


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    effects: frozenset[Effect]
    why: str  # one line, from vLLM's code
    feature: str | None = None  # for MULTIPLIES: the --allow-unmetered name
    reads: Reads | None = None  # what admission's price reads of it
    default: int | None = None  # for a cap: vLLM's value when the field is absent


B, X, E, S = Effect.BILLED, Effect.MULTIPLIES, Effect.ECHOED, Effect.STATE
R = Reads
Group = tuple["Kind", tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Kind:
    """A reason some fields share: call it with their names to classify them."""

    effects: frozenset[Effect]
    why: str
    feature: str | None = None
    reads: Reads | None = None
    default: int | None = None

    def __call__(self, *names: str) -> Group:
        return self, names


def kind(
    effects: set[Effect],
    why: str,
    feature: str | None = None,
    *,
    reads: Reads | None = None,
    default: int | None = None,
) -> Kind:
    return Kind(frozenset(effects), why, feature, reads, default)


def table(operation: Operation, *groups: Group) -> Mapping[str, Field]:
    """One operation's fields; a name classified twice is a mistake, not an override."""
    fields: dict[str, Field] = {}
    for kind, names in groups:
        feature = f"{operation}.{kind.feature}" if kind.feature else None
        for name in names:
            if name in fields:
                raise ValueError(f"{operation}.{name} is classified twice")
            fields[name] = Field(name, kind.effects, kind.why, feature, kind.reads, kind.default)
    return MappingProxyType(fields)


MODEL = kind({B}, "names a served model or LoRA adapter; no work of its own")
PRIORITY = kind({B}, "scheduling order only (--scheduling-policy priority)")
UNREAD = kind({B}, "accepted for API compatibility; vLLM's serving code never reads it")
REQUEST_ID = kind(
    {E, S},
    "client-chosen engine request id: prefixed into the answer's id and every stream "
    "event's id (no length limit); names the request in the engine",
)
SALT = kind(
    {S},
    "mixed into the first prefix-cache block hash: only requests with the same salt share "
    "cached blocks",
)
SESSION = kind(
    {S},
    "client-chosen identity kept across requests: tagged on KV-cache events, keys the "
    "encoder-cache connector ({session_id}:{mm_hash})",
)
TRANSFER = kind(
    {S},
    "disaggregated prefill / encoder cache: names KV or encoder blocks held by another "
    "request or instance, loaded instead of computed",
)
MM_FEATURES = kind(
    {B, S},
    "pre-processed multimodal items named by hash (the encoder cache is looked up by it); "
    "their placeholder tokens are in token_ids",
)
PROMPT = kind({B}, "the prompt the engine reads; its tokens are usage.prompt_tokens")
PROMPT_SHAPING = kind(
    {B}, "shapes the prompt the engine reads; the tokens it yields are usage.prompt_tokens"
)
CHAT_PROMPT = kind(
    {B}, "rendered into the prompt by the chat template; its tokens are usage.prompt_tokens"
)
SAMPLING = kind(
    {B},
    "a parameter of the one engine request's sampling; every token it makes is in "
    "usage.completion_tokens",
)
CONSTRAINTS = kind(
    {B}, "constrains decoding of the same engine request (grammar in the frontend, no tokens)"
)
OUTPUT_SHAPING = kind(
    {B},
    "shapes how the same outputs are returned (logprobs of sampled positions, stream "
    "batching, ids as text, render payload); no engine work beyond the usage",
)
PROMPT_LOGPROBS = kind(
    {B},
    "logprobs over prompt positions the engine prefills anyway (usage counts the whole "
    "prompt, cached or not)",
)
PARALLEL = kind(
    {B},
    "n outputs of one prompt: usage counts the prompt once (as OpenAI) and all n outputs; "
    "the engine's vllm:prompt_tokens_total grows n x prompt",
    reads=R.CHOICES,
)
BEAM_ONLY = kind({B}, "read only by to_beam_search_params (use_beam_search gates the work)")
BEAM = kind(
    {X},
    "beam search: one engine request per live beam per output token, each re-reading "
    "prompt + tokens so far; usage reports the prompt once and the returned beams",
    "beam_search",
)
BEST_OF = kind(
    {X},
    "the V0 engine (0.8.5 on CPU; VLLM_USE_V1=0 to 0.10.2) makes best_of sequences, returns "
    "n, usage counts the n (V1 refuses best_of > 1)",
    "best_of",
    reads=R.CHOICES,
)
PROMPT_BACK = kind(
    {E},
    "copies the prompt (token ids, offsets or rendered text) into the answer or the first "
    "stream event (bounded by the context length)",
)
ECHO = kind({B, E}, "echo=true copies the prompt (chat: the last message) into the answer")
TOOLS = kind({B}, "tool definitions / choice rendered into the prompt or constraining decoding")
POOLING_OUTPUT = kind(
    {B},
    "post-processes the pooled output of the same engine requests (format, dimensions, "
    "activation, padding); no engine work beyond the usage",
)
SCORE_SHAPE = kind(
    {B},
    "selects or truncates what is scored / returned; the engine requests made are in the usage",
)
RESPONSE_ECHO = kind(
    {E},
    "copied into the Response object (ResponsesResponse.from_request), sent whole in the "
    "answer and in response.created / in_progress / completed events; no size limit "
    "(prompt: a stored prompt's id and variables, never rendered into the engine's prompt)",
)
RESPONSE_PROMPT_ECHO = kind(
    {B, E},
    "rendered into the prompt, and copied into the Response object of the answer and "
    "the created / in_progress / completed events",
)
RESPONSE_ID = kind(
    {E, S},
    "becomes the response id (id=request.request_id; default resp_<uuid>): the stored "
    "response's key, echoed in every event",
)
STORED = kind(
    {S},
    "reads or writes stored responses (VLLM_ENABLE_RESPONSES_API_STORE): shared by every "
    "caller who knows an id",
)
PREVIOUS = kind(
    {E, S},
    "continues a stored response: its conversation is re-read as this prompt (billed), "
    "its id echoed in the Response object",
)
HISTORY = kind(
    {B, E},
    "enable_response_messages returns the prompt and output as token ids in the Response "
    "(incl. a previous response's conversation)",
)
MESSAGES_ECHO = kind(
    {B}, "Anthropic metadata: accepted, never read by vLLM's Messages serving (not echoed)"
)
DECISION_INPUTS = kind(
    {B},
    "the state, questions and media each decision request reads; the one usage sums the "
    "engine requests made",
)
JOINT_READS = kind(
    {X},
    "joint=true (diffusion models, 0.33+): one engine request per canvas of questions, the "
    "canvas padded to a width the answer does not show, its usage on the canvas's first "
    "read only; what the engine runs is neither in the usage nor known to the proxy",
    "joint",
)
GEN_SAMPLING = kind(
    {B},
    "vLLM SamplingParams of one engine request (no beam search; V1 refuses best_of > 1); "
    "usage counts the prompt once and every output of n; max_tokens absent: what the "
    "context leaves (serving.py get_max_tokens)",
    reads=R.SAMPLING,
)
STORED_ECHO = kind(
    {E, S},
    "background=true runs the request detached and stores it (needs store); echoed in "
    "the Response object",
)
DOCUMENTS_ECHO = kind(
    {B, E},
    "scored documents, each copied back into its result (RerankDocument text or "
    "multimodal content) in the answer",
)
GENERATIVE = kind(
    {B},
    "query and items scored by label-token logprobs; the usage sums the engine requests",
)
GENERATIVE_ITEMS = kind(
    {B},
    "one engine request per item: the query and the item, cut to the context less one, "
    "and one generated token (max_tokens=1); the usage sums them",
    reads=R.EACH,
)
COMPLETION_CAP = kind(
    {B},
    "the completion's cap as this route's request model reads it: get_max_tokens clamps "
    "it to what the context leaves after the prompt (0.32); absent, what the context leaves",
    reads=R.CAP,
)
COMPLETION_CAP_16 = kind(
    {B},
    "the completion's cap (CompletionRequest.max_tokens = 16 when absent; null: what the "
    "context leaves), clamped by get_max_tokens to what the context leaves",
    reads=R.CAP,
    default=16,
)
COMPLETION_CAP_FALLBACK = kind(
    {B},
    "the completion's cap when max_completion_tokens is absent or null (deprecated alias, "
    "read second by get_max_tokens' caller)",
    reads=R.CAP_FALLBACK,
)
CONVERSATIONS = kind(
    {B},
    "rendered into the prompt by the chat template; a list of conversations (the batch "
    "request models) is one engine request per conversation",
    reads=R.CONVERSATIONS,
)
PROMPTS = kind(
    {B},
    "the prompt the engine reads: text or token ids, or a list of them (one engine request "
    "each); its tokens are usage.prompt_tokens",
    reads=R.PROMPTS,
)
PROMPTS_EACH = kind(
    {B},
    "a list of inputs (Cohere /v2/embed texts, images, inputs): one engine request each, "
    "its tokens in the usage",
    reads=R.EACH,
)


# Audio (multipart forms, ``proxy.accounting.audio``): a whole transcription is billed in
# seconds of audio (usage.seconds), a stream in tokens; vLLM cuts long audio into chunks of
# at most 30 s (Whisper), one engine request each.
AUDIO = kind(
    {B},
    "the audio the engine reads: a whole transcription is billed in its seconds "
    "(usage.seconds, rounded up), a stream in the tokens of every chunk's engine request",
)
AUDIO_PROMPT = kind(
    {B},
    "shapes the decoder prompt (language, task, text prompt, hotwords; bounded by the "
    "decoder's context): in a stream's prompt_tokens; a whole answer is billed in seconds",
)
AUDIO_SAMPLING = kind(
    {B},
    "a sampling parameter of each chunk's one engine request: streamed, every token it "
    "makes is in usage.completion_tokens; whole, billed in seconds of audio",
)
AUDIO_BEAM = kind(
    {X},
    "beam search (never streamed: vLLM refuses it): n beams per audio chunk, one engine "
    "request per live beam per token; the usage reports the audio's seconds alone",
    "beam_search",
)

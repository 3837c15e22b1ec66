"""Engine-level token accounting for vLLM scoring requests (spec sections 4 and 5).

Pure functions: no I/O, no asyncio. Every count here reproduces what vLLM's renderer feeds
the engine for one request, input by input, including its truncation and padding rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from proxy.accounting.types import (
    EngineProfile,
    Family,
    Pairing,
    ScorePrompt,
    Tokenizer,
    Truncation,
)

# HF cannot truncate below the number of special tokens; counting with a cap at least this
# large and then clamping gives exactly vLLM's "tokenize, then slice" length.
_MIN_CAP = 16


@dataclass(frozen=True, slots=True)
class Recount:
    """Engine-level lengths of one request, and what a pre-0.30 vLLM reports for it."""

    engine: int
    prefix_reported: int
    query_lengths: tuple[int, ...]
    document_lengths: tuple[int, ...]


def cut_text(tok: Tokenizer, text: str, max_tokens: int, *, iterative: bool) -> str:
    """vLLM's ``truncate_text_to_tokens``: cut raw text to ``max_tokens`` content tokens.

    Up to 0.30 it cuts once at the end offset of the k-th token; from 0.31 it repeats the
    cut (at the earlier of that end and the next token's start) until the text fits, so
    multi-token characters give different texts across versions.
    """
    if not iterative:
        offsets = tok.content_offsets(text)
        return text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]]
    if max_tokens <= 0:
        return ""
    while text:
        offsets = tok.content_offsets(text)
        if len(offsets) <= max_tokens:
            break
        end = min(offsets[max_tokens - 1][1], offsets[max_tokens][0])
        text = text[: min(end, len(text) - 1)]
    return text


def _keep_limit(trunc: Truncation, max_model_len: int) -> int | None:
    """The per-input token limit truncate_prompt_tokens imposes (-1 means max_model_len)."""
    k = trunc.truncate_prompt_tokens
    if k is not None and k < 0:
        return max_model_len
    return k


def _finish(length: int, keep: int | None, trunc: Truncation, max_model_len: int) -> int:
    """vLLM's post-tokenization: slice to the keep limit, then pad to max_model_len."""
    if keep is not None:
        length = min(length, keep)
    if trunc.pad_to_max_length:
        length = max(length, max_model_len)
    return length


def single_lengths(
    tok: Tokenizer, texts: Sequence[str], trunc: Truncation, max_model_len: int
) -> list[int]:
    """Engine lengths of texts each tokenized alone (bi-encoder and late-interaction inputs)."""
    keep = _keep_limit(trunc, max_model_len)
    if keep == 0:
        return [_finish(0, 0, trunc, max_model_len) for _ in texts]
    cap = max(keep if keep is not None else max_model_len + 1, _MIN_CAP)
    lengths = tok.lengths(texts, max_length=cap)
    if keep is None and not trunc.pad_to_max_length:
        return lengths  # _finish would change nothing
    return [_finish(n, keep, trunc, max_model_len) for n in lengths]


def pair_length(
    tok: Tokenizer,
    query: str,
    document: str,
    trunc: Truncation,
    max_model_len: int,
    *,
    iterative: bool,
    needs_room: bool = False,
) -> int:
    """Engine length of one cross-encoder input ``tok(text=query, text_pair=document)``.

    ``needs_room`` (0.33+): the ``only_second`` cut applies only when the query and the
    special tokens leave room for the document."""
    if trunc.max_tokens_per_query > 0:
        query = cut_text(tok, query, trunc.max_tokens_per_query, iterative=iterative)
    if trunc.max_tokens_per_doc > 0:
        document = cut_text(tok, document, trunc.max_tokens_per_doc, iterative=iterative)
    keep = _keep_limit(trunc, max_model_len)
    if keep == 0:
        return _finish(0, 0, trunc, max_model_len)
    max_length: int | None
    if keep is not None and trunc.truncation_side is not None:
        max_length = None
    else:
        max_length = keep if keep is not None else max_model_len + 1
    only_second = trunc.max_tokens_per_doc > 0
    if only_second:
        query_room = len(tok.content_offsets(query)) + tok.num_special_tokens_pair()
        doc_limit = query_room + trunc.max_tokens_per_doc
        effective = doc_limit if max_length is None else min(doc_limit, max_length)
        if needs_room and query_room >= effective:
            only_second = False  # max_length stays the request's own
        else:
            max_length = effective
    length = tok.pair_length(query, document, max_length=max_length, only_second=only_second)
    return _finish(length, keep, trunc, max_model_len)


def _cut_all(
    tok: Tokenizer, texts: Sequence[str], max_tokens: int, *, iterative: bool
) -> list[str]:
    if max_tokens <= 0:
        return list(texts)
    return [cut_text(tok, t, max_tokens, iterative=iterative) for t in texts]


def expand_queries(query_lengths: Sequence[int], n_documents: int) -> list[int]:
    """The query length paired with each document (1:N repeats the single query)."""
    if len(query_lengths) == 1:
        return list(query_lengths) * n_documents
    return list(query_lengths)


def recount_separate(
    tok: Tokenizer,
    queries: Sequence[str],
    documents: Sequence[str],
    trunc: Truncation,
    profile: EngineProfile,
) -> Recount:
    """Bi-encoder / late-interaction: each query once and each document once.

    The pre-fix report pairs every document with a copy of its query plus one pad token.
    """
    iterative = profile.release.iterative_text_cut
    mml = profile.max_model_len
    q_texts = _cut_all(tok, queries, trunc.max_tokens_per_query, iterative=iterative)
    d_texts = _cut_all(tok, documents, trunc.max_tokens_per_doc, iterative=iterative)
    q = single_lengths(tok, q_texts, trunc, mml)
    d = single_lengths(tok, d_texts, trunc, mml)
    pad = int(profile.has_pad_token)
    engine = sum(q) + sum(d)
    reported = sum(expand_queries(q, len(d))) + len(d) * pad + sum(d)
    return Recount(engine, reported, tuple(q), tuple(d))


def recount_pairs(
    tok: Tokenizer,
    queries: Sequence[str],
    documents: Sequence[str],
    trunc: Truncation,
    profile: EngineProfile,
) -> Recount:
    """Cross-encoder: one engine input per (query, document) pair; always reported right."""
    iterative = profile.release.iterative_text_cut
    room = profile.release.only_second_needs_room
    mml = profile.max_model_len
    return _per_pair(
        queries,
        documents,
        lambda q, d: pair_length(tok, q, d, trunc, mml, iterative=iterative, needs_room=room),
    )


def _per_pair(
    queries: Sequence[str], documents: Sequence[str], length: Callable[[str, str], int]
) -> Recount:
    """One engine input per (query, document) pair (1:N repeats the query), reported as
    processed on every release."""
    paired = list(queries) * len(documents) if len(queries) == 1 else list(queries)
    lengths = tuple(length(q, d) for q, d in zip(paired, documents, strict=True))
    engine = sum(lengths)
    return Recount(engine, engine, (), lengths)


# jina-reranker-m0's own score template (``JinaVLForRanking.get_score_template``); its
# ``post_process_tokens`` appends one score token to every prompt.
JINA_VL_TEMPLATE = "**Document**:\n{document}\n**Query**:\n{query}"


def template_length(
    tok: Tokenizer,
    query: str,
    document: str,
    trunc: Truncation,
    profile: EngineProfile,
    template_kwargs: Mapping[str, Any],
) -> int:
    """Engine length of one LLM-reranker pair (vLLM's ``CrossEncoderIOProcessor``
    ``get_score_prompt``): the texts are cut first, then put in the prompt, which is
    tokenized with special tokens and truncated/padded as one input."""
    prompt, mml = profile.prompt or ScorePrompt(), profile.max_model_len
    iterative = profile.release.iterative_text_cut
    if prompt.chat_template is None and prompt.builtin is None and prompt.use_sep_token:
        room = profile.release.only_second_needs_room
        return pair_length(tok, query, document, trunc, mml, iterative=iterative, needs_room=room)
    if trunc.max_tokens_per_query > 0:
        query = cut_text(tok, query, trunc.max_tokens_per_query, iterative=iterative)
    if trunc.max_tokens_per_doc > 0:
        document = cut_text(tok, document, trunc.max_tokens_per_doc, iterative=iterative)
    if prompt.chat_template is not None:
        messages = ({"role": "query", "content": query}, {"role": "document", "content": document})
        text = tok.render_chat(prompt.chat_template, messages, dict(template_kwargs))
        return single_lengths(tok, [text], trunc, mml)[0]
    if prompt.builtin == "jina-vl":
        text = JINA_VL_TEMPLATE.format(query=query, document=document)
        keep = _keep_limit(trunc, mml)
        if profile.release.reserves_score_tokens:  # 0.33: limits leave room for the token
            whole = single_lengths(tok, [text], Truncation(), mml)[0]
            reserved = None if keep is None else max(keep - 1, 0)
            return _finish(whole, reserved, trunc, mml - 1) + 1
        # tokenized (truncated), then the score token appended, then sliced and padded
        unpadded = replace(trunc, pad_to_max_length=False)
        length = single_lengths(tok, [text], unpadded, mml)[0] + 1
        return _finish(length, keep, trunc, mml)
    if trunc.max_tokens_per_doc > 0 and not profile.release.joins_cut_texts:
        # up to 0.30: the two texts' ids, without special tokens, the document's cut to k
        q = len(tok.content_offsets(query))
        d = min(len(tok.content_offsets(document)), trunc.max_tokens_per_doc)
        return _finish(q + d, _keep_limit(trunc, mml), trunc, mml)
    return single_lengths(tok, [query + document], trunc, mml)[0]


def recount_template(
    tok: Tokenizer,
    queries: Sequence[str],
    documents: Sequence[str],
    trunc: Truncation,
    profile: EngineProfile,
    template_kwargs: Mapping[str, Any],
) -> Recount:
    """LLM reranker: one engine input per (query, document) pair; always reported right."""
    return _per_pair(
        queries,
        documents,
        lambda q, d: template_length(tok, q, d, trunc, profile, template_kwargs),
    )


# jina-reranker-v3 (``JinaRankingIOProcessorMixin.format_docs_prompts_func``, the same text
# in 0.27.0 - 0.32.0). Special-token strings are removed from the inputs first.
JINA_V3_SPECIALS = ("<|rerank_token|>", "<|embed_token|>")
JINA_V3_PREFIX = (
    "<|im_start|>system\n"
    "You are a search relevance expert who can determine a ranking of the passages based on "
    "how relevant they are to the query. If the query is a question, how relevant a passage "
    "is depends on how well it answers the question. If not, try to analyze the intent of "
    "the query and assess how well each passage satisfies the intent. If an instruction is "
    "provided, you should follow the instruction when determining the ranking."
    "<|im_end|>\n<|im_start|>user\n"
)
JINA_V3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _sanitized(text: str, repeat: bool = False) -> str:
    """The text without jina's embed tokens: one pass up to 0.33; from 0.34 passes until
    none is left (``<|rerank_<|embed_token|>token|>`` keeps a rerank token in one pass)."""
    while True:
        previous = text
        for token in JINA_V3_SPECIALS:
            text = text.replace(token, "")
        if not repeat or text == previous:
            return text


def jina_v3_prompt(
    query: str, documents: Sequence[str], instruction: str | None, repeat: bool = False
) -> str:
    """The one listwise prompt vLLM builds for a query and its documents (``repeat``: the
    texts sanitized as 0.34 does, ``_sanitized``)."""

    def _sanitize(text: str) -> str:
        return _sanitized(text, repeat)

    query = _sanitize(query)
    prompt = (
        f"I will provide you with {len(documents)} passages, each indicated by a numerical "
        f"identifier. Rank the passages based on their relevance to query: {query}\n"
    )
    if instruction:
        prompt += f"<instruct>\n{_sanitize(instruction)}\n</instruct>\n"
    passages = (
        f'<passage id="{i}">\n{_sanitize(d)}<|embed_token|>\n</passage>'
        for i, d in enumerate(documents)
    )
    prompt += "\n".join(passages) + "\n"
    prompt += f"<query>\n{query}<|rerank_token|>\n</query>"
    return JINA_V3_PREFIX + prompt + JINA_V3_SUFFIX


def recount_listwise(
    tok: Tokenizer,
    queries: Sequence[str],
    documents: Sequence[str],
    trunc: Truncation,
    profile: EngineProfile,
    template_kwargs: Mapping[str, Any],
) -> Recount:
    """jina-reranker-v3: 1:N is one prompt holding every document, N:N one prompt per pair.

    The texts are cut first (``max_tokens_per_*``); the prompt is then a completion input:
    ``truncate_prompt_tokens`` and ``truncation_side`` apply, padding does not. Before 0.30
    a 1:N answer reports the prompt's length once per document.
    """
    iterative = profile.release.iterative_text_cut
    q_texts = _cut_all(tok, queries, trunc.max_tokens_per_query, iterative=iterative)
    d_texts = _cut_all(tok, documents, trunc.max_tokens_per_doc, iterative=iterative)
    instruction = template_kwargs.get("instruction")
    instruction = instruction if isinstance(instruction, str) else None
    repeat = profile.release.sanitizes_repeatedly
    if len(q_texts) == 1:
        prompts = [jina_v3_prompt(q_texts[0], d_texts, instruction, repeat)]
    else:
        prompts = [
            jina_v3_prompt(q, [d], instruction, repeat)
            for q, d in zip(q_texts, d_texts, strict=True)
        ]
    completion = Truncation(trunc.truncate_prompt_tokens, trunc.truncation_side)
    lengths = tuple(single_lengths(tok, prompts, completion, profile.max_model_len))
    engine = sum(lengths)
    reported = engine * len(d_texts) if len(q_texts) == 1 else engine
    return Recount(engine, reported, (), lengths)


def recount(
    tok: Tokenizer,
    queries: Sequence[str],
    documents: Sequence[str],
    trunc: Truncation,
    profile: EngineProfile,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Recount:
    """Full recount of a request's engine inputs, family by family."""
    kwargs = template_kwargs or {}
    if profile.family in (Family.BI_ENCODER, Family.LATE_INTERACTION):
        return recount_separate(tok, queries, documents, trunc, profile)
    if profile.family is Family.CROSS_ENCODER:
        return recount_pairs(tok, queries, documents, trunc, profile)
    if profile.family is Family.TEMPLATE_RERANKER:
        return recount_template(tok, queries, documents, trunc, profile, kwargs)
    assert profile.family is Family.JINA_V3
    return recount_listwise(tok, queries, documents, trunc, profile, kwargs)


def derive_engine(
    reported: int, pairing: Pairing, n_documents: int, query_length: int, has_pad: bool
) -> int:
    """Engine count recovered from a pre-fix bi-encoder report, knowing only Q and p.

    ``E = R - (N-1)*Q - N*p`` (1:N), ``R - N*p`` (N:N), ``R - p`` (1:1). Works when the
    documents are images, since their lengths cancel out.
    """
    pad = int(has_pad)
    if pairing is Pairing.ONE_TO_N:
        return reported - (n_documents - 1) * query_length - n_documents * pad
    if pairing is Pairing.N_TO_N:
        return reported - n_documents * pad
    return reported - pad


def _all_text(items: Sequence[object]) -> bool:
    """Every item is a text (not an image or other content part)."""
    return all(map(str.__instancecheck__, items))


@dataclass(frozen=True, slots=True)
class Counted:
    """What the proxy could count for one request before seeing the upstream's answer."""

    recount: Recount | None
    query_length: int | None


def count_request(
    tok: Tokenizer,
    queries: Sequence[object],
    documents: Sequence[object],
    trunc: Truncation,
    profile: EngineProfile,
    *,
    full: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Counted:
    """Full recount when every input is text; else the single query's length, if text.

    The query length alone is what the derivation path needs (images as documents, or
    ``full=False`` when only a sample of requests is recounted).
    """
    if full and _all_text(queries) and _all_text(documents):
        texts_q, texts_d = cast(Sequence[str], queries), cast(Sequence[str], documents)
        counted = recount(tok, texts_q, texts_d, trunc, profile, template_kwargs)
        query = counted.query_lengths[0] if len(counted.query_lengths) == 1 else None
        return Counted(counted, query)
    separate = profile.family in (Family.BI_ENCODER, Family.LATE_INTERACTION)
    if separate and len(queries) == 1 and isinstance(queries[0], str):
        cut = _cut_all(
            tok,
            [queries[0]],
            trunc.max_tokens_per_query,
            iterative=profile.release.iterative_text_cut,
        )
        return Counted(None, single_lengths(tok, cut, trunc, profile.max_model_len)[0])
    return Counted(None, None)

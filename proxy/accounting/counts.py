"""Engine-level token accounting for vLLM scoring requests (spec sections 4 and 5).

Pure functions: no I/O, no asyncio. Every count here reproduces what vLLM's renderer feeds
the engine for one request, input by input, including its truncation and padding rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from proxy.accounting.types import EngineProfile, Family, Pairing, Tokenizer, Truncation

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
) -> int:
    """Engine length of one cross-encoder input ``tok(text=query, text_pair=document)``."""
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
        doc_limit = (
            len(tok.content_offsets(query))
            + trunc.max_tokens_per_doc
            + tok.num_special_tokens_pair()
        )
        max_length = doc_limit if max_length is None else min(doc_limit, max_length)
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
    paired = list(queries) * len(documents) if len(queries) == 1 else list(queries)
    lengths = tuple(
        pair_length(tok, q, d, trunc, profile.max_model_len, iterative=iterative)
        for q, d in zip(paired, documents, strict=True)
    )
    engine = sum(lengths)
    return Recount(engine, engine, (), lengths)


def recount(
    tok: Tokenizer,
    queries: Sequence[str],
    documents: Sequence[str],
    trunc: Truncation,
    profile: EngineProfile,
) -> Recount | None:
    """Full recount for the families whose engine inputs we can rebuild; else None."""
    if profile.family in (Family.BI_ENCODER, Family.LATE_INTERACTION):
        return recount_separate(tok, queries, documents, trunc, profile)
    if profile.family is Family.CROSS_ENCODER:
        return recount_pairs(tok, queries, documents, trunc, profile)
    return None


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
) -> Counted:
    """Full recount when every input is text; else the single query's length, if text.

    The query length alone is what the derivation path needs (images as documents, or
    ``full=False`` when only a sample of requests is recounted).
    """
    if full and _all_text(queries) and _all_text(documents):
        texts_q, texts_d = cast(Sequence[str], queries), cast(Sequence[str], documents)
        counted = recount(tok, texts_q, texts_d, trunc, profile)
        if counted is not None:
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

"""What the proxy understands of a scoring request before vLLM answers: parsing, limits,
counting (run in a tokenizer thread) and the verdict once the reported count is known.

No aiohttp here; the handler in ``proxy.serving.audited`` runs these off the event loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.accounting.counts import Counted, count_request
from proxy.accounting.shapes import ScoringRequest, endpoint_for_path, parse_scoring_request
from proxy.accounting.types import (
    EngineProfile,
    NotCached,
    ServedModel,
    Tokenizer,
    Uncountable,
)
from proxy.accounting.verdicts import Audit, invalid, judge, unaudited
from proxy.wire.jsonio import loads

# The served model a request names (None: the upstream serves no such model).
Lookup = Callable[[str | None], ServedModel | None]
# The tokenizer to count with for a model's tokenizer: a worker thread's own copy, or a
# view of the count cache alone that raises NotCached instead of tokenizing.
CountWith = Callable[[Tokenizer], Tokenizer]
# Whether a request for this model is recounted in full (else only its query is counted).
RecountInFull = Callable[[ServedModel], bool]


@dataclass(frozen=True, slots=True)
class Analysis:
    """The request as the proxy understood it, before the upstream answered."""

    request: ScoringRequest | None
    model: ServedModel | None
    counted: Counted | None
    problem: str | None = None
    accounting_ms: float = 0.0


def wants_full_recount(recount_fraction: float) -> bool:
    """Whether this request is drawn for a full recount; otherwise only its query is
    counted (the derivation path), as ``--recount-fraction`` asks."""
    return recount_fraction >= 1.0 or random.random() < recount_fraction


def in_full(sampled: bool, trusted: Callable[[ServedModel], bool]) -> RecountInFull:
    """A request is recounted in full when drawn for it, or when its model is not yet
    trusted with the derivation (``proxy.accounting.proof``)."""
    if sampled:
        return _always
    return lambda model: not trusted(model)


def _always(model: ServedModel) -> bool:
    return True


def analyse(
    body: bytes, path: str, lookup: Lookup, count_with: CountWith, full: RecountInFull = _always
) -> Analysis:
    """Parse and count one request body (runs in a tokenizer thread), timed."""
    started = time.perf_counter()
    found = _understand(body, path, lookup)
    if isinstance(found, Countable):
        found = _count(found, count_with(found.tokenizer), full)
    return _timed(found, started)


def _timed(found: Analysis, started: float) -> Analysis:
    """``found`` with the time its analysis took since ``started`` (built directly:
    ``dataclasses.replace`` introspects the fields on every call)."""
    ms = (time.perf_counter() - started) * 1000
    return Analysis(found.request, found.model, found.counted, found.problem, ms)


# Inline analysis hashes each text for its cache lookup on the event loop: past this many
# texts a small body still goes to the pool.
INLINE_MAX_TEXTS = 256


def analyse_cached(
    body: bytes, path: str, lookup: Lookup, cached: CountWith, full: RecountInFull
) -> Analysis | None:
    """``analyse`` with ``cached`` counts alone, or None when a count it needs is not
    cached. Never tokenizes: small bodies whose texts were all seen before (the common
    reranking case) are judged without a hop to a tokenizer thread."""
    started = time.perf_counter()
    found = _understand(body, path, lookup)
    if isinstance(found, Countable):
        texts = len(found.request.queries) + len(found.request.documents)
        if texts > INLINE_MAX_TEXTS:
            return None
        try:
            found = _count(found, cached(found.tokenizer), full)
        except NotCached:
            return None
    return _timed(found, started)


@dataclass(frozen=True, slots=True)
class Countable:
    """A request the proxy can count: its model has a profile and a tokenizer."""

    request: ScoringRequest
    model: ServedModel
    profile: EngineProfile
    tokenizer: Tokenizer


def _understand(body: bytes, path: str, lookup: Lookup) -> Analysis | Countable:
    """The request and its model, or the Analysis saying why it cannot be counted."""
    try:
        payload = loads(body)
    except (ValueError, UnicodeDecodeError):
        return Analysis(None, None, None, "body is not JSON")
    request = parse_scoring_request(endpoint_for_path(path) or "", payload)
    if request is None:
        return Analysis(None, None, None, "not a score or rerank request")
    model = lookup(request.model)
    if model is None:
        return Analysis(request, None, None, f"unknown model {request.model!r}")
    if model.profile is None or model.tokenizer is None:
        return Analysis(request, model, None, model.problem or "the server scores no text with it")
    if request.pairing is None:
        return Analysis(request, model, None, "invalid pairing")
    return Countable(request, model, model.profile, model.tokenizer)


def understand(body: bytes, path: str, lookup: Lookup) -> Analysis:
    """The request and its model, not counted: what admission prices at its bound when
    the count did not come in time."""
    found = _understand(body, path, lookup)
    if isinstance(found, Countable):
        return Analysis(found.request, found.model, None, "not counted before forwarding")
    return found


def _count(found: Countable, tok: Tokenizer, full: RecountInFull) -> Analysis:
    """Count in full when ``full`` says so for the model, falling back to the query alone
    when a text is beyond the tokenizer's memory bound."""
    request, profile = found.request, found.profile
    problem = None
    for attempt in (True, False) if full(found.model) else (False,):
        try:
            counted = count_request(
                tok,
                request.queries,
                request.documents,
                profile.release.applied(request.truncation),
                profile,
                full=attempt,
                template_kwargs=request.template_kwargs,
            )
        except Uncountable as exc:  # memory bound: fall back to the query-only derivation
            problem = f"not counted: {exc}"
            continue
        return Analysis(request, found.model, counted, problem)
    return Analysis(request, found.model, None, problem)


# The shortest JSON list item is 3 bytes (`"",`): smaller bodies cannot pass the limit, so
# only large bodies are parsed before forwarding.
MIN_BYTES_PER_ITEM = 3


def over_limit(body: bytes, path: str, limit: int) -> str | None:
    """A refusal message when the request holds more than ``limit`` queries or documents."""
    try:
        payload = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    request = parse_scoring_request(endpoint_for_path(path) or "", payload)
    if request is None:
        return None
    count = max(len(request.queries), len(request.documents))
    if count > limit:
        return (
            f"{count} inputs in one request; this proxy accepts at most {limit} (--max-documents)"
        )
    return None


def decide(
    analysis: Analysis,
    reported: int | None,
    problem: str | None = None,
    trusted: Callable[[ServedModel], bool] = lambda model: False,
) -> Audit:
    """Verdict for a successful response that reported ``reported`` prompt tokens
    (``problem``: why its usage is not a valid count). A request that was not recounted in
    full is judged by a shortcut only when ``trusted`` says its model has been proven."""
    if problem is not None or reported is None:
        return invalid(problem or "usage has no prompt_tokens")
    request, model, counted = analysis.request, analysis.model, analysis.counted
    if request is None or model is None or model.profile is None or counted is None:
        return unaudited(analysis.problem or "not counted", reported)
    assert request.pairing is not None
    if counted.recount is None and not trusted(model):
        reason = analysis.problem or "not recounted in full"
        return unaudited(f"{reason}; no shortcut before full recounts proved the model", reported)
    return judge(reported, counted, model.profile, request.pairing, len(request.documents))

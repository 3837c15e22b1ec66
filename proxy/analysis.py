"""What the proxy understands of a scoring request before vLLM answers: parsing, limits,
counting (run in a tokenizer thread) and the verdict once the reported count is known.

No aiohttp here; the handler in ``proxy.audit`` runs these off the event loop.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, replace

from proxy.accounting import Counted, count_request
from proxy.catalog import Catalog, ServedModel
from proxy.reconcile import Audit, invalid, judge, unaudited
from proxy.shapes import ScoringRequest, endpoint_for_path, parse_scoring_request
from proxy.tokenizer import TokenizerPool, Uncountable


@dataclass(frozen=True, slots=True)
class Analysis:
    """The request as the proxy understood it, before the upstream answered."""

    request: ScoringRequest | None
    model: ServedModel | None
    counted: Counted | None
    problem: str | None = None
    accounting_ms: float = 0.0


def analyse(
    body: bytes, path: str, catalog: Catalog, pool: TokenizerPool, recount_fraction: float = 1.0
) -> Analysis:
    """Parse and count one request body (runs in a tokenizer thread), timed.

    With ``recount_fraction`` < 1, other requests only count the query (derivation path).
    """
    started = time.perf_counter()
    analysis = _analyse(body, path, catalog, pool, recount_fraction)
    return replace(analysis, accounting_ms=(time.perf_counter() - started) * 1000)


def _analyse(
    body: bytes, path: str, catalog: Catalog, pool: TokenizerPool, recount_fraction: float
) -> Analysis:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Analysis(None, None, None, "body is not JSON")
    request = parse_scoring_request(endpoint_for_path(path) or "", payload)
    if request is None:
        return Analysis(None, None, None, "not a score or rerank request")
    model = catalog.lookup(request.model)
    if model is None:
        return Analysis(request, None, None, f"unknown model {request.model!r}")
    if model.profile is None or model.tokenizer is None:
        return Analysis(request, model, None, model.problem)
    if request.pairing is None:
        return Analysis(request, model, None, "invalid pairing")
    tok = pool.local_copy(model.tokenizer)
    full = recount_fraction >= 1.0 or random.random() < recount_fraction
    for attempt in (full, False) if full else (False,):
        try:
            counted = count_request(
                tok,
                request.queries,
                request.documents,
                model.profile.release.applied(request.truncation),
                model.profile,
                full=attempt,
            )
        except Uncountable as exc:  # memory bound: fall back to the query-only derivation
            problem = f"not counted: {exc}"
            continue
        return Analysis(request, model, counted)
    return Analysis(request, model, None, problem)


# The shortest JSON list item is 3 bytes (`"",`): smaller bodies cannot pass the limit, so
# only large bodies are parsed before forwarding.
MIN_BYTES_PER_ITEM = 3


def over_limit(body: bytes, path: str, limit: int) -> str | None:
    """A refusal message when the request holds more than ``limit`` queries or documents."""
    try:
        payload = json.loads(body)
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


def decide(analysis: Analysis, reported: int | None, problem: str | None = None) -> Audit:
    """Verdict for a successful response that reported ``reported`` prompt tokens
    (``problem``: why its usage is not a valid count)."""
    if problem is not None or reported is None:
        return invalid(problem or "usage has no prompt_tokens")
    request, model, counted = analysis.request, analysis.model, analysis.counted
    if request is None or model is None or model.profile is None or counted is None:
        return unaudited(analysis.problem or "not counted", reported)
    assert request.pairing is not None
    return judge(reported, counted, model.profile, request.pairing, len(request.documents))

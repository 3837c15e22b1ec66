"""Reconciliation: compare what the upstream reported with what its engine processed.

Only a proven correction changes a number: the reported count must equal exactly the
pre-fix inflation predicted from our own counts (or, for documents we cannot read, the
release must be known to carry the bug and the derived count must be plausible).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.accounting.counts import Counted, derive_engine
from proxy.accounting.types import EngineProfile, Family, Method, Pairing, Verdict


@dataclass(frozen=True, slots=True)
class Audit:
    """The verdict on one response, and the prompt-token count to bill."""

    verdict: Verdict
    method: Method
    reported: int | None
    engine: int | None
    reason: str | None = None

    @property
    def billed(self) -> int | None:
        """Engine count when proven (exact/corrected), otherwise what the upstream said."""
        if self.verdict in (Verdict.EXACT, Verdict.CORRECTED):
            return self.engine
        return self.reported

    @property
    def over_reported(self) -> int:
        if self.verdict is Verdict.CORRECTED and self.reported is not None and self.engine:
            return self.reported - self.engine
        return 0


def unaudited(reason: str, reported: int | None = None) -> Audit:
    return Audit(Verdict.UNAUDITED, Method.NONE, reported, None, reason)


def invalid(reason: str) -> Audit:
    """Usage that is no token count: nothing is billed, the record and a metric flag it."""
    return Audit(Verdict.INVALID, Method.NONE, None, None, reason)


def judge(
    reported: int,
    counted: Counted,
    profile: EngineProfile,
    pairing: Pairing,
    n_documents: int,
) -> Audit:
    """Decide the verdict for a successful scoring response that reported ``reported``."""
    full = counted.recount
    if full is not None:
        if reported == full.engine:
            return Audit(Verdict.EXACT, Method.RECOUNT, reported, full.engine)
        if reported == full.prefix_reported:
            return Audit(Verdict.CORRECTED, Method.RECOUNT, reported, full.engine)
        reason = f"reported {reported}, engine {full.engine}, pre-fix {full.prefix_reported}"
        return Audit(Verdict.MISMATCH, Method.RECOUNT, reported, full.engine, reason)
    if profile.family is Family.TEMPLATE_RERANKER:
        return Audit(Verdict.EXACT, Method.FORMULA, reported, reported)
    if profile.family is Family.JINA_V3:
        return _judge_listwise(reported, profile, pairing, n_documents)
    if profile.family is Family.CROSS_ENCODER:
        return Audit(Verdict.EXACT, Method.FORMULA, reported, reported)
    return _judge_derived(reported, counted.query_length, profile, pairing, n_documents)


def _judge_listwise(
    reported: int, profile: EngineProfile, pairing: Pairing, n_documents: int
) -> Audit:
    """jina-reranker-v3: one prompt for 1:N, reported N times before 0.30."""
    fixed = profile.release.reports_engine_usage
    if pairing is not Pairing.ONE_TO_N or fixed:
        return Audit(Verdict.EXACT, Method.FORMULA, reported, reported)
    if fixed is None:
        return unaudited("upstream version unknown", reported)
    if reported % n_documents:
        reason = f"reported {reported} is not a multiple of {n_documents} documents"
        return Audit(Verdict.MISMATCH, Method.FORMULA, reported, None, reason)
    return Audit(Verdict.CORRECTED, Method.FORMULA, reported, reported // n_documents)


def _judge_derived(
    reported: int,
    query_length: int | None,
    profile: EngineProfile,
    pairing: Pairing,
    n_documents: int,
) -> Audit:
    """Bi-encoder inputs we cannot all read (e.g. image documents): trust the release."""
    if query_length is None and pairing is not Pairing.N_TO_N:
        return unaudited("query is not text", reported)
    fixed = profile.release.reports_engine_usage
    if fixed is None:
        return unaudited("upstream version unknown", reported)
    if fixed:
        return Audit(Verdict.EXACT, Method.FORMULA, reported, reported)
    q = query_length or 0
    engine = derive_engine(reported, pairing, n_documents, q, profile.has_pad_token)
    # Every document is at least one engine token; anything less disproves the derivation.
    floor = (q if pairing is not Pairing.N_TO_N else 0) + n_documents
    if engine < floor:
        reason = f"derived {engine} below the floor {floor}"
        return Audit(Verdict.MISMATCH, Method.DERIVED, reported, engine, reason)
    return Audit(Verdict.CORRECTED, Method.DERIVED, reported, engine)

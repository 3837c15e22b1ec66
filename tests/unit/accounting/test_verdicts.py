"""Verdicts: only a proven correction changes a number."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.accounting.counts import Counted, Recount
from proxy.accounting.types import Family, Method, Pairing, Verdict
from proxy.accounting.verdicts import judge
from tests.support.profiles import profile

FULL = Counted(Recount(36, 57, (9,), (9, 11, 7)), 9)


@pytest.mark.parametrize(
    ("reported", "verdict", "billed"),
    [(36, Verdict.EXACT, 36), (57, Verdict.CORRECTED, 36), (40, Verdict.MISMATCH, 40)],
)
def test_recount_verdicts(reported: int, verdict: Verdict, billed: int) -> None:
    """R == E: exact; R == predicted pre-fix R: corrected; else mismatch and keep R."""
    audit = judge(reported, FULL, profile(), Pairing.ONE_TO_N, 3)
    assert (audit.verdict, audit.billed, audit.method) == (verdict, billed, Method.RECOUNT)


@pytest.mark.parametrize(
    ("version", "reported", "verdict", "engine"),
    [
        ("0.29.0", 57, Verdict.CORRECTED, 36),
        ("0.32.0", 36, Verdict.EXACT, 36),
        (None, 57, Verdict.UNAUDITED, None),
        ("0.29.0", 10, Verdict.MISMATCH, -11),
    ],
)
def test_derivation_for_unreadable_documents(
    version: str | None, reported: int, verdict: Verdict, engine: int | None
) -> None:
    """Image documents: E = R - (N-1)Q - Np on a known pre-fix release, else R or nothing."""
    counted = Counted(None, 9)
    audit = judge(reported, counted, profile(version=version), Pairing.ONE_TO_N, 3)
    assert (audit.verdict, audit.engine) == (verdict, engine)


def test_multimodal_query_is_unaudited() -> None:
    """Without a query length nothing can be derived."""
    audit = judge(57, Counted(None, None), profile(), Pairing.ONE_TO_N, 3)
    assert audit.verdict is Verdict.UNAUDITED
    assert audit.billed == 57


@pytest.mark.parametrize(
    ("version", "pairing", "reported", "verdict", "engine"),
    [
        ("0.29.0", Pairing.ONE_TO_N, 300, Verdict.CORRECTED, 100),
        ("0.29.0", Pairing.ONE_TO_N, 301, Verdict.MISMATCH, None),
        ("0.29.0", Pairing.N_TO_N, 300, Verdict.EXACT, 300),
        ("0.32.0", Pairing.ONE_TO_N, 100, Verdict.EXACT, 100),
        (None, Pairing.ONE_TO_N, 300, Verdict.UNAUDITED, None),
    ],
)
def test_jina_listwise_formula(
    version: str | None, pairing: Pairing, reported: int, verdict: Verdict, engine: int | None
) -> None:
    """jina-reranker-v3 1:N before 0.30 reports the one prompt N times."""
    audit = judge(reported, Counted(None, None), profile(Family.JINA_V3, version), pairing, 3)
    assert (audit.verdict, audit.engine) == (verdict, engine)


def test_template_reranker_is_exact_by_formula() -> None:
    """LLM rerankers are cross-encoders: always reported right."""
    audit = judge(80, Counted(None, None), profile(Family.TEMPLATE_RERANKER), Pairing.ONE_TO_N, 4)
    assert (audit.verdict, audit.method, audit.billed) == (Verdict.EXACT, Method.FORMULA, 80)


@given(
    q=st.integers(1, 300),
    docs=st.lists(st.integers(1, 300), min_size=1, max_size=20),
    pad=st.booleans(),
)
def test_corrected_only_when_inflation_is_exact(q: int, docs: list[int], pad: bool) -> None:
    """Property: the pre-fix report is corrected to E; any other R != E is a mismatch."""
    n = len(docs)
    engine = q + sum(docs)
    inflated = n * q + n * int(pad) + sum(docs)
    counted = Counted(Recount(engine, inflated, (q,), tuple(docs)), q)
    pairing = Pairing.ONE_TO_ONE if n == 1 else Pairing.ONE_TO_N
    audit = judge(inflated, counted, profile(pad=pad), pairing, n)
    assert audit.billed == engine
    assert audit.over_reported == inflated - engine
    again = judge(audit.billed, counted, profile(pad=pad), pairing, n)
    assert again.verdict is Verdict.EXACT
    assert again.billed == engine
    off = judge(inflated + 1, counted, profile(pad=pad), pairing, n)
    assert off.verdict is Verdict.MISMATCH
    assert off.billed == inflated + 1

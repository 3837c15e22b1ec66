"""Money budgets against the price table: every model one applies to must be priced;
a reservation is the dearest its tokens can cost; a bill is the record at its time."""

from __future__ import annotations

from datetime import UTC, datetime

from proxy.accounting.pricefile import PriceFile
from proxy.accounting.prices import PriceTable, Quantities
from proxy.limits.costs import billed, reserved, unpriced
from proxy.limits.limiter import Cost
from proxy.limits.policy import Policies

NOW = datetime(2026, 11, 20, tzinfo=UTC)
CHANGE = datetime(2026, 11, 15, tzinfo=UTC)


def table(default: bool = False) -> PriceTable:
    data: dict[str, object] = {
        "currency": "USD",
        "models": {
            "chat": [
                {
                    "from": "2026-01-01",
                    "prompt_tokens": "0.000001",
                    "completion_tokens": "0.000002",
                },
                {
                    "from": CHANGE.isoformat(),
                    "prompt_tokens": "0.000003",
                    "completion_tokens": "0.000004",
                },
            ],
            "later": {"from": "2027-01-01", "prompt_tokens": "1"},
        },
    }
    if default:
        data["default"] = {"prompt_tokens": "0.0000001"}
    return PriceFile.model_validate(data).table()


def test_every_model_a_money_budget_applies_to_needs_a_price() -> None:
    """A tenant-wide budget needs every served and named model priced now (a price that
    starts later is none); a model's budget only that model; no budget, nothing."""
    tenant_wide = Policies.model_validate({"tenants": {"a": {"cost_per_month": "10"}}})
    problem = unpriced(tenant_wide, table(), ["chat", "rerank", "later"], NOW)
    assert problem is not None
    assert "'later', 'rerank'" in problem
    assert "\n" not in problem
    assert unpriced(tenant_wide, table(default=True), ["chat", "rerank"], NOW) is None
    assert "need a price file" in (unpriced(tenant_wide, None, [], NOW) or "")
    one = Policies.model_validate({"tenants": {"a": {"models": {"chat": {"cost_per_day": "1"}}}}})
    assert unpriced(one, table(), ["rerank"], NOW) is None
    tokens = Policies.model_validate({"tenants": {"a": {"total_tokens_per_day": 5}}})
    assert unpriced(tokens, None, ["rerank"], NOW) is None


def test_a_missing_price_is_the_same_sentence_until_what_is_missing_changes() -> None:
    """Issue #59 item 1: the sentence held the time to the second, so the watch, which
    logs it when it changes, logged `prices_missing` every 2 s for ever. The same models
    missing an hour apart are the same sentence; another model missing is another."""
    tenant_wide = Policies.model_validate({"tenants": {"a": {"cost_per_month": "10"}}})
    first = unpriced(tenant_wide, table(), ["rerank"], NOW)
    assert first is not None
    assert unpriced(tenant_wide, table(), ["rerank"], NOW.replace(hour=1)) == first
    assert unpriced(tenant_wide, table(), ["rerank", "embed"], NOW) != first


def test_a_reservation_is_priced_at_its_time() -> None:
    """Its tokens at the price in force when it is made; no price then: None."""
    before = reserved(Cost(10, 5), table(), "chat", datetime(2026, 11, 1, tzinfo=UTC))
    after = reserved(Cost(10, 5), table(), "chat", NOW)
    assert before == Cost(10, 5, money=20_000)
    assert after == Cost(10, 5, money=50_000)
    assert reserved(Cost(10, 5), table(), "rerank", NOW) is None


def test_a_bill_is_the_record_at_its_time_and_never_less_than_known() -> None:
    """Priced in full: exact; a unit without a price: what was reserved, or the priced
    units when they cost more; no price at its time: what was reserved."""
    q = Quantities(prompt_tokens=10, completion_tokens=5)
    assert billed(table(), "chat", q, NOW, 99) == (50_000, True)
    audio = Quantities(prompt_tokens=10, audio_seconds=3)
    assert billed(table(), "chat", audio, NOW, 99) == (30_000, False)
    assert billed(table(), "chat", audio, NOW, 40_000) == (40_000, False)
    assert billed(table(), "rerank", q, NOW, 7) == (7, False)
    assert billed(table(), "chat", q, CHANGE, 0)[0] == 50_000  # the new price, from its instant

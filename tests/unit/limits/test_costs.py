"""Money budgets against the price table: every model one applies to must be priced;
a reservation is the dearest its tokens can cost; a bill is the record at its time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from proxy.accounting.price_schedule import PriceFile
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities
from proxy.limits.costs import Unpriced, billed, reserved, unpriced
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
    assert isinstance(reserved(Cost(10, 5), table(), "rerank", NOW), Unpriced)


def test_a_reservation_is_priced_at_the_dearest_price_before_its_timeout() -> None:
    """Reserved just before a price change, a request whose record may be made after it
    is priced at the dearer of the two (the record is priced at its own time); a stretch
    of its time without a price refuses it."""
    just_before = CHANGE - timedelta(seconds=1)
    assert reserved(Cost(10, 5), table(), "chat", just_before) == Cost(10, 5, money=20_000)
    spans = reserved(Cost(10, 5), table(), "chat", just_before, within=timedelta(seconds=600))
    assert spans == Cost(10, 5, money=50_000)
    until = {"until": "2026-11-20T00:10:00Z", "prompt_tokens": "1"}
    ends = PriceFile.model_validate({"currency": "USD", "models": {"chat": until}}).table()
    assert isinstance(reserved(Cost(1), ends, "chat", NOW, within=timedelta(hours=1)), Unpriced)
    assert reserved(Cost(1), ends, "chat", NOW, within=timedelta(minutes=5)) == Cost(1, money=10**9)


def test_a_unit_without_a_price_refuses_the_reservation() -> None:
    """Audio seconds on a model priced in tokens (or completion tokens on one priced for
    prompts alone) are refused, naming the unit, never reserved at zero."""
    seconds = Quantities(audio_seconds=60)
    found = reserved(Cost(10, 5), table(), "chat", NOW, units=seconds)
    assert isinstance(found, Unpriced)
    assert "audio_seconds" in found.why
    found = reserved(Cost(10, 5), table(), "later", datetime(2027, 2, 1, tzinfo=UTC))
    assert isinstance(found, Unpriced)
    assert "completion_tokens" in found.why


def test_a_gap_between_prices_of_a_budgeted_model_is_refused() -> None:
    """One price's ``until`` before the next one's ``from``: a money budget cannot be
    used with it (its requests then would be billed at no price); a gap in the past, or
    a model no budget applies to, is no problem."""
    data = {
        "currency": "USD",
        "models": {
            "chat": [
                {"from": "2026-01-01", "until": "2026-12-01", "prompt_tokens": "1"},
                {"from": "2026-12-02", "prompt_tokens": "2"},
            ]
        },
    }
    gapped = PriceFile.model_validate(data).table()
    tenant_wide = Policies.model_validate({"tenants": {"a": {"cost_per_month": "10"}}})
    problem = unpriced(tenant_wide, gapped, ["chat"], NOW)
    assert problem is not None
    assert "from 2026-12-01T00:00:00+00:00 to 2026-12-02T00:00:00+00:00" in problem
    assert unpriced(tenant_wide, gapped, ["chat"], datetime(2026, 12, 3, tzinfo=UTC)) is None
    tokens = Policies.model_validate({"tenants": {"a": {"total_tokens_per_day": 5}}})
    assert unpriced(tokens, gapped, ["chat"], NOW) is None


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

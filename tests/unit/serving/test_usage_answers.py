"""The figures the usage and admin APIs answer (``usage_answers``): the default range is
the current month in the limits file's zone, a time without an offset is read in it, a
range's usage is the report's aggregate priced by the report's charges, and a record is
answered with its amount, or not at all to another tenant."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from proxy.accounting.price_schedule import load_prices
from proxy.ledger.lookup import RecordSource
from proxy.ledger.records import UsageRecord
from proxy.ledger.sqlite import as_row, create_schema
from proxy.limits.periods import period
from proxy.limits.policy import Policies, Window
from proxy.limitstore.memory import InProcessLimiter
from proxy.serving.usage_answers import READS, BadRange, Figures, record_json
from tests.support.records import make_record

PARIS = Policies.model_validate(
    {"timezone": "Europe/Paris", "tenants": {"acme": {"concurrency": 1}}}
)


def figures(tmp: Path, made: list[UsageRecord], priced: bool = True) -> Figures:
    db = sqlite3.connect(tmp / "j.sqlite")
    create_schema(db)
    db.executemany(
        "INSERT INTO records(record_id, time, tenant, body, kind) VALUES (?,?,?,?,?)",
        [as_row(r) for r in made],
    )
    db.commit()
    db.close()
    prices = tmp / "prices.yaml"
    prices.write_text("currency: EUR\nmodels:\n  minilm:\n    prompt_tokens: '0.001'\n")
    table = load_prices(prices) if priced else None
    limiter = InProcessLimiter(PARIS)
    return Figures(lambda: limiter, lambda: table, RecordSource(None, tmp / "j.sqlite"))


def test_the_default_range_is_this_month_in_the_limits_zone(tmp_path: Path) -> None:
    """No since/until: the current calendar month of Europe/Paris, as UTC instants; a
    time without an offset is Paris time; a time that is none is refused."""
    bounds = figures(tmp_path, []).bounds(None, None)
    start, end = period(Window.MONTH, time.time(), ZoneInfo("Europe/Paris"))
    assert bounds == (
        datetime.fromtimestamp(start, UTC).isoformat(),
        datetime.fromtimestamp(end, UTC).isoformat(),
    )
    low, _ = figures(tmp_path, []).bounds("2026-07-01T00:00:00", None)
    assert low == "2026-06-30T22:00:00+00:00"
    with pytest.raises(BadRange):
        figures(tmp_path, []).bounds("last tuesday", None)


async def test_usage_is_the_reports_aggregate_and_charges(tmp_path: Path) -> None:
    """Per model and operation the billed tokens and their amount; another tenant's
    records are not in it; the source is named."""
    now = datetime.now(UTC) - timedelta(seconds=1)
    made = [make_record(i, t).model_copy(update={"time": now}) for i, t in enumerate("aab")]
    made = [r.model_copy(update={"tenant": "acme" if r.tenant == "a" else "beta"}) for r in made]
    answers = figures(tmp_path, made)
    since, until = answers.bounds(None, None)
    usage = await answers.usage("acme", since, until)
    assert usage["rows"] == [
        {
            "model": "minilm",
            "operation": "rerank",
            "requests": 2,
            "prompt_tokens": 72,
            "cached_prompt_tokens": 0,
            "completion_tokens": 0,
            "audio_seconds": 0,
            "amount": "0.072",
            "unpriced_requests": 0,
        }
    ]
    assert (usage["amount"], usage["due"], usage["currency"]) == ("0.072", "0.07", "EUR")
    assert usage["source"] == "journal"


async def test_a_record_is_answered_to_its_own_tenant_only(tmp_path: Path) -> None:
    """Its own tenant (or an operator: no tenant) reads it; another tenant reads nothing,
    as for an id that does not exist."""
    record = make_record(1)
    answers = figures(tmp_path, [record])
    assert await answers.record("beta", record.record_id) is None
    assert await answers.record("acme", "no-such-id") is None
    mine = await answers.record("acme", record.record_id)
    assert mine is not None
    assert mine["record"] == record_json(record, load_prices(tmp_path / "prices.yaml"))
    assert await answers.record(None, record.record_id) == mine


def test_a_record_states_reported_billed_units_and_amount() -> None:
    """What vLLM reported against what is billed, the units, and the amount at the
    record's price; without prices no amount."""
    record = make_record(1, reported=57, billed=36)
    body = record_json(record, None)
    assert body["reported"] == {"prompt_tokens": 57, "completion_tokens": None}
    assert body["billed"] == {"prompt_tokens": 36, "completion_tokens": None}
    assert body["units"] == {"prompt_tokens": 36}
    assert body["verdict"] == "corrected"
    assert "amount" not in body


async def test_questions_read_in_a_bounded_number_of_threads(tmp_path: Path) -> None:
    """Many questions at once read records in at most ``READS`` worker threads, so they
    never hold every thread the default executor also parses bodies in."""
    answers = figures(tmp_path, [])
    lock, running, most = threading.Lock(), [0], [0]

    def read() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    await asyncio.gather(*(answers.off_loop(read) for _ in range(8)))
    assert most[0] == READS

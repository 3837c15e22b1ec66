"""The figures the usage and admin APIs answer (``usage_answers``): the default range is
the current month in the limits file's zone, a time without an offset is read in it, a
range's usage is the report's aggregate priced by the report's charges, and a record is
answered with its amount, or not at all to another tenant."""

from __future__ import annotations

import socket
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from proxy.accounting.price_schedule import load_prices
from proxy.ledger.lookup import RecordSource
from proxy.ledger.questions import ReadFailed
from proxy.ledger.records import UsageRecord
from proxy.ledger.sqlite import as_row, create_schema
from proxy.limits.periods import period
from proxy.limits.policy import Policies, Window
from proxy.limitstore.memory import InProcessLimiter
from proxy.serving.usage_answers import BadRange, Figures, record_json
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


async def test_records_are_parsed_outside_the_proxys_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range's records are read, parsed and summed in a reading process, never in the
    proxy's: parsing holds the GIL, and in a thread of the proxy a tenant asking for its
    usage since 2000 in a loop slowed every other tenant's requests (review of #62).
    The proxy's own process parses none of the 300 records, and the answer counts them
    all; a page and a record are read there too."""
    now = datetime.now(UTC) - timedelta(seconds=1)
    made = [make_record(i).model_copy(update={"time": now}) for i in range(300)]
    answers = figures(tmp_path, made)
    parsed: list[int] = []
    original = UsageRecord.from_json.__func__  # type: ignore[attr-defined]

    def counted(cls: type[UsageRecord], text: str | bytes) -> UsageRecord:
        parsed.append(1)
        return original(cls, text)  # type: ignore[no-any-return]

    monkeypatch.setattr(UsageRecord, "from_json", classmethod(counted))
    try:
        since, until = answers.bounds(None, None)
        usage = await answers.usage("acme", since, until)
        page = await answers.page(since, until, None, None, 10)
        mine = await answers.record("acme", made[0].record_id)
    finally:
        answers.readers.close()
    assert parsed == []
    assert [row["requests"] for row in usage["rows"]] == [300]  # type: ignore[index]
    assert len(page.lines.splitlines()) == 10
    assert page.more is not None
    assert mine is not None


@pytest.mark.parametrize(
    ("since", "until"),
    [
        ("9999-12-31T23:59:59-01:00", None),  # past the last instant a datetime holds
        ("0001-01-01T00:00:00+01:00", None),  # before the first
        ("0001-01-01", None),  # Paris's 1 January of year 1 is 31 December of year 0 in UTC
        (None, "9999-12-31T23:00:00-05:00"),
        ("2026-12-05", "2026-12-01"),  # a range that ends before it starts
        ("2026-12-01T00:00:00+00:00", "2026-12-01T01:00:00+01:00"),  # empty: one instant
    ],
)
def test_a_range_no_instant_can_be_in_is_a_bad_range(since: str | None, until: str | None) -> None:
    """A time out of what a datetime holds once in UTC was a 500 (``OverflowError``,
    ``ValueError`` past the parse), and since at or after until an empty 200 that reads
    as no usage; both are ``BadRange`` (400), said as such (review of #62)."""
    answers = Figures(lambda: InProcessLimiter(PARIS), lambda: None, RecordSource(None, None))
    with pytest.raises(BadRange):
        answers.bounds(since, until)


def _append(path: Path, made: list[UsageRecord]) -> None:
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO records(record_id, time, tenant, body, kind) VALUES (?,?,?,?,?)",
        [as_row(r) for r in made],
    )
    db.commit()
    db.close()


async def test_pages_skip_no_record_appended_meanwhile_out_of_time_order(tmp_path: Path) -> None:
    """A record is timed when it is built and journaled after (its exchange settles
    first), so records reach the journal a little out of time order. Paging by time, one
    appended meanwhile with a time before the last page's end was never in any page;
    paging in the journal's append order every record is in exactly one page (review of
    #62)."""
    start = datetime.now(UTC) - timedelta(minutes=10)
    at = [start + timedelta(minutes=m) for m in range(5)]
    x, b, c, a = (
        make_record(i).model_copy(update={"time": at[t]}) for i, t in enumerate((1, 3, 4, 2))
    )
    answers = figures(tmp_path, [x, b, c])
    since, until = answers.bounds(start.isoformat(), None)
    try:
        first = await answers.page(since, until, None, None, 2)
        _append(tmp_path / "j.sqlite", [a])  # built at minute 2, journaled after c
        pages, after = [first], first.more
        while after is not None:
            pages.append(await answers.page(since, until, None, after, 2))
            after = pages[-1].more
    finally:
        answers.readers.close()
    seen = [UsageRecord.from_json(line).record_id for p in pages for line in p.lines.splitlines()]
    assert sorted(seen) == sorted(r.record_id for r in (x, b, c, a))


async def test_a_ledger_that_cannot_be_reached_is_said_as_such(tmp_path: Path) -> None:
    """With the ledger down (nothing listens at its DSN), a range or a page is
    ``ReadFailed`` (the API's 503 in vLLM's shape), not the driver's own error (a 500
    in plain text before, review of #62)."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    source = RecordSource(f"postgresql://proxy@127.0.0.1:{port}/ledger", None)
    answers = Figures(lambda: None, lambda: None, source)
    since, until = answers.bounds(None, None)
    try:
        with pytest.raises(ReadFailed, match="cannot be read now"):
            await answers.usage("acme", since, until)
        with pytest.raises(ReadFailed):
            await answers.page(since, until, None, None, 10)
    finally:
        answers.readers.close()

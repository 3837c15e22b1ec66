"""usage-proxy report's choices (issue #54 items 1 and 2): dates read in the limits file's
zone, each budget in the period it is in now, and the records read where serve writes
them (the ledger, from the environment or the config file), the source said."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from proxy.cli import main
from proxy.ledger.journal import Journal
from proxy.ledger.records import UsageRecord
from proxy.ledger.shards import shard_path
from proxy.ledger.sinks.postgres import PostgresLedger
from proxy.reporting import instant, redacted
from tests.support.postgres import Cluster, fresh_database

PARIS = ZoneInfo("Europe/Paris")


def rec(i: int, tenant: str, when: datetime, billed: int) -> UsageRecord:
    return UsageRecord(
        client_request_id=f"r{i}",
        time=when.astimezone(UTC),  # as the proxy makes them
        tenant=tenant,
        model="minilm",
        endpoint="/v1/embeddings",
        operation="embeddings",
        prompt_tokens_reported=billed,
        prompt_tokens_billed=billed,
        verdict="reported",
        status=200,
        latency_ms=1.0,
        instance="t",
    )


async def journal_of(
    path: Path, records: list[UsageRecord], exporters: tuple[str, ...] = ()
) -> Path:
    journal = Journal(path)
    await journal.open()
    await journal.register(list(exporters))
    for r in records:
        await journal.append(r)
    await journal.close()
    return path


async def deliver(dsn: str, records: list[UsageRecord]) -> None:
    ledger = PostgresLedger(dsn)
    await ledger.deliver(records)
    await ledger.close()


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert main(["report", *args]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.fixture(autouse=True)
def _no_serve_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test sets the environment it means: none of the machine's USAGE_PROXY_*."""
    for name in ("LEDGER_DSN", "LIMITS", "JOURNAL", "CONFIG", "JOURNAL_RETENTION"):
        monkeypatch.delenv(f"USAGE_PROXY_{name}", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


LIMITS = "timezone: Europe/Paris\ntenants:\n  acme: {requests_per_month: 300}\n"


async def test_the_month_end_report_shows_the_month_in_the_limits_files_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #54 item 1: with ``timezone: Europe/Paris``, ``--since 2026-12-01 --until
    2027-01-01`` read the dates as UTC; the budget shown was the one holding 01:00 on
    1 January in Paris, January's, at 0 used, while acme had used 294 of December's 300.
    Dates are now read in the limits file's zone: December's budget, 294 used, and the
    report says which zone it read them in."""
    last_evening = datetime(2026, 12, 31, 23, 30, tzinfo=PARIS)  # 22:30 UTC
    records = [rec(i, "acme", last_evening - timedelta(days=i % 28), 1) for i in range(293)]
    records.append(rec(998, "acme", datetime(2026, 12, 1, 0, 30, tzinfo=PARIS), 1))  # UTC: Nov
    records.append(rec(999, "acme", datetime(2026, 11, 30, 12, tzinfo=PARIS), 1))
    path = await journal_of(tmp_path / "j.sqlite", records)
    limits = tmp_path / "limits.yaml"
    limits.write_text(LIMITS)
    args = ("--journal", str(path), "--limits", str(limits), "--format", "json")
    out, err = report(capsys, *args, "--since", "2026-12-01", "--until", "2027-01-01")
    data = json.loads(out)
    december = next(b for b in data["budgets"] if "report end" in b["holds"])
    assert (december["period_start"], december["period_end"]) == (
        "2026-12-01T00:00+01:00",
        "2027-01-01T00:00+01:00",
    )
    assert (december["used"], december["remaining"]) == (294, 6)
    assert data["totals"]["requests"] == 294  # November's is not December's
    assert (data["since"], data["timezone"]) == ("2026-12-01T00:00:00+01:00", "Europe/Paris")
    assert "dates read in Europe/Paris (the limits file's timezone)" in err
    utc = json.loads(report(capsys, *args, "--since", "2026-12-01", "--timezone", "UTC")[0])
    assert utc["totals"]["requests"] == 293  # 00:30 on 1 December in Paris is UTC's 30th
    table, _ = report(capsys, *args[:-1], "table", "--since", "2026-12-01")
    assert table.startswith("Usage (Europe/Paris) from 2026-12-01T00:00:00+01:00")


async def test_without_a_limits_file_dates_are_read_in_the_price_files_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59 item 6: without --limits the report read dates in UTC although the price
    file says its dates are Paris's: a record at 00:30 on 1 December in Paris fell out of
    December. The price file's timezone is used then (--timezone still wins)."""
    records = [rec(1, "acme", datetime(2026, 12, 1, 0, 30, tzinfo=PARIS), 5)]
    path = await journal_of(tmp_path / "j.sqlite", records)
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\ntimezone: Europe/Paris\ndefault: {prompt_tokens: '1'}\n")
    args = ("--journal", str(path), "--prices", str(prices), "--format", "json")
    out, err = report(capsys, *args, "--since", "2026-12-01", "--until", "2027-01-01")
    assert json.loads(out)["totals"]["requests"] == 1
    assert "dates read in Europe/Paris (the price file's timezone)" in err
    out, err = report(capsys, *args, "--since", "2026-12-01", "--timezone", "UTC")
    assert json.loads(out)["totals"]["requests"] == 0
    assert "dates read in UTC (--timezone)" in err


async def test_a_limits_file_without_a_zone_keeps_its_utc_before_the_price_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a limits file the report's zone is the one its budgets reset in, UTC when it
    names none, even beside a price file in Paris (docs/metering.md, "Dates and zones"):
    the budgets shown and the dates read agree, and the report says which zone it took."""
    path = await journal_of(tmp_path / "j.sqlite", [])
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\ntimezone: Europe/Paris\ndefault: {prompt_tokens: '1'}\n")
    limits = tmp_path / "limits.yaml"
    limits.write_text("default: {requests_per_day: 5}\n")
    args = ("--journal", str(path), "--prices", str(prices), "--limits", str(limits))
    _, err = report(capsys, *args)
    assert "dates read in UTC (the limits file's timezone)" in err


async def test_each_budget_is_shown_in_the_period_it_is_in_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report for last month (``--until`` this month's first) shows each budget in last
    month's period (the invoice) and in this month's (what the proxy enforces now, the
    records since the 1st), marked apart; a report up to now shows one period, both."""
    now = datetime.now(PARIS)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    before = first - timedelta(hours=12)
    path = await journal_of(
        tmp_path / "j.sqlite",
        [rec(1, "acme", before, 1), rec(2, "acme", before, 1), rec(3, "acme", now, 1)],
    )
    limits = tmp_path / "limits.yaml"
    limits.write_text(LIMITS)
    args = ("--journal", str(path), "--limits", str(limits), "--format", "json")
    data = json.loads(report(capsys, *args, "--until", first.date().isoformat())[0])
    periods = {tuple(b["holds"]): (b["period_start"][:10], b["used"]) for b in data["budgets"]}
    last_month = (before.replace(day=1).date().isoformat(), 2)
    assert periods == {("report end",): last_month, ("now",): (first.date().isoformat(), 1)}
    table, _ = report(capsys, *args[:-1], "table", "--until", first.date().isoformat())
    assert "report end" in table
    assert "now" in table
    current = json.loads(report(capsys, *args)[0])["budgets"]
    assert [(b["holds"], b["used"]) for b in current] == [(["report end", "now"], 1)]


@pytest.mark.parametrize(
    ("given", "zone", "expected"),
    [
        ("2026-12-01", "Europe/Paris", "2026-11-30T23:00:00+00:00"),
        ("2026-07-01T12:00", "Europe/Paris", "2026-07-01T10:00:00+00:00"),  # summer time
        ("2026-12-01T00:00+00:00", "Europe/Paris", "2026-12-01T00:00:00+00:00"),  # its own
        ("today", "Europe/Paris", "2026-11-30T23:00:00+00:00"),  # 00:30 in Paris, 1 Dec
        ("yesterday", "UTC", "2026-11-29T00:00:00+00:00"),
        ("today", "America/New_York", "2026-11-30T05:00:00+00:00"),
    ],
)
def test_dates_without_an_offset_are_read_in_the_reports_zone(
    given: str, zone: str, expected: str
) -> None:
    """A date or ``today`` is local midnight of the zone; a given offset wins."""
    now = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
    assert instant(given, ZoneInfo(zone), now=now) == expected


def test_an_unknown_zone_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--timezone Mars/Olympus: exit 2, named."""
    assert main(["report", "--journal", str(tmp_path / "j"), "--timezone", "Mars/Olympus"]) == 2
    assert "--timezone 'Mars/Olympus' is not a time zone" in capsys.readouterr().err


def test_the_report_reads_the_ledger_serve_is_configured_with(
    postgres: Cluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #54 item 2: with USAGE_PROXY_LEDGER_DSN set (as serve had it), report read
    the local journal, pruned after 7 days, without a word. It now reads what serve reads:
    the environment's ledger and limits, or --config's, and says which source it used; a
    --journal flag still picks the journal, and says it is one replica's, pruned."""
    dsn = asyncio.run(fresh_database(postgres)).replace("postgres@", "postgres:secret@")
    now = datetime.now(UTC)
    every = [rec(i, "acme" if i % 2 else "globex", now - timedelta(days=i), 10) for i in range(20)]
    asyncio.run(deliver(dsn, every))
    local = asyncio.run(journal_of(tmp_path / "j.sqlite", every[:3], exporters=("postgres",)))
    limits = tmp_path / "limits.yaml"
    limits.write_text("tenants:\n  acme: {prompt_tokens_per_month: 1000}\n")

    monkeypatch.setenv("USAGE_PROXY_LEDGER_DSN", dsn)
    monkeypatch.setenv("USAGE_PROXY_LIMITS", str(limits))
    monkeypatch.setenv("USAGE_PROXY_JOURNAL", str(local))
    out, err = report(capsys, "--since", "30d", "--format", "json")
    data = json.loads(out)
    assert data["totals"]["requests"] == 20
    assert data["source"].startswith("PostgreSQL ledger postgresql://postgres:***@127.0.0.1")
    assert "secret" not in out + err
    assert "20 record(s) from the PostgreSQL ledger" in err
    assert [b["scope"] for b in data["budgets"]] == ["acme"]  # USAGE_PROXY_LIMITS

    out, err = report(capsys, "--since", "30d", "--format", "json", "--journal", str(local))
    data = json.loads(out)
    assert data["totals"]["requests"] == 3
    assert data["source"].startswith(f"local journal {local} (this replica's records only")
    assert "pruned after 168 h" in data["source"]
    assert "warning: the range starts before" in err  # 30 days ago: pruned by now

    for name in ("USAGE_PROXY_LEDGER_DSN", "USAGE_PROXY_LIMITS", "USAGE_PROXY_JOURNAL"):
        monkeypatch.delenv(name)
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"upstream: http://127.0.0.1:8000\nledger-dsn: {dsn}\nlimits: {limits}\n"
        "models: {minilm: {family: bi-encoder}}\n"
    )
    data = json.loads(report(capsys, "--config", str(config), "--format", "json")[0])
    assert data["totals"]["requests"] == 20
    assert data["source"].startswith("PostgreSQL ledger")
    assert [b["scope"] for b in data["budgets"]] == ["acme"]
    csv_out, err = report(capsys, "--config", str(config), "--format", "csv")
    assert "from the PostgreSQL ledger" in err  # said beside the CSV, not inside it
    assert "PostgreSQL" not in csv_out


async def test_a_journal_without_exporters_says_it_keeps_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only delivered records are pruned: a journal with no exporter keeps all, and says
    so instead of warning."""
    path = await journal_of(tmp_path / "j.sqlite", [rec(1, "a", datetime.now(UTC), 1)])
    out, err = report(capsys, "--journal", str(path), "--since", "60d", "--format", "json")
    assert "none pruned: it has no exporter" in json.loads(out)["source"]
    assert "warning" not in err


async def test_a_pods_report_reads_every_workers_shard_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod of two workers journals to two shards: the report counts both workers'
    records, and its source sentence names the shards and says they are the pod's."""
    now = datetime.now(UTC)
    path = await journal_of(tmp_path / "j.sqlite", [rec(1, "a", now, 1), rec(2, "a", now, 2)])
    await journal_of(shard_path(path, 1), [rec(3, "b", now, 4)], exporters=("postgres",))
    out, _ = report(capsys, "--journal", str(path), "--since", "1d", "--format", "json")
    data = json.loads(out)
    assert data["totals"]["requests"] == 3
    assert data["source"].startswith(
        f"local journal {path} and its 1 worker shard(s) (this pod's records only;"
    )


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://billing:s3cr3t@db:5432/usage", "postgresql://billing:***@db:5432/usage"),
        ("postgresql://billing@db/usage", "postgresql://billing@db/usage"),
        (
            "host=db user=billing password=s3cr3t dbname=usage",
            "host=db user=billing password=*** dbname=usage",
        ),
    ],
)
def test_a_dsn_is_printed_without_its_password(dsn: str, shown: str) -> None:
    """The source line never carries the ledger's password."""
    assert redacted(dsn) == shown

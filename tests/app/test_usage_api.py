"""Where a tenant stands, asked over HTTP (issue #62): the tenant's usage API on the main
port, with its own key, answered by the proxy itself from the limiter's and the report's
own code. The whole proxy in front of the fake vLLM (real MiniLM tokenizer), with keys,
limits and prices; before the issue every one of these paths was refused as unknown (404).
The operators' admin API is tested in test_usage_admin_api.py."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from proxy.accounting.money import nanos_up
from proxy.accounting.price_schedule import load_prices
from proxy.ledger.charges import charge
from proxy.ledger.report import aggregate, row_key
from proxy.limitstore.memory import InProcessLimiter
from proxy.reporting import budget_rows
from proxy.serving.admission import ADMISSION
from proxy.serving.pricesfile import PRICESFILE
from tests.support.records import journal_records
from tests.support.usage_api import (
    ACME,
    GLOBEX,
    PAST,
    RECORDS,
    STANDING,
    USAGE,
    conforms,
    price_file,
    traffic,
    usage_proxy,
)


async def test_a_standing_is_the_limiters_and_the_reports_after_a_price_change(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Reranks and chats, a price change (a reload), more of both: each budget's used
    is the report's (``budget_rows``, the journal priced record by record), its
    remaining the limiter's own meter's; the range's usage is the report's aggregate and
    charges, per model and operation."""
    _, client = await usage_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    await traffic(client, ACME)
    change = (datetime.now(UTC) + timedelta(milliseconds=1)).isoformat()
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"), (change, "0.003"))
    assert client.app[PRICESFILE].reload("SIGHUP")
    await traffic(client, ACME)

    resp = await client.get(STANDING, headers=ACME)
    assert resp.status == 200
    standing = await resp.json()
    conforms(standing, "Standing")
    assert standing["tenant"] == "acme"
    assert standing["read_from"] == "this replica"
    limiter = client.app[ADMISSION].limiter
    assert isinstance(limiter, InProcessLimiter)
    table = load_prices(prices)
    records = journal_records(tmp_path / "journal.sqlite")
    report = {
        row.budget: row.used
        for row in budget_rows(
            limiter.policies,
            lambda since, until: [r for r in records if r.time.isoformat() >= since],
            None,
            datetime.now(UTC),
            table,
        )
        if row.scope == "acme"
    }
    told = {item["name"]: item for item in standing["limits"]}
    assert set(told) == {
        "prompt_tokens_per_month",
        "total_tokens_per_day",
        "cost_per_month",
        "requests_per_hour",
        "concurrency",
    }
    for name, used in report.items():
        item = told[name]
        money = name.startswith("cost_")
        assert (nanos_up(Decimal(item["used"])) if money else item["used"]) == used, name
        meter = limiter.meters[(("tenant", "acme"), name)]
        remaining = meter.standing(time.time())[1]
        assert (nanos_up(Decimal(item["remaining"])) if money else item["remaining"]) == remaining
    assert told["cost_per_month"]["currency"] == "USD"
    assert told["concurrency"]["remaining"] == 8
    assert told["requests_per_hour"]["used"] == 8  # 4 reranks, 4 chats; none refilled yet

    resp = await client.get(USAGE, headers=ACME)
    usage = await resp.json()
    conforms(usage, "Usage")
    assert usage["source"] == "journal"
    assert usage["holds"] == "this replica's records only"
    group = ("model", "operation")
    expected = aggregate(records, group_by=group)
    charges = charge(records, table, lambda r: row_key(r, group))
    assert [(r["model"], r["operation"]) for r in usage["rows"]] == [
        (row.keys["model"], row.keys["operation"]) for row in expected.rows
    ]
    for got, row in zip(usage["rows"], expected.rows, strict=True):
        assert got["prompt_tokens"] == row.prompt_tokens_billed
        assert got["completion_tokens"] == row.completion_tokens_billed
        amount = charges.rows[tuple(row.keys[g] for g in group)].total
        assert Decimal(got["amount"]) == amount
    assert Decimal(usage["amount"]) == charges.tenants[0].amount
    assert usage["amount"] == told["cost_per_month"]["used"]  # one pricing, two answers


async def test_a_key_sees_its_own_tenant_only(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """globex's key reads globex's standing and usage, never acme's; acme's record id
    answers globex exactly as an id that does not exist (404), and acme its record."""
    _, client = await usage_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    ids = await traffic(client, ACME, n=1)

    standing = await (await client.get(STANDING, headers=GLOBEX)).json()
    assert standing["tenant"] == "globex"
    assert [item["name"] for item in standing["limits"]] == ["prompt_tokens_per_month"]
    assert standing["limits"][0]["used"] == 0
    usage = await (await client.get(USAGE, headers=GLOBEX)).json()
    assert usage["tenant"] == "globex"
    assert usage["rows"] == []

    theirs = await client.get(RECORDS + ids[0], headers=GLOBEX)
    unknown = await client.get(RECORDS + "0190a0a0-0000-7000-8000-000000000000", headers=GLOBEX)
    assert theirs.status == unknown.status == 404
    body, other = await theirs.json(), await unknown.json()
    assert body["error"]["type"] == other["error"]["type"]
    assert body["error"]["message"].replace(ids[0], "ID") == other["error"]["message"].replace(
        "0190a0a0-0000-7000-8000-000000000000", "ID"
    )
    mine = await client.get(RECORDS + ids[0], headers=ACME)
    assert mine.status == 200
    conforms(await mine.json(), "RecordAnswer")
    conforms(body, "Error")
    record = (await mine.json())["record"]
    [journaled] = [r for r in journal_records(tmp_path / "journal.sqlite") if r.record_id == ids[0]]
    assert record["verdict"] == journaled.verdict
    assert record["billed"]["prompt_tokens"] == journaled.prompt_tokens_billed
    assert record["reported"]["prompt_tokens"] == journaled.prompt_tokens_reported
    assert Decimal(record["amount"]) == Decimal("0.001") * journaled.prompt_tokens_billed


@pytest.mark.parametrize(
    "options",
    [{}, {"allow_anonymous": True}, {"api_keys": None, "tenant_header": "X-Tenant-Id"}],
    ids=["keys", "anonymous-allowed", "tenant-header"],
)
async def test_no_key_gets_401_in_vllms_shape(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    options: dict[str, Any],
) -> None:
    """Every question without a key, or with a key the file does not list, is answered
    401 as vLLM answers a missing key: also where anonymous requests are allowed to the
    engine, and where a tenant header would name the tenant (only a key does here)."""
    _, client = await usage_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, **options)
    paths = (STANDING, USAGE, RECORDS + "x", "/usage-proxy/v1/openapi.json")
    for path in paths:
        for headers in ({}, {"Authorization": "Bearer sk-nobody"}, {"X-Tenant-Id": "acme"}):
            resp = await client.get(path, headers=headers)
            assert resp.status == 401, path
            assert await resp.json() == {"error": "Unauthorized"}


async def test_the_questions_make_no_record_and_reach_no_engine(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Every question, answered or refused (another method included), reaches no
    engine and journals no record."""
    seen, client = await usage_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    ids = await traffic(client, ACME, n=1)
    before, journaled = len(seen), len(journal_records(tmp_path / "journal.sqlite"))
    for path in (STANDING, USAGE, RECORDS + ids[0], "/usage-proxy/v1/openapi.json"):
        assert (await client.get(path, headers=ACME)).status == 200
        assert (await client.post(path, json={}, headers=ACME)).status == 404
        assert (await client.get(path)).status == 401
    own = {"GET /metrics", "GET /version", "GET /v1/models"}  # the proxy's own polls
    assert [s for s in seen[before:] if s not in own] == []
    assert len(journal_records(tmp_path / "journal.sqlite")) == journaled

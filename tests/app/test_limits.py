"""Budgets and rate limits (issue #38): admission by the engine's own count before the
request is forwarded, refusals clients understand, reservations that never leak, budgets
that survive a restart. The whole proxy in front of the fake vLLM (real MiniLM)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from proxy.limits.meters import BudgetMeter, Gate
from proxy.limitstore.memory import InProcessLimiter
from proxy.serving.admission import ADMISSION
from proxy.serving.exchange import EXCHANGES
from proxy.serving.keys import METRICS
from proxy.serving.limitsfile import LIMITSFILE
from tests.support.proxies import limited_proxy
from tests.support.records import journal_records
from tests.support.texts import RERANK

ACME = {"X-Tenant-Id": "acme"}


def write_limits(path: Path, policies: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(policies))
    return path


def reached() -> tuple[list[str], Any]:
    """A middleware for the fake that lists the paths of the requests reaching it (not the
    proxy's own /tokenize calls, which price a prompt and cause no engine work)."""
    seen: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path != "/tokenize":
            seen.append(request.path)
        return await handler(request)

    return seen, count


def limiter_of(client: Any) -> InProcessLimiter:
    limiter = client.app[ADMISSION].limiter
    assert isinstance(limiter, InProcessLimiter)
    return limiter


def held(limiter: InProcessLimiter) -> int:
    """Units reserved by requests in flight, over every budget and gate."""
    return sum(
        m.reserved if isinstance(m, BudgetMeter) else m.held
        for m in limiter.meters.values()
        if isinstance(m, BudgetMeter | Gate)
    )


async def test_rerank_is_admitted_at_its_engine_count(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank of a tenant with a prompt-token budget reserves its recount (the engine
    count, not 0.29.0's inflated report), is told its standing in x-ratelimit-* headers,
    and its budget settles to the record's billed tokens."""
    policies = {"tenants": {"acme": {"prompt_tokens_per_day": 1000, "requests_per_minute": 60}}}
    _, client = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies)
    resp = await client.post("/rerank", json=RERANK, headers=ACME)
    assert resp.status == 200
    await resp.read()
    (record,) = journal_records(tmp_path / "journal.sqlite")
    billed = record.prompt_tokens_billed
    assert billed is not None
    assert billed < record.prompt_tokens_reported  # 0.29.0 inflates a 1:N bi-encoder
    assert resp.headers["x-ratelimit-limit-tokens"] == "1000"
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(1000 - billed)
    assert resp.headers["x-ratelimit-limit-requests"] == "60"
    assert resp.headers["x-ratelimit-remaining-requests"] == "59"
    (meter,) = [m for m in limiter_of(client).meters.values() if isinstance(m, BudgetMeter)]
    assert (meter.used, meter.reserved) == (billed, 0)


def mixed_request(i: int) -> tuple[str, dict[str, Any]]:
    """Reranks (engine counts known), embeddings and chat with max_tokens, in turn."""
    if i % 3 == 0:
        return "/rerank", {"query": f"query {i}", "documents": [f"doc {i} a", f"doc {i} b"]}
    if i % 3 == 1:
        return "/v1/embeddings", {"input": [f"embed text number {i}", "a second input"]}
    return "/v1/chat/completions", {
        "messages": [{"role": "user", "content": f"hi {i}"}],
        "max_tokens": 8,
    }


async def test_200_concurrent_requests_never_exceed_the_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """The issue's test: 200 concurrent requests of one tenant at a prompt-token budget
    that fits about 60 of them. Admitted engine prompt tokens (the journal's) never exceed
    the budget, the refused ones never reached the fake, and at every step the budget's
    remaining + billed + reserved add up to it; nothing stays reserved at the end."""
    budget = 600  # about 60 of these requests: they bill 5 to 14 engine prompt tokens
    seen, count = reached()
    _, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"prompt_tokens_per_day": budget}}},
        middlewares=(count,),
        tenant_share=1.0,
    )
    limiter = limiter_of(client)
    checks = 0
    done = asyncio.Event()

    async def check_sums() -> None:
        nonlocal checks
        while not done.is_set():
            for meter in limiter.meters.values():
                if isinstance(meter, BudgetMeter):
                    _, remaining, _ = meter.standing(meter.start)
                    assert meter.used + meter.reserved <= budget
                    assert remaining + meter.used + meter.reserved == budget
                    checks += 1
            await asyncio.sleep(0)

    async def one(i: int) -> tuple[int, dict[str, str]]:
        path, body = mixed_request(i)
        resp = await client.post(path, json=body, headers=ACME)
        await resp.read()
        return resp.status, dict(resp.headers)

    checker = asyncio.create_task(check_sums())
    answers = await asyncio.gather(*(one(i) for i in random.sample(range(200), 200)))
    done.set()
    await checker
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, 429}
    admitted = statuses.count(200)
    assert 20 <= admitted <= 70, admitted
    records = journal_records(tmp_path / "journal.sqlite")
    assert len(records) == admitted == len(seen)  # the refused reached no upstream
    engine_prompt = sum(r.prompt_tokens_billed or 0 for r in records)
    assert engine_prompt <= budget
    (meter,) = [m for m in limiter.meters.values() if isinstance(m, BudgetMeter)]
    assert (meter.used, meter.reserved) == (engine_prompt, 0)
    assert checks > 0
    for status, headers in answers:
        assert 0 <= int(headers["x-ratelimit-remaining-tokens"]) <= budget
        if status == 429:
            assert int(headers["retry-after-ms"]) > 0


async def test_no_reservation_leaks_whatever_stage_a_request_is_killed_at(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Clients that hang up while counted, while the engine works or mid-stream, upstream
    errors, and exchanges cancelled (shutdown) before or after forwarding: every
    reservation ends, settled to a record or released; the gate is empty again."""
    policies = {"tenants": {"acme": {"total_tokens_per_day": 100000, "concurrency": 50}}}
    fake, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies
    )
    limiter = limiter_of(client)
    fake.delay = 0.05
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def hang_up(path: str, body: dict[str, Any], after: float) -> None:
        request = asyncio.ensure_future(client.post(path, json=body, headers=ACME))
        await asyncio.sleep(after)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)

    stages = [
        hang_up("/rerank", RERANK, 0.0),
        hang_up("/rerank", RERANK, 0.02),
        hang_up("/v1/embeddings", {"input": "some text"}, 0.01),
        hang_up("/v1/chat/completions", {**chat, "stream": True}, 0.08),
        hang_up("/v1/chat/completions", chat, 0.02),
    ]
    await asyncio.gather(*stages)
    fake.tamper = lambda body, headers: (b"not json", headers)  # upstream answers garbage
    resp = await client.post("/v1/chat/completions", json=chat, headers=ACME)
    await resp.read()
    fake.tamper = None
    fake.ok_error = True
    resp = await client.post("/rerank", json={"query": 1}, headers=ACME)  # vLLM's 400
    await resp.read()
    fake.ok_error = False

    for after in (0.0, 0.01, 0.03, 0.06):  # cancelled like a shutdown at each stage
        request = asyncio.ensure_future(client.post("/rerank", json=RERANK, headers=ACME))
        await asyncio.sleep(after)
        for task in list(client.app[EXCHANGES]._live):
            task.cancel()
        await asyncio.gather(request, return_exceptions=True)
    for _ in range(200):
        if client.app[EXCHANGES].in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert client.app[EXCHANGES].in_flight == 0
    assert held(limiter) == 0
    (budget,) = [m for m in limiter.meters.values() if isinstance(m, BudgetMeter)]
    for _ in range(200):  # a record whose exchange was cancelled mid-commit is committed
        records = journal_records(tmp_path / "journal.sqlite")
        billed = sum(
            (r.prompt_tokens_billed or 0) + (r.completion_tokens_billed or 0) for r in records
        )
        if billed == budget.used:
            break
        await asyncio.sleep(0.01)
    assert budget.used == billed


async def test_refusal_in_openai_shape_with_exact_retry_after(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Over a rate: 429 with code rate_limit_exceeded, nothing forwarded, retry-after-ms
    exactly what the bucket needs (one request per second: 1000 ms after the first),
    counted by limit and logged; a stream carries the headers too."""
    seen, count = reached()
    _, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"default": {"requests_per_second": 1}},
        middlewares=(count,),
    )
    clock = [1_000_000.0]
    client.app[ADMISSION]._clock = lambda: clock[0]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    first = await client.post("/v1/chat/completions", json=chat, headers=ACME)
    assert first.status == 200
    assert (await first.text()).endswith("data: [DONE]\n\n")
    assert first.headers["x-ratelimit-limit-requests"] == "1"
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    assert first.headers["x-ratelimit-reset-requests"] == "1s"
    clock[0] += 0.25
    second = await client.post("/v1/chat/completions", json=chat, headers=ACME)
    assert second.status == 429
    error = (await second.json())["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "rate_limit_exceeded",
        "requests",
        None,
    )
    assert "requests_per_second" in error["message"]
    assert second.headers["retry-after-ms"] == "750"
    assert second.headers["retry-after"] == "1"
    assert second.headers["x-ratelimit-reset-requests"] == "750ms"
    assert "x-should-retry" not in second.headers
    assert seen == ["/v1/chat/completions"]
    metrics = client.app[METRICS].render().decode()
    assert 'usage_proxy_limited_requests_total{limit="requests_per_second"} 1.0' in metrics
    clock[0] += 0.75
    third = await client.post("/v1/chat/completions", json=chat, headers=ACME)
    assert third.status == 200
    await third.read()


async def test_spent_budget_and_oversized_request(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A monthly budget spent until a distant reset says x-should-retry: false; a request
    whose cost alone exceeds the budget's whole capacity gets a 400 that says so."""
    _, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"prompt_tokens_per_month": 40}}},
    )
    texts = ["one more short text"] * 3  # 18 tokens: twice fits 40, a third time not
    for _ in range(2):
        ok = await client.post("/v1/embeddings", json={"input": texts}, headers=ACME)
        assert ok.status == 200
    used = 40 - int(ok.headers["x-ratelimit-remaining-tokens"])
    assert used == 36
    spent = await client.post("/v1/embeddings", json={"input": texts}, headers=ACME)
    assert spent.status == 429
    assert (await spent.json())["error"]["code"] == "rate_limit_exceeded"
    assert spent.headers["x-should-retry"] == "false"
    assert int(spent.headers["retry-after"]) > 60
    huge = await client.post("/v1/embeddings", json={"input": ["word " * 60]}, headers=ACME)
    assert huge.status == 400
    assert "can never be admitted" in (await huge.json())["error"]["message"]
    assert huge.headers["x-should-retry"] == "false"


async def test_an_uncapped_chat_over_a_small_limit_is_told_to_set_max_tokens(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A chat without a completion cap is priced at what the context leaves (the engine may
    generate that much). Under a token limit smaller than the context the 400 says why and
    what to do (set max_tokens); nothing is forwarded, and the same chat with a cap is
    admitted."""
    seen, count = reached()
    _, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"total_tokens_per_minute": 100}}},
        middlewares=(count,),
    )
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
    uncapped = await client.post("/v1/chat/completions", json=chat, headers=ACME)
    assert uncapped.status == 400
    message = (await uncapped.json())["error"]["message"]
    assert "sets no completion cap" in message
    assert "max_tokens" in message
    assert seen == []
    capped = await client.post("/v1/chat/completions", json={**chat, "max_tokens": 8}, headers=ACME)
    assert capped.status == 200
    await capped.read()
    assert seen == ["/v1/chat/completions"]


async def test_a_spent_budget_refuses_what_the_proxy_cannot_price(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A budget spent to its last token refuses a request the proxy cannot price exactly
    (a model it does not know, a structured decision): each reserves at least a token (a
    model not listed: as the widest one served), so none reaches the engine and bills past
    the budget."""
    seen, count = reached()
    _, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": {"prompt_tokens_per_month": 72}}},
        middlewares=(count,),
    )
    texts = ["one more short text"] * 3  # 18 tokens: four times spends 72 exactly
    for _ in range(4):
        ok = await client.post("/v1/embeddings", json={"input": texts}, headers=ACME)
        assert ok.status == 200
    assert ok.headers["x-ratelimit-remaining-tokens"] == "0"
    unknown = {"model": "not-served", "input": texts}
    decision = {"state": "blue sky", "questions": {"a": {"type": "yes_no"}}}  # < 72 bytes
    refused = await client.post("/v1/systemone", json=decision, headers=ACME)
    assert refused.status == 429
    # a name not listed at the last discovery is priced as the widest model served (an
    # adapter loaded since would run in it): three inputs at 256 can never fit 72
    refused = await client.post("/v1/embeddings", json=unknown, headers=ACME)
    assert refused.status == 400
    assert "'not-served' was not listed" in (await refused.json())["error"]["message"]
    assert seen == ["/v1/embeddings"] * 4


async def test_the_openai_client_waits_as_told_and_stops_on_a_spent_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """The official openai client, pointed at the proxy: it receives the 429, waits the
    retry-after-ms it is given and succeeds once the rate allows; a spent monthly budget
    (x-should-retry: false) stops it at once, without retries."""
    import openai

    seen, count = reached()
    policies = {
        "tenants": {
            "acme": {"requests_per_second": 5},
            "poor": {"prompt_tokens_per_month": 10},
        }
    }
    _, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies, middlewares=(count,)
    )

    def openai_client(tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=str(client.make_url("/v1")),
            api_key="unused",
            max_retries=2,
            default_headers={"X-Tenant-Id": tenant},
        )

    async with openai_client("acme") as acme:
        started = asyncio.get_running_loop().time()
        for _ in range(6):  # a burst of 5, then one every 200 ms
            answer = await acme.embeddings.create(
                model="minilm", input="hi", encoding_format="float"
            )
            assert answer.usage.prompt_tokens == 3
        waited = asyncio.get_running_loop().time() - started
    assert 0.1 < waited < 3  # the sixth call waited about 200 ms, as it was told
    assert len(seen) == 6  # its refused first attempt never reached the engine
    metrics = client.app[METRICS].render().decode()
    assert 'usage_proxy_limited_requests_total{limit="requests_per_second"} 1.0' in metrics

    text = "hello there my friend"  # 6 tokens: once fits 10, twice not
    async with openai_client("poor") as poor:
        await poor.embeddings.create(model="minilm", input=text, encoding_format="float")
        started = asyncio.get_running_loop().time()
        with pytest.raises(openai.RateLimitError) as refused:
            await poor.embeddings.create(model="minilm", input=text, encoding_format="float")
        assert asyncio.get_running_loop().time() - started < 0.5  # no retry, no wait
    assert refused.value.code == "rate_limit_exceeded"
    assert len(seen) == 7
    metrics = client.app[METRICS].render().decode()
    assert 'usage_proxy_limited_requests_total{limit="prompt_tokens_per_month"} 1.0' in metrics


async def test_a_restart_mid_period_continues_the_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """The budget of a proxy started again on the same journal starts where the last
    one left it (rebuilt from the records, per tenant, model and key), not at zero."""
    policies = {
        "tenants": {
            "acme": {"prompt_tokens_per_month": 100, "models": {"minilm": {"requests_per_day": 5}}}
        }
    }
    _, first = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies)
    for _ in range(2):
        resp = await first.post("/rerank", json=RERANK, headers=ACME)
        assert resp.status == 200
    left = int(resp.headers["x-ratelimit-remaining-tokens"])
    await first.close()
    billed = sum(r.prompt_tokens_billed or 0 for r in journal_records(tmp_path / "journal.sqlite"))
    assert left == 100 - billed

    _, second = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies)
    metrics = second.app[METRICS].render().decode()
    assert "usage_proxy_limits_restored_records_total 2.0" in metrics
    resp = await second.post("/v1/embeddings", json={"input": "hi"}, headers=ACME)
    assert resp.status == 200
    assert int(resp.headers["x-ratelimit-remaining-tokens"]) == left - 3
    assert resp.headers["x-ratelimit-remaining-requests"] == "2"  # the model's: 3 of 5 used
    resp = await second.post("/rerank", json=RERANK, headers=ACME)
    assert resp.status == 429  # 36 more would pass 100: the month is not reset


async def test_a_scale_down_to_one_process_counts_every_shards_budget(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """2 -> 1 worker: the one process that adopts the shard a worker of the pod left
    restores its budgets from it as well as from its own journal (the month goes on)."""
    policies = {"tenants": {"acme": {"prompt_tokens_per_month": 100}}}
    pod = tmp_path / "pod"  # worker 1's shard, written as its journal, then put beside
    pod.mkdir()
    _, first = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, pod, policies)
    for _ in range(2):
        resp = await first.post("/rerank", json=RERANK, headers=ACME)
        assert resp.status == 200
    left = int(resp.headers["x-ratelimit-remaining-tokens"])
    await first.close()
    assert left < 100
    shard = (pod / "journal.sqlite").rename(tmp_path / "journal.worker-1.sqlite")

    _, alone = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies, adopted=[shard]
    )
    metrics = alone.app[METRICS].render().decode()
    assert "usage_proxy_limits_restored_records_total 2.0" in metrics
    resp = await alone.post("/v1/embeddings", json={"input": "hi"}, headers=ACME)
    assert resp.status == 200
    assert int(resp.headers["x-ratelimit-remaining-tokens"]) == left - 3


async def test_a_bad_limits_file_keeps_the_policies_in_use(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A reload of a file that does not validate (an unknown limit name) is logged and
    counted and the policies in use stay; a good one is used from the next request."""
    policies = {"tenants": {"acme": {"requests_per_minute": 1}}}
    _, client = await limited_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies)
    limits = tmp_path / "limits.yaml"
    write_limits(limits, {"tenants": {"acme": {"requests_per_fortnight": 1}}})
    assert not client.app[LIMITSFILE].reload("SIGHUP")
    metrics = client.app[METRICS].render().decode()
    assert "usage_proxy_limits_reload_failures_total 1.0" in metrics
    assert (await client.post("/v1/embeddings", json={"input": "a"}, headers=ACME)).status == 200
    assert (await client.post("/v1/embeddings", json={"input": "a"}, headers=ACME)).status == 429
    write_limits(limits, {"tenants": {"acme": {"requests_per_minute": 100}}})
    assert client.app[LIMITSFILE].reload("SIGHUP")
    resp = await client.post("/v1/embeddings", json={"input": "a"}, headers=ACME)
    assert resp.status == 200
    assert resp.headers["x-ratelimit-limit-requests"] == "100"

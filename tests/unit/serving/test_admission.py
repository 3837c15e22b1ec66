"""Admission's end of a reservation: settled to the record's billed tokens, released
without a record; and the headers added to any answer of a request that holds one.
(Admission against the whole proxy: tests/app/test_limits.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from proxy.accounting.types import ServedModel
from proxy.ledger.records import UsageRecord
from proxy.limits.limiter import Cost, Ticket, Who
from proxy.limits.meters import BudgetMeter
from proxy.limits.policy import Policies
from proxy.limitstore.memory import InProcessLimiter
from proxy.serving.admission import HOLD, Admission, add_headers
from proxy.serving.catalog import Catalog
from proxy.serving.exchange import Hold
from proxy.settings import Settings

POLICIES = Policies.model_validate({"tenants": {"acme": {"total_tokens_per_day": 100}}})


def admission() -> Admission:
    none: Any = None
    limiter = InProcessLimiter(POLICIES)
    return Admission(limiter, none, none, none, count_timeout=1.0, clock=lambda: 1e9)


def record(prompt: int | None, completion: int | None) -> UsageRecord:
    return UsageRecord(
        tenant="acme",
        endpoint="/v1/chat/completions",
        operation="chat",
        prompt_tokens_billed=prompt,
        completion_tokens_billed=completion,
        status=200,
        latency_ms=1.0,
        instance="test",
    )


async def test_settled_to_the_record_or_released() -> None:
    """The record's billed tokens (None as 0) replace the reservation; without a record
    the reservation is given back."""
    adm = admission()
    held = Hold(await adm.limiter.reserve(Who("acme"), Cost(30, 30), 1e9))
    held.record = record(12, None)
    await adm.settle(held)
    released = Hold(await adm.limiter.reserve(Who("acme"), Cost(30, 30), 1e9))
    await adm.settle(released)
    await adm.settle(Hold())  # nothing held: nothing to do
    assert isinstance(adm.limiter, InProcessLimiter)
    (meter,) = adm.limiter.meters.values()
    assert isinstance(meter, BudgetMeter)
    assert (meter.used, meter.reserved) == (12, 0)


async def test_headers_on_any_answer_that_holds_a_decision() -> None:
    """A request holding a decision gets its x-ratelimit-* headers; others get none."""
    adm = admission()
    request = make_mocked_request("POST", "/v1/chat/completions")
    response = web.StreamResponse()
    await add_headers(request, response)
    assert "x-ratelimit-limit-tokens" not in response.headers
    request[HOLD] = Hold(await adm.limiter.reserve(Who("acme"), Cost(30, 0), 1e9))
    await add_headers(request, response)
    assert response.headers["x-ratelimit-remaining-tokens"] == "70"


async def test_a_sessions_utterances_settle_apart_from_it() -> None:
    """An utterance settles at its done's usage, or at nothing when none came (its
    session's record bills nothing for it); the session's own hold (``apart``) then
    settles its request alone, so its record's sum is not counted twice."""
    adm = admission()
    session = Hold(await adm.limiter.reserve(Who("acme"), Cost(), 1e9), apart=True)
    first = await adm.limiter.reserve(Who("acme"), Cost(20, 20, requests=0), 1e9)
    second = await adm.limiter.reserve(Who("acme"), Cost(20, 20, requests=0), 1e9)
    assert first.ticket is not None
    assert second.ticket is not None
    await adm.settle_utterance(first.ticket, (3, 4), session)
    await adm.settle_utterance(second.ticket, None, session)  # its done never came
    session.record = record(3, 4)
    await adm.settle(session)
    assert isinstance(adm.limiter, InProcessLimiter)
    (meter,) = adm.limiter.meters.values()
    assert isinstance(meter, BudgetMeter)
    assert (meter.used, meter.reserved) == (7, 0)


async def test_a_session_settles_what_its_record_bills_beyond_its_utterances() -> None:
    """A generation the proxy did not admit (a commit vLLM took as a start while the proxy
    still saw the last generation running: its done was in flight) has a done the record
    sums but no utterance settled: the session's own hold settles it, so the budget holds
    what the record bills (before: 7 held of 18 billed, a restart counted 18)."""
    adm = admission()
    session = Hold(await adm.limiter.reserve(Who("acme"), Cost(), 1e9), apart=True)
    first = await adm.limiter.reserve(Who("acme"), Cost(20, 20, requests=0), 1e9)
    assert first.ticket is not None
    await adm.settle_utterance(first.ticket, (3, 4), session)
    session.record = record(3 + 5, 4 + 6)  # and the unadmitted one's (5, 6)
    await adm.settle(session)
    assert isinstance(adm.limiter, InProcessLimiter)
    (meter,) = adm.limiter.meters.values()
    assert isinstance(meter, BudgetMeter)
    assert (meter.used, meter.reserved) == (18, 0)


async def test_an_utterance_is_priced_by_the_model_any_request_is() -> None:
    """An utterance looked its model up directly, so a name the last discovery did not
    list (a model served since, one dropped by a rediscovery during the session) ended
    its session ("no known context"). It is priced as every other route prices such a
    name (``Catalog.priced_as``): each of its prompt and completion at the widest served
    context, under its own name; named by none, at the default's."""
    catalog = Catalog(Settings(upstream="http://vllm:8000"))
    catalog.models = {
        "base": ServedModel("base", "/m/base", 1024, None, None),
        "wide": ServedModel("wide", "/m/wide", 4096, None, None),
    }
    limits = Policies.model_validate({"tenants": {"acme": {"total_tokens_per_day": 100000}}})
    none: Any = None
    adm = Admission(InProcessLimiter(limits), catalog, none, none, count_timeout=1.0)
    exchange: Any = SimpleNamespace(who=SimpleNamespace(tenant="acme", key_hash=None))
    since = await adm.admit_utterance(exchange, "lora-since")
    default = await adm.admit_utterance(exchange, None)
    assert isinstance(since, Ticket), since
    assert (since.who.model, since.cost.prompt, since.cost.completion) == ("lora-since", 4096, 4096)
    assert isinstance(default, Ticket), default
    assert (default.who.model, default.cost.prompt) == ("base", 1024)

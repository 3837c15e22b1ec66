"""Budgets and rate limits (issue #38): admission by the engine's own count before the
request is forwarded, refusals clients understand, reservations that never leak, budgets
that survive a restart. The whole proxy in front of the fake vLLM (real MiniLM)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.limits.memory import InProcessLimiter
from proxy.limits.meters import BudgetMeter, Gate
from proxy.serving.admission import ADMISSION
from proxy.serving.keys import METRICS
from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records
from tests.support.texts import RERANK

ACME = {"X-Tenant-Id": "acme"}


def write_limits(path: Path, policies: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(policies))
    return path


async def limited_proxy(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp: Path, policies: Any
) -> tuple[Any, Any]:
    limits = write_limits(tmp / "limits.yaml", policies)
    return await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tenant_header="X-Tenant-Id",
        journal=str(tmp / "journal.sqlite"),
        limits=str(limits),
    )


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
    fake, client = await limited_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, policies
    )
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

"""The limits store as the app connects to it, on real redis-servers: TLS (a server that
speaks TLS only) with a password from a file or the environment, a missing password or a
silent store costing each request at most the timeout, then the fail mode."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.limits.limiter import Cost, Who
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.client import connect
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.wiring import build_shared_limiter
from proxy.serving.startup import store_password
from proxy.settings import Settings
from tests.support.redisserver import Store

ACME = Who("acme", "m", "k1")
UPSTREAM = "http://127.0.0.1:8000"


def policies(**tenant: object) -> Policies:
    return Policies.model_validate({"tenants": {"acme": tenant}})


def test_the_password_comes_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's password is read from USAGE_PROXY_LIMITS_STORE_PASSWORD, or from the
    file, which wins; none when neither is set."""
    settings = Settings(upstream=UPSTREAM, limits_store="redis://127.0.0.1:6379/0")
    monkeypatch.delenv("USAGE_PROXY_LIMITS_STORE_PASSWORD", raising=False)
    assert store_password(settings) is None
    monkeypatch.setenv("USAGE_PROXY_LIMITS_STORE_PASSWORD", "from-env")
    assert store_password(settings) == "from-env"
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    filed = Settings(
        upstream=UPSTREAM,
        limits_store="redis://127.0.0.1:6379/0",
        limits_store_password_file=secret,
    )
    assert store_password(filed) == "from-file"


def tls_settings(store: Store, **options: Any) -> Settings:
    """The TLS handshake of a first connection can outlast the 50 ms default on this
    shared box: these tests allow a second."""
    return Settings(
        upstream=UPSTREAM,
        limits_store=store.url,
        instance="r0",
        **{"limits_store_timeout": 1.0, "limits_replicas": 1, **options},
    )


async def admitted_in_store(limiter: GuardedLimiter) -> bool:
    """Whether a reservation is made in the store (not by the fail mode)."""
    await limiter.restore([], time.time())
    try:
        whole = await limiter.contribute()
        decision = await limiter.reserve(ACME, Cost(5, 0), time.time())
        return whole and decision.ticket is not None and not limiter.errors
    finally:
        await limiter.close()


async def test_tls_with_the_password_from_a_file(tls_redis_store: Store, tmp_path: Path) -> None:
    """rediss:// to a server that speaks TLS only (its CA named in the URL's query), the
    password read from --limits-store-password-file: the store answers."""
    secret = tmp_path / "password"
    secret.write_text(f"{tls_redis_store.password}\n")
    settings = tls_settings(tls_redis_store, limits_store_password_file=secret)
    pols = policies(prompt_tokens_per_day=300)
    assert await admitted_in_store(
        build_shared_limiter(settings, pols, password=store_password(settings))
    )


async def test_tls_with_the_password_from_the_environment(
    tls_redis_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """valkeys:// (rediss://) with the password from USAGE_PROXY_LIMITS_STORE_PASSWORD."""
    assert tls_redis_store.password is not None
    monkeypatch.setenv("USAGE_PROXY_LIMITS_STORE_PASSWORD", tls_redis_store.password)
    url = tls_redis_store.url.replace("rediss://", "valkeys://")
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=url,
        instance="r0",
        limits_store_timeout=1.0,
        limits_replicas=1,
    )
    pols = policies(prompt_tokens_per_day=300)
    assert await admitted_in_store(
        build_shared_limiter(settings, pols, password=store_password(settings))
    )


async def test_without_the_password_the_fail_mode_decides(
    tls_redis_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No password (or plain redis:// to the TLS port): the store refuses or cannot be
    spoken to, each call fails within the timeout and the fail mode admits."""
    monkeypatch.delenv("USAGE_PROXY_LIMITS_STORE_PASSWORD", raising=False)
    pols = policies(prompt_tokens_per_day=300)
    plain = tls_redis_store.url.replace("rediss://", "redis://").split("?")[0]
    for url in (tls_redis_store.url, plain):
        settings = Settings(
            upstream=UPSTREAM,
            limits_store=url,
            instance="r0",
            limits_store_timeout=0.5,
            limits_replicas=1,
        )
        limiter = build_shared_limiter(settings, pols, password=store_password(settings))
        assert not await admitted_in_store(limiter)
        assert limiter.errors
        assert limiter.fail_admissions[FailMode.LOCAL] == 1
        assert limiter.slowest < 0.5 + 0.2


async def test_a_silent_store_costs_each_request_at_most_the_timeout() -> None:
    """A store that accepts connections and never answers: each admission waits at most
    the timeout, then the fail mode decides; after 3 failures the breaker skips the
    store and admissions cost no wait at all."""
    silent: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=f"redis://127.0.0.1:{port}/0",
        limits_store_timeout=0.1,
        limits_replicas=1,
        instance="r0",
    )
    limiter = build_shared_limiter(
        settings, policies(prompt_tokens_per_day=300), password=store_password(settings)
    )
    limiter.restored = True
    waits = []
    for _ in range(6):
        started = time.monotonic()
        decision = await limiter.reserve(ACME, Cost(1, 0), time.time())
        waits.append(time.monotonic() - started)
        assert decision.ticket is not None
    assert all(wait < 0.1 + 0.05 for wait in waits), waits
    assert all(wait < 0.01 for wait in waits[3:]), waits  # the breaker is open
    assert limiter.errors == {"timeout": 3}
    assert limiter.fail_admissions[FailMode.LOCAL] == 6
    await limiter.close()
    for writer in silent:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_broken_call_is_neither_retried_nor_sent_again() -> None:
    """The store's client retries nothing, whatever the library's default (redis-py 6 and
    later retry three times): a store that reads a call and drops the connection sees
    one connection and the call once, and the caller gets the error at once, for the
    fail mode to decide (a reservation sent again would reserve twice)."""
    accepted: list[bytes] = []

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(await reader.read(65536))  # the call (and any handshake), then gone
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = connect(f"redis://127.0.0.1:{port}/0", timeout=2.0)
    started = time.monotonic()
    with pytest.raises(RedisError):
        await client.ping()
    assert time.monotonic() - started < 1.0  # no backoff between attempts
    assert len(accepted) == 1, accepted
    await client.aclose()
    server.close()
    await server.wait_closed()


# --- review (adversarial): one tenant's burst decides every admission by the fail mode ---


async def burst(store: Store, mode: str) -> tuple[GuardedLimiter, list[Any], list[Any]]:
    """A healthy store; tenant ``evil`` (10 requests a minute) sends 1000 requests at
    once while tenant ``good`` (a roomy budget) sends 5: each admission's store wait
    decides. The timeout is 250 ms, not the 50 ms default: one round trip on a loaded
    2-core box can take longer than 50 ms (three in a row open the breaker, and the fail
    mode then admits the burst), while 1000 calls that wait for the pool inside their
    timeout (the defect) still time out by hundreds at 250 ms (measured: 593 of 1000)."""
    pols = Policies.model_validate(
        {
            "tenants": {
                "evil": {"requests_per_minute": 10},
                "good": {"prompt_tokens_per_day": 100_000},
            }
        }
    )
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=store.url,
        limits_replicas=1,
        limits_fail_mode=mode,
        limits_store_timeout=0.25,
    )
    limiter = build_shared_limiter(settings, pols, password=store_password(settings))
    await limiter.restore([], time.time())
    assert await limiter.contribute()
    now = time.time()
    decisions = await asyncio.gather(
        *[limiter.reserve(Who("evil"), Cost(0, 0, 1), now) for _ in range(1000)],
        *[limiter.reserve(Who("good"), Cost(1, 0), now) for _ in range(5)],
    )
    await limiter.close()
    return limiter, list(decisions[:1000]), list(decisions[1000:])


async def test_review_a_burst_does_not_open_a_rate_limit(redis_store: Store) -> None:
    """Fail mode open, the store up and answering: a tenant's burst of 1000 against 10
    requests a minute is admitted about 10 times, not by the fail mode."""
    _, evil, _ = await burst(redis_store, "open")
    assert sum(d.ticket is not None for d in evil) <= 20


async def test_review_a_burst_does_not_refuse_other_tenants(redis_store: Store) -> None:
    """Fail mode closed, the store up: another tenant's requests during the burst are
    admitted by the store, not refused as if it were down."""
    _, _, good = await burst(redis_store, "closed")
    assert [d.ticket is not None for d in good] == [True] * 5


async def test_review_one_slow_admission_does_not_fail_readiness(redis_store: Store) -> None:
    """Fail mode closed, the store up: it pauses its clients for 100 ms once (CLIENT
    PAUSE), so one admission outlasts the 50 ms timeout; /readyz must not call the store
    unreachable for that."""
    settings = Settings(
        upstream=UPSTREAM,
        limits_store=redis_store.url,
        limits_replicas=1,
        limits_fail_mode="closed",
    )
    limiter = build_shared_limiter(
        settings, policies(requests_per_minute=100), password=store_password(settings)
    )
    admin = Redis.from_url(redis_store.url)
    try:
        await limiter.restore([], time.time())
        assert await limiter.contribute()
        assert await limiter.beat(15.0) == 1
        await admin.execute_command("CLIENT", "PAUSE", 100, "ALL")
        slow = await limiter.reserve(ACME, Cost(0, 0, 1), time.time())
        found = limiter.problem()
    finally:
        await admin.aclose()
        await limiter.close()
    assert slow.refusal is not None  # the pause made it time out: decided by the fail mode
    assert found is None or not found[1]

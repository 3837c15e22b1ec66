"""The limits store as the app connects to it, on real redis-servers: TLS (a server that
speaks TLS only) with a password from a file or the environment; a missing password
costs each request at most the timeout, then the fail mode decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.limits.policy import FailMode
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.host import build_host
from proxy.limitstore.hosted import HostedLimiter
from proxy.limitstore.memory import InProcessLimiter
from proxy.limitstore.wiring import build_limiter, build_shared_limiter, count_file
from proxy.serving.startup import store_password
from proxy.settings import Settings
from tests.support.limitstores import UPSTREAM, admitted_in_store, policies, tls_settings
from tests.support.redisserver import Store


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
        assert limiter.calls.errors
        assert limiter.mode.fail_admissions[FailMode.LOCAL] == 1
        assert limiter.calls.slowest < 0.5 + 0.2


def test_the_replica_count_is_kept_beside_the_journal(tmp_path: Path) -> None:
    """--limits-replicas unset: the count read is kept beside the journal; stated, or
    without a journal, none is kept."""
    journal = tmp_path / "state" / "journal.sqlite"
    base = {"upstream": UPSTREAM, "limits_store": "redis://127.0.0.1:1", "journal": str(journal)}
    kept = count_file(Settings(**base))
    assert kept is not None
    assert kept.path == tmp_path / "state" / "limits-replicas"
    assert count_file(Settings(**{**base, "limits_replicas": 3})) is None
    assert count_file(Settings(**{**base, "journal": "off"})) is None


def test_without_a_store_the_limiter_is_in_process() -> None:
    """No --limits-store: the limiter has no store to report on, and nothing to run."""
    settings = Settings(upstream=UPSTREAM)
    limiter = build_limiter(settings, policies(prompt_tokens_per_day=10))
    assert limiter.problem() is None
    assert not isinstance(limiter, GuardedLimiter)


def test_a_pods_worker_without_a_store_admits_through_the_host(tmp_path: Path) -> None:
    """A pod's worker without --limits-store gets a limiter on the pod's host socket,
    as its part (its journal shard); the host itself is an in-process limiter of the
    same policies on that socket."""
    settings = Settings(upstream=UPSTREAM)
    pols = policies(prompt_tokens_per_day=10)
    limiter = build_limiter(settings, pols, host=tmp_path / "limiter.sock", part=1)
    assert isinstance(limiter, HostedLimiter)
    assert (limiter.path, limiter.part) == (tmp_path / "limiter.sock", 1)
    host = build_host(pols, tmp_path / "limiter.sock")
    assert isinstance(host.limiter, InProcessLimiter)
    assert host.limiter.policies == pols

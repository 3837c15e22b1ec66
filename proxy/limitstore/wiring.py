"""The limiter as the application wires it: in process, on the pod's limiter host (and
that host), or on the limits store, the guarded limiter on a client of the store, built
from the settings (the password given by the caller: it is read where a missing file is
a start-up error), with the replica count it last read kept beside the journal
(``headcount``)."""

from __future__ import annotations

from pathlib import Path

from proxy.limits.limiter import Limiter
from proxy.limits.policy import FailMode, Policies
from proxy.limitstore.client import SLOTS, connect
from proxy.limitstore.guard import GuardedLimiter
from proxy.limitstore.headcount import CountFile
from proxy.limitstore.hosted import HostedLimiter
from proxy.limitstore.memory import InProcessLimiter
from proxy.limitstore.redislimiter import RedisLimiter
from proxy.limitstore.upkeep import HEARTBEAT_SECONDS
from proxy.metrics import Metrics
from proxy.settings import Settings

COUNT_FILE = "limits-replicas"  # beside the journal: the replica count last read


def build_limiter(
    settings: Settings,
    policies: Policies,
    metrics: Metrics | None = None,
    *,
    password: str | None = None,
    host: Path | None = None,
    part: int = 0,
) -> Limiter:
    """The limiter of ``policies``: in this process, on ``--limits-store``, or, for
    worker ``part`` of a pod without a store, on the pod's limiter ``host`` (its socket;
    connected in the limiter's lifetime)."""
    if settings.limits_store is not None:
        return build_shared_limiter(settings, policies, metrics, password=password)
    if host is not None:
        return HostedLimiter(policies, host, part)
    return InProcessLimiter(policies)


def build_shared_limiter(
    settings: Settings,
    policies: Policies,
    metrics: Metrics | None = None,
    *,
    password: str | None = None,
) -> GuardedLimiter:
    """``--limits-store``: the limiter on Redis/Valkey, behind its timeout, breaker and
    fail mode; ``password``: the store's (``serving.startup.store_password``)."""
    assert settings.limits_store is not None
    timeout = settings.limits_store_timeout
    client = connect(settings.limits_store, timeout=timeout, password=password)
    shared = RedisLimiter(
        policies,
        client,
        replica=settings.instance,
        reservation_ttl=settings.limits_reservation_ttl,
        grace=3 * HEARTBEAT_SECONDS,
    )
    return GuardedLimiter(
        shared,
        timeout=timeout,
        fail_mode=FailMode(settings.limits_fail_mode),
        replicas=settings.limits_replicas,
        metrics=metrics,
        slots=SLOTS,
        kept=count_file(settings),
    )


def count_file(settings: Settings) -> CountFile | None:
    """Where the replica count last read is kept: beside the journal (none without one,
    or with ``--limits-replicas``, which states it)."""
    if not settings.metering or settings.limits_replicas:
        return None
    return CountFile(Path(settings.journal).with_name(COUNT_FILE))

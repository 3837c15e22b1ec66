"""Limits shared by every replica on one Redis or Valkey store (``--limits-store``).

Each admission is one round trip: one Lua script checks every level that applies
(tenant, tenant x model, key) on the store's clock (``TIME``) and reserves at all of them
or none, answering what the ``x-ratelimit-*`` headers need. Settlement and release are
one round trip each and idempotent: a ticket carries a reservation id, and the first
settle or release of an id marks it done (a retry changes nothing).

The arithmetic is the in-process limiter's (``proxy.limits.rates``, ``meters``,
``periods``), written once more in Lua because it must run inside the store:

* rates are GCRA, one key holding the theoretical arrival time, expiring once it is past;
* calendar budgets are one hash per period (its start in the key name), expiring a day
  after the period ends: ``used`` (billed), ``reserved`` (held by requests in flight);
* reservations at budgets and gates are also members ``<id>|<units>`` of a sorted set
  scored by their expiry, so a crashed replica's reservations are given back when they
  expire (``--limits-reservation-ttl``); nothing leaks.

The store is a cache of the journals: when a budget's hash is missing (a store started
empty, or a new period), each replica adds the usage its own journal holds for that
period the first time it touches it (the hash remembers which replicas did, by
``--limits-replica-id``), so the budget is rebuilt and no replica is counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy.limits.limiter import Cost, Decision, Refusal, Standing, Ticket, Usage, Who
from proxy.limits.memory import History, InProcessLimiter
from proxy.limits.meters import GATE_RETRY_SECONDS, HELD_RETRY_SECONDS
from proxy.limits.periods import period
from proxy.limits.policy import RATE_SECONDS, FailMode, Limit, Policies
from proxy.settings import ENV_PREFIX, Settings

log = structlog.get_logger("proxy.serving.sharedlimits")
T = TypeVar("T")

# A budget's hash outlives its period by this much: a late settlement still lands.
BUDGET_GRACE_SECONDS = 86_400
# How long a settled or released id is remembered (a retry within it changes nothing).
DONE_SECONDS = 86_400

RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local id, ttl, replica, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local held_retry, gate_retry = tonumber(ARGV[5]), tonumber(ARGV[6])
local EPS = 1e-9
local state = {}
local worst, worst_wait, rebuilt = 0, 0, 0
for i = 1, n do
  local a = 6 + (i - 1) * 6
  local kind, amount, cost = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local span, own = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local k, z = KEYS[2 * i - 1], KEYS[2 * i]
  local wait = 0
  local s = {}
  if kind == 'r' then
    local interval = span / amount
    s.tat = tonumber(redis.call('GET', k) or '0')
    if cost > amount then
      wait = math.huge
    else
      local after = math.max(s.tat, now) + cost * interval
      if after - now > span + EPS then wait = math.max(after - span - now, 0) end
    end
  else
    local held = tonumber(redis.call('HGET', k, 'reserved') or '0')
    local expired = redis.call('ZRANGEBYSCORE', z, '-inf', now)
    if #expired > 0 then
      for _, m in ipairs(expired) do held = held - tonumber(string.match(m, '|(%d+)$')) end
      redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
      redis.call('HSET', k, 'reserved', held)
    end
    s.held = held
    s.used = 0
    if kind == 'b' then
      if redis.call('HSETNX', k, 'r:' .. replica, own) == 1 then
        s.used = redis.call('HINCRBY', k, 'used', own)
        rebuilt = rebuilt + 1
        redis.call('EXPIREAT', k, math.ceil(ARGV[a + 6]))
      else
        s.used = tonumber(redis.call('HGET', k, 'used') or '0')
      end
      if cost > amount then
        wait = math.huge
      elseif s.used + held + cost <= amount then
        wait = 0
      elseif s.used + cost <= amount then
        wait = math.min(held_retry, span - now)
      else
        wait = span - now
      end
    elseif held + cost > amount then
      wait = gate_retry
    end
  end
  state[i] = s
  if wait > 0 and (worst == 0 or wait > worst_wait) then worst, worst_wait = i, wait end
end
local admitted = 0
if worst == 0 then
  admitted = 1
  for i = 1, n do
    local a = 6 + (i - 1) * 6
    local kind, amount, cost = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local k, z, s = KEYS[2 * i - 1], KEYS[2 * i], state[i]
    if kind == 'r' then
      local span = tonumber(ARGV[a + 4])
      s.tat = math.max(s.tat, now) + cost * span / amount
      redis.call('SET', k, string.format('%.17g', s.tat), 'EXAT', math.ceil(s.tat) + 1)
    else
      s.held = redis.call('HINCRBY', k, 'reserved', cost)
      redis.call('ZADD', z, now + ttl, id .. '|' .. cost)
      local until_ = math.max(math.ceil(ARGV[a + 6]), math.ceil(now + ttl) + 1)
      redis.call('EXPIREAT', k, until_)
      redis.call('EXPIREAT', z, until_)
    end
  end
end
local out = {admitted, worst, string.format('%.17g', worst_wait), rebuilt}
for i = 1, n do
  local a = 6 + (i - 1) * 6
  local kind, amount = ARGV[a + 1], tonumber(ARGV[a + 2])
  local span, s = tonumber(ARGV[a + 4]), state[i]
  local remaining, reset
  if kind == 'r' then
    local interval = span / amount
    local room = span - math.max(s.tat - now, 0)
    remaining = math.max(math.min(amount, math.floor(room / interval + EPS)), 0)
    reset = math.max(s.tat - now, 0)
  elseif kind == 'b' then
    remaining = math.max(amount - s.used - s.held, 0)
    reset = span - now
  else
    remaining = math.max(amount - s.held, 0)
    reset = 0
  end
  out[#out + 1] = remaining
  out[#out + 1] = string.format('%.17g', reset)
end
return out
"""

END = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[4])) then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local id, replica, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local settle = ARGV[5] == 'settle'
local rebuilt = 0
for i = 1, n do
  local a = 5 + (i - 1) * 6
  local kind, reserved, billed = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local interval, own, expire_at = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), ARGV[a + 6]
  local k, z = KEYS[2 * i], KEYS[2 * i + 1]
  if kind == 'r' then
    local tat = tonumber(redis.call('GET', k) or '0') - (reserved - billed) * interval
    if tat > now then
      redis.call('SET', k, string.format('%.17g', tat), 'EXAT', math.ceil(tat) + 1)
    else
      redis.call('DEL', k)
    end
  else
    if redis.call('ZREM', z, id .. '|' .. reserved) == 1 then
      redis.call('HINCRBY', k, 'reserved', -reserved)
    end
    if kind == 'b' and settle then
      if redis.call('HSETNX', k, 'r:' .. replica, own) == 1 then
        redis.call('HINCRBY', k, 'used', own)
        rebuilt = rebuilt + 1
      else
        redis.call('HINCRBY', k, 'used', billed)
      end
      redis.call('EXPIREAT', k, math.ceil(expire_at))
    end
  end
end
return rebuilt
"""

_KIND = {"rate": "r", "budget": "b", "gate": "g"}


@dataclass(frozen=True, slots=True)
class Taken:
    """One level's part of a reservation in the store."""

    scope: tuple[str, ...]
    limit: Limit
    key: str
    holds: str
    kind: str  # r (rate), b (budget), g (gate)
    span: float  # a rate's window; a budget's period end (Unix seconds)
    start: float  # a budget's period start


@dataclass(slots=True)
class StoreTicket(Ticket):
    """A reservation in the store: its id and the keys it took from."""

    id: str = ""
    parts: list[Taken] = field(default_factory=list)


class RedisLimiter:
    """``proxy.limits.limiter.Limiter`` on a Redis/Valkey store shared by replicas."""

    def __init__(
        self,
        policies: Policies,
        client: Redis,
        *,
        namespace: str = "usage-proxy",
        replica: str = "replica",
        reservation_ttl: float = 600.0,
    ) -> None:
        self.policies = policies
        self.client = client
        self.namespace = namespace
        self.replica = replica
        self.reservation_ttl = reservation_ttl
        self.history = History()  # this replica's billed usage: what it adds to a rebuild
        self.rebuilt = 0  # budgets this replica added its usage to (store empty or new period)
        self._reserve: Any = client.register_script(RESERVE)
        self._end: Any = client.register_script(END)

    def replace(self, policies: Policies) -> None:
        self.policies = policies

    def wants_tokens(self, tenant: str) -> bool:
        return self.policies.wants_tokens(tenant)

    def _key(self, scope: tuple[str, ...], limit: Limit, suffix: str) -> str:
        # {tenant}: every key of a tenant in one hash slot (a cluster runs the script).
        rest = ":".join(scope[2:])
        return f"{self.namespace}:{{{scope[1]}}}:{scope[0]}:{rest}:{limit.name}{suffix}"

    def _parts(self, who: Who, now: float) -> list[Taken]:
        parts = []
        zone = self.policies.zone
        for level in self.policies.levels(who.tenant, who.model, who.key):
            for limit in level.limits:
                if limit.window is None:
                    kind, span, start, suffix = "g", 0.0, 0.0, ""
                elif limit.budget:
                    start, span = period(limit.window, now, zone)
                    kind, suffix = "b", f":{int(start)}"
                else:
                    kind, span, start, suffix = "r", float(RATE_SECONDS[limit.window]), 0.0, ""
                key = self._key(level.scope, limit, suffix)
                parts.append(Taken(level.scope, limit, key, key + ":holds", kind, span, start))
        return parts

    def _own(self, part: Taken) -> int:
        if part.kind != "b":
            return 0
        return self.history.used(part.scope, part.limit.unit, part.start, part.span)

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        parts = self._parts(who, now)
        if not parts:
            return Decision(Ticket(who, cost), None, None, None)
        rid = uuid.uuid4().hex
        keys: list[str] = []
        args: list[Any] = [rid, self.reservation_ttl, self.replica, len(parts)]
        args += [HELD_RETRY_SECONDS, GATE_RETRY_SECONDS]
        for part in parts:
            keys += [part.key, part.holds]
            expire = part.span + BUDGET_GRACE_SECONDS if part.kind == "b" else 0
            args += [
                part.kind,
                part.limit.amount,
                cost.of(part.limit.unit),
                part.span,
                self._own(part),
                expire,
            ]
        out = await self._reserve(keys=keys, args=args)
        admitted, worst, worst_wait, rebuilt = int(out[0]), int(out[1]), float(out[2]), out[3]
        self.rebuilt += int(rebuilt)
        standings = [(int(out[4 + 2 * i]), float(out[5 + 2 * i])) for i in range(len(parts))]
        headers = _standings(parts, standings)
        if not admitted:
            part = parts[worst - 1]
            limit = part.limit
            refusal = Refusal(
                limit.name,
                part.scope,
                worst_wait,
                cost.of(limit.unit),
                limit.amount,
                limit.budget,
            )
            return Decision(None, refusal, *headers)
        ticket = StoreTicket(who, cost, id=rid, parts=parts)
        ticket.taken = [(p.scope, p.limit.name, p.limit.unit) for p in parts]
        return Decision(ticket, None, *headers)

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        if not ticket.open:
            return
        self.history.note(ticket.who, billed, now)
        await self._finish(ticket, billed, "settle")
        ticket.open = False

    async def release(self, ticket: Ticket, now: float) -> None:
        if not ticket.open:
            return
        await self._finish(ticket, Cost(0, 0, 0), "release")
        ticket.open = False

    async def _finish(self, ticket: Ticket, billed: Cost, mode: str) -> None:
        if not isinstance(ticket, StoreTicket) or not ticket.parts:
            return
        keys = [f"{self.namespace}:done:{ticket.id}"]
        args: list[Any] = [ticket.id, self.replica, len(ticket.parts), DONE_SECONDS, mode]
        for part in ticket.parts:
            keys += [part.key, part.holds]
            unit = part.limit.unit
            interval = part.span / part.limit.amount if part.kind == "r" else 0
            args += [
                part.kind,
                ticket.cost.of(unit),
                billed.of(unit),
                interval,
                self._own(part),  # including this record: noted before
                part.span + BUDGET_GRACE_SECONDS if part.kind == "b" else 0,
            ]
        rebuilt = await self._end(keys=keys, args=args)
        self.rebuilt += max(int(rebuilt), 0)

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        taken = 0
        for usage in history:
            self.history.note(usage.who, usage.cost, usage.at)
            taken += 1
        return taken


def _standings(
    parts: list[Taken], standings: list[tuple[int, float]]
) -> tuple[Standing | None, Standing | None, tuple[tuple[str, int], ...]]:
    """As ``proxy.limits.memory``: the tightest request and token limits, and what is
    left of the tenant's budgets."""
    requests: Standing | None = None
    tokens: Standing | None = None
    budgets: list[tuple[str, int]] = []
    for part, (remaining, reset) in zip(parts, standings, strict=True):
        limit = part.limit
        if limit.window is None:
            continue
        standing = Standing(limit.amount, remaining, reset)
        if limit.budget and part.scope[0] == "tenant":
            budgets.append((limit.name, remaining))
        if limit.tokens:
            tokens = standing if tokens is None or remaining < tokens.remaining else tokens
        elif requests is None or remaining < requests.remaining:
            requests = standing
    return requests, tokens, tuple(budgets)


class Breaker:
    """Consecutive store failures open it for ``cooldown`` seconds: a dead or slow store
    costs each request nothing after the first failures. After the cooldown one request
    tries the store again (half open): a success closes it, a failure opens it again."""

    def __init__(self, failures: int = 3, cooldown: float = 1.0) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self.count = 0
        self.open_until = 0.0

    @property
    def open(self) -> bool:
        return self.count >= self.failures

    def allows(self, now: float) -> bool:
        if not self.open:
            return True
        if now >= self.open_until:  # half open: this one request tries
            self.open_until = now + self.cooldown
            return True
        return False

    def failed(self, now: float) -> None:
        self.count += 1
        if self.open:
            self.open_until = now + self.cooldown

    def succeeded(self) -> bool:
        """Close; whether it was open (the store is back)."""
        was = self.open
        self.count = 0
        return was


@dataclass(slots=True)
class LocalTicket(Ticket):
    """A reservation made in this process while the store was unreachable (``local`` or
    ``open``): its usage is charged to the store once it is back."""

    id: str = ""
    inner: Ticket | None = None


class GuardedLimiter:
    """The shared limiter behind a short timeout and a circuit breaker, with the fail
    mode of each tenant while the store is unreachable: ``closed`` refuses (503),
    ``open`` admits, ``local`` enforces this replica's share (limit / live replicas) in
    process. Usage billed while the store was away is charged to it when it is back
    (idempotently: by reservation id)."""

    def __init__(
        self,
        shared: RedisLimiter,
        *,
        timeout: float,
        fail_mode: FailMode,
        replicas: int = 1,
        breaker: Breaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.timeout = timeout
        self.fail_mode = fail_mode
        self.breaker = breaker or Breaker()
        self.replicas = max(replicas, 1)
        self.local = InProcessLimiter(shared.policies.divided(self.replicas))
        self.errors = 0
        self.fail_admissions: dict[FailMode, int] = dict.fromkeys(FailMode, 0)
        self.pending: list[tuple[Ticket, Cost]] = []  # settled while the store was away
        self.slowest = 0.0  # the longest a store call took (failed ones included), seconds
        self._clock = clock
        self._reconciling: asyncio.Task[int] | None = None
        self._stale = True  # the local budgets re-read this replica's usage on next use

    @property
    def policies(self) -> Policies:
        return self.shared.policies

    @policies.setter
    def policies(self, policies: Policies) -> None:
        self.replace(policies)

    def replace(self, policies: Policies) -> None:
        self.shared.replace(policies)
        self.local.replace(policies.divided(self.replicas))

    def set_replicas(self, replicas: int) -> None:
        """The live replica count (read from the store, or configured)."""
        replicas = max(replicas, 1)
        if replicas != self.replicas:
            self.replicas = replicas
            self.local.replace(self.shared.policies.divided(replicas))

    def wants_tokens(self, tenant: str) -> bool:
        return self.shared.wants_tokens(tenant)

    async def _call(self, call: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)

    def _failed(self, what: str) -> None:
        self.errors += 1
        self.breaker.failed(self._clock())
        log.warning("limits_store_failed", op=what, breaker_open=self.breaker.open)

    def _back(self) -> None:
        self._stale = True
        if self.breaker.succeeded() or self.pending:
            log.info("limits_store_back", pending=len(self.pending))
            if self._reconciling is None or self._reconciling.done():
                self._reconciling = asyncio.get_running_loop().create_task(self.reconcile())

    async def reserve(self, who: Who, cost: Cost, now: float) -> Decision:
        if self.breaker.allows(self._clock()):
            try:
                decision = await self._call(self.shared.reserve(who, cost, now))
            except (RedisError, OSError, TimeoutError):
                self._failed("reserve")
            else:
                self._back()
                return decision
        mode = self.shared.policies.fail_mode(who.tenant, self.fail_mode)
        self.fail_admissions[mode] += 1
        if mode is FailMode.CLOSED:
            refusal = Refusal("limits_store", ("tenant", who.tenant), 0.0, 0, 0, False, True)
            return Decision(None, refusal, None, None)
        if mode is FailMode.OPEN:
            return Decision(LocalTicket(who, cost, id=uuid.uuid4().hex), None, None, None)
        if self._stale:  # this replica's usage billed through the store counts here too
            self._stale = False
            await self.local.restore((), now)
        decision = await self.local.reserve(who, cost, now)
        if decision.ticket is None:
            return decision
        ticket = LocalTicket(who, cost, id=uuid.uuid4().hex, inner=decision.ticket)
        return Decision(ticket, None, decision.requests, decision.tokens, decision.budgets)

    async def settle(self, ticket: Ticket, billed: Cost, now: float) -> None:
        await self._end(ticket, billed, now, settle=True)

    async def release(self, ticket: Ticket, now: float) -> None:
        await self._end(ticket, Cost(0, 0, 0), now, settle=False)

    async def _end(self, ticket: Ticket, billed: Cost, now: float, *, settle: bool) -> None:
        if not ticket.open:
            return
        if isinstance(ticket, LocalTicket):
            ticket.open = False
            if ticket.inner is not None:
                if settle:
                    await self.local.settle(ticket.inner, billed, now)
                else:
                    await self.local.release(ticket.inner, now)
            if settle:  # charged to the store when it is back
                self.shared.history.note(ticket.who, billed, now)
                parts = self.shared._parts(ticket.who, now)
                stored = StoreTicket(ticket.who, Cost(0, 0, 0), id=ticket.id, parts=parts)
                self.pending.append((stored, billed))
            return
        if settle:
            self.shared.history.note(ticket.who, billed, now)
            self.local.history.note(ticket.who, billed, now)
            self._stale = True  # a settlement after an outage began counts in its share
        mode = "settle" if settle else "release"
        if self.breaker.allows(self._clock()):
            try:
                await self._call(self.shared._finish(ticket, billed, mode))
            except (RedisError, OSError, TimeoutError):
                self._failed(mode)
            else:
                ticket.open = False
                self._back()
                return
        ticket.open = False  # the store's reservation expires by its TTL
        if settle:
            self.pending.append((ticket, billed))

    async def reconcile(self) -> int:
        """Charge the store with the usage billed while it was away (each by its id, so
        a retry never charges twice); what stays pending when it fails again."""
        done = 0
        while self.pending:
            ticket, billed = self.pending[0]
            try:
                await self._call(self.shared._finish(ticket, billed, "settle"))
            except (RedisError, OSError, TimeoutError):
                self._failed("reconcile")
                break
            self.pending.pop(0)
            done += 1
        log.info("limits_reconciled", records=done, pending=len(self.pending))
        return done

    async def restore(self, history: Iterable[Usage], now: float) -> int:
        rows = list(history)
        await self.local.restore(rows, now)
        return await self.shared.restore(rows, now)

    async def beat(self, ttl: float) -> int | None:
        """Tell the store this replica is alive; the live replica count (None: store
        unreachable, the last count stays)."""
        key = f"{self.shared.namespace}:replicas"
        client = self.shared.client
        try:
            async with asyncio.timeout(max(self.timeout, 1.0)):
                now = float((await client.time())[0])
                async with client.pipeline(transaction=True) as pipe:
                    pipe.zadd(key, {self.shared.replica: now})
                    pipe.zremrangebyscore(key, "-inf", now - ttl)
                    pipe.zcard(key)
                    pipe.expire(key, int(ttl) + 1)
                    result = await pipe.execute()
        except (RedisError, OSError, TimeoutError):
            return None
        count = int(result[2])
        self.set_replicas(count)
        return count


HEARTBEAT_SECONDS = 5.0


def store_password(settings: Settings) -> str | None:
    """The store's password: from the environment, or a file (never the command line)."""
    password = os.environ.get(ENV_PREFIX + "LIMITS_STORE_PASSWORD")
    if settings.limits_store_password_file is not None:
        password = settings.limits_store_password_file.read_text(encoding="utf-8").strip()
    return password or None


def build_shared_limiter(settings: Settings, policies: Policies) -> GuardedLimiter:
    """``--limits-store``: the limiter on Redis/Valkey (valkey:// is redis://), behind its
    timeout, breaker and fail mode. Connections open on first use."""
    assert settings.limits_store is not None
    url = settings.limits_store
    for alias, scheme in (("valkeys://", "rediss://"), ("valkey://", "redis://")):
        if url.startswith(alias):
            url = scheme + url.removeprefix(alias)
    timeout = settings.limits_store_timeout
    pool = BlockingConnectionPool.from_url(
        url,
        password=store_password(settings),
        max_connections=64,
        timeout=timeout,  # waiting for a free connection counts against it too
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    client = Redis.from_pool(pool)  # owns the pool: aclose disconnects it
    shared = RedisLimiter(
        policies,
        client,
        replica=settings.instance,
        reservation_ttl=settings.limits_reservation_ttl,
    )
    return GuardedLimiter(
        shared,
        timeout=timeout,
        fail_mode=FailMode(settings.limits_fail_mode),
        replicas=settings.limits_replicas or 1,
    )


def store_context(limiter: GuardedLimiter, replicas: int) -> Callable[[Any], AsyncIterator[None]]:
    """cleanup_ctx: this replica's heartbeat in the store (the live count divides the
    limits in local fail mode unless --limits-replicas fixes it); the client closed."""

    async def ctx(app: Any) -> AsyncIterator[None]:
        async def beat() -> None:
            while True:
                count = await limiter.beat(3 * HEARTBEAT_SECONDS)
                if replicas:
                    limiter.set_replicas(replicas)
                elif count is not None:
                    log.debug("limits_replicas", live=count)
                await asyncio.sleep(HEARTBEAT_SECONDS)

        task = asyncio.get_running_loop().create_task(beat())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await limiter.shared.client.aclose()

    return ctx

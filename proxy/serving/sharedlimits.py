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

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from proxy.limits.limiter import Cost, Decision, Refusal, Standing, Ticket, Usage, Who
from proxy.limits.memory import History
from proxy.limits.meters import GATE_RETRY_SECONDS, HELD_RETRY_SECONDS
from proxy.limits.periods import period
from proxy.limits.policy import RATE_SECONDS, Limit, Policies

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

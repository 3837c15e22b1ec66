"""The store's data model, told once here: every key the shared limiter keeps in Redis or
Valkey, under a namespace (``<ns>``), and the parts a reservation takes.

* ``<ns>:{<tenant>}:<level>:<rest>:<limit>[:<period start>]``: one key per limit of each
  level (tenant, tenant x model, key); the tenant is the hash tag, so every key of a
  tenant's levels is in one hash slot and one script may touch them all.
  * a rate (GCRA) holds its theoretical arrival time, expiring once it is past;
  * a calendar budget is one hash per period (its start in the key name), expiring a day
    after the period ends: ``u:<replica>``, what that replica's journal billed in the
    period (written as a total: raised, never added to), ``used``, their sum, and
    ``reserved``, what requests in flight hold: those the store admitted, and those a
    replica admitted without it, taken by its next contribution;
  * a concurrency gate holds nothing but its holds.
* ``<key>:holds``: a budget's or gate's reservations in flight, members ``<id>|<units>``
  of a sorted set scored by their expiry (``--limits-reservation-ttl``), so a crashed
  replica's holds are given back when they expire; a live replica renews its own.
* ``<ns>:gen``: the generation marker: its ``id``, ``since`` (when it began), ``expect``
  (the replicas declared) and ``seen`` (the most a replica counted), ``c:<replica>`` for
  each replica that contributed its journal to it, ``complete`` once whole, and ``run``
  (the server run it was made on): while it lives, the budgets are whole.
* ``<ns>:replicas`` and ``<ns>:joined``: the registry of live replicas (scored by their
  last heartbeat) and when each one's current stay in it began.
* ``<ns>:done:<id>``: a reservation id already ended (settled, released or cancelled):
  the first end of an id is the only one that adds units.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.limits.limiter import Who
from proxy.limits.periods import period
from proxy.limits.policy import RATE_SECONDS, Limit, Policies
from proxy.limitstore.tickets import Taken


@dataclass(frozen=True, slots=True)
class Keyspace:
    """The names of the shared limiter's keys under one namespace."""

    namespace: str = "usage-proxy"

    @property
    def generation(self) -> str:
        return f"{self.namespace}:gen"

    @property
    def registry(self) -> str:
        return f"{self.namespace}:replicas"

    @property
    def joined(self) -> str:
        return f"{self.namespace}:joined"

    def done(self, rid: str) -> str:
        return f"{self.namespace}:done:{rid}"

    def _key(self, scope: tuple[str, ...], limit: Limit, suffix: str) -> str:
        rest = ":".join(scope[2:])
        return f"{self.namespace}:{{{scope[1]}}}:{scope[0]}:{rest}:{limit.name}{suffix}"

    def budget(self, scope: tuple[str, ...], limit: Limit, start: float) -> str:
        """The hash of a budget's period starting at ``start``."""
        return self._key(scope, limit, f":{int(start)}")

    def parts(self, policies: Policies, who: Who, now: float) -> list[Taken]:
        """Every limit of ``policies`` that applies to ``who``, with its keys."""
        parts = []
        zone = policies.zone
        for level in policies.levels(who.tenant, who.model, who.key):
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

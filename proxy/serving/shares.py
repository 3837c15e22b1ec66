"""Each tenant's share of what bounds everyone: requests holding an upstream connection
(``--upstream-connections``) and request bodies held in memory
(``--max-inflight-body-bytes``).

Work-conserving: a tenant may go past its share while the rest of the bound is free, but
never into the last share's worth of it, which stays for the others; there, its next
request gets 429 with ``Retry-After`` while the others keep their service. A tenant's
lone request is never refused for its share. Only where tenants are told apart (an API-key
map or a tenant header): a proxy whose every request is ``anonymous`` has no one to share
with.
"""

from __future__ import annotations

from collections import Counter

import structlog
from aiohttp import web

from proxy.metrics import Metrics
from proxy.serving.upstream import error_response

log = structlog.get_logger("proxy.serving.shares")


class TenantShares:
    def __init__(
        self,
        connections: int,
        body_bytes: int,
        share: float,
        metrics: Metrics,
        *,
        enforced: bool = True,
    ) -> None:
        self.limits = (connections, body_bytes)
        self.connections = max(1, int(connections * share))
        self.body_bytes = max(1, int(body_bytes * share))
        self.enforced = enforced and share < 1
        self._open: Counter[str] = Counter()
        self._held: Counter[str] = Counter()
        self._metrics = metrics

    def enter(self, tenant: str) -> web.Response | None:
        """Take one of the upstream slots for ``tenant``; a 429 past its share when the
        others' last share would be taken."""
        mine, total = self._open[tenant], self._open.total()
        if self._over(mine, 1, self.connections, total, self.limits[0]):
            self._metrics.refused.labels("429").inc()
            return self._refuse(tenant, f"{mine} requests in flight")
        self._open[tenant] += 1
        return None

    def leave(self, tenant: str) -> None:
        self._open[tenant] -= 1
        if not self._open[tenant]:
            del self._open[tenant]

    def hold(self, tenant: str, size: int) -> web.Response | None:
        """Count ``size`` bytes of body against ``tenant``; a 429 as ``enter`` says."""
        mine, total = self._held[tenant], self._held.total()
        if mine and self._over(mine, size, self.body_bytes, total, self.limits[1]):
            return self._refuse(tenant, f"{mine >> 20} MiB of request bodies held")
        self._held[tenant] += size
        return None

    def release(self, tenant: str, size: int) -> None:
        self._held[tenant] -= size
        if not self._held[tenant]:
            del self._held[tenant]

    def _over(self, mine: int, more: int, share: int, total: int, limit: int) -> bool:
        """Past its share, into the last share of the bound the others may need."""
        return self.enforced and mine + more > share and total + more > limit - share

    def _refuse(self, tenant: str, what: str) -> web.Response:
        log.warning("tenant_share_exhausted", tenant=tenant, holds=what)
        reply = error_response(
            429, f"this tenant already has {what}, its share of the proxy (--tenant-share); retry"
        )
        reply.headers["Retry-After"] = "1"
        return reply

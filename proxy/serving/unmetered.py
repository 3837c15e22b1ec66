"""What ``--allow-unmetered`` relays although nothing bills it: refused routes, unknown
paths, and request features whose answers carry no usage. Never silent: each use is
logged and counted."""

from __future__ import annotations

import structlog

from proxy.metrics import Metrics

log = structlog.get_logger("proxy.serving.unmetered")


class Unmetered:
    """What ``--allow-unmetered`` relays without a record: each use is logged and counted."""

    def __init__(self, allowed: frozenset[str], metrics: Metrics) -> None:
        self._exact = frozenset(a for a in allowed if not a.endswith("*"))
        self._prefixes = tuple(a[:-1] for a in allowed if a.endswith("*"))
        self.features = frozenset(a for a in allowed if not a.startswith("/"))
        self._metrics = metrics

    def allows(self, path: str) -> bool:
        return path in self._exact or path.startswith(self._prefixes)

    def relayed(self, what: str, method: str = "POST") -> None:
        log.info("unmetered_relayed", what=what, method=method)
        self._metrics.unmetered.labels(what if what in self._exact else "other").inc()

"""What makes a process ready (``/readyz``): the verdict ``create_app``
builds from its catalog, journal, limits store and prices. Apart from ``admin``, which the
supervisor's admin port imports without the application (the catalog's tokenizers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.ledger.journal import Journal
from proxy.serving.catalog import Catalog
from proxy.serving.readiness import Check

StoreProblem = Callable[[], tuple[str, bool] | None]
# Why the price table in use lacks a price a money budget needs (PricesFile.unpriced).
PricesProblem = Callable[[], str | None]


def readiness_check(
    catalog: Catalog,
    journal: Journal | None,
    store: StoreProblem | None,
    prices: PricesProblem | None = None,
) -> Check:
    """Ready when discovery has reached the upstream, every served model can be audited,
    and records can be journaled (a load balancer then drains a pod whose disk failed).
    The limits store's problem is reported; it fails readiness only when ``store`` says
    so (unreachable in closed mode). A model a money budget applies to without a price in
    force is reported (``prices``) and never fails readiness: every replica shares the
    price file, so draining one helps nobody, and only that budget's requests are refused.
    A pod's worker sends the same verdict to its supervisor every second."""

    async def check() -> tuple[bool, dict[str, Any]]:
        problems = {name: m.problem for name, m in catalog.models.items() if m.problem}
        if not catalog.ready.is_set():
            problems["upstream"] = catalog.problem or "discovery has not completed yet"
        elif not catalog.models:
            problems["upstream"] = "the upstream's /v1/models lists no model"
        if journal is not None and not journal.healthy and not await journal.probe():
            problems["journal"] = journal.problem or "records cannot be journaled"
        found = store() if store is not None else None
        ready = catalog.ready.is_set() and not problems and bool(catalog.models)
        if found is not None:
            problems["limits_store"], fails = found
            ready = ready and not fails
        unpriced = prices() if prices is not None else None
        if unpriced is not None:
            problems["prices"] = unpriced
        body = {
            "status": "ready" if ready else "not ready",
            "upstream_version": catalog.release.version,
            "models": sorted(catalog.models),
            "problems": problems,
        }
        return ready, body

    return check

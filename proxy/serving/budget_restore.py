"""The budgets rebuilt at start (``cleanup_ctx``, after the journal opens): each budget's
period usage from the journal's records and those of the shards this process adopted, so
a restart does not reset a month. Apart from ``budget_history``, which the supervisor
imports without the application."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import structlog
from aiohttp import web

from proxy.ledger.journal import Journal
from proxy.metrics import Metrics
from proxy.serving.admission import Admission
from proxy.serving.budget_history import history_start, journal_history, shard_history

log = structlog.get_logger("proxy.serving.budget_restore")


def restore_context(
    admission: Admission,
    journal: Journal | None,
    metrics: Metrics,
    adopted: Sequence[Path] = (),
) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx (after the journal opens): each budget's period usage rebuilt from the
    journal's records and those of the ``adopted`` shards (a larger pod's, this process
    delivers them), so a restart does not reset a month."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if journal is not None:
            now = time.time()
            since = history_start(admission.limiter.policies, now)
            history, restored = await journal_history(journal, since, admission.table)
            for path in adopted:
                more, count = await shard_history(path, since, admission.table)
                history, restored = history + more, restored + count
            await admission.limiter.restore(history, now)
            metrics.limits_restored.inc(restored)
            log.info("budgets_restored", since=since.isoformat(), records=restored)
        yield

    return ctx

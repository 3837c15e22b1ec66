"""The ``--limits`` file, reloaded while the proxy runs, as the key file is: on ``SIGHUP``
and when the file changes (``proxy.serving.filewatch``: a ConfigMap's symlink swap too).

New policies are validated whole before they replace the ones in use; a file that cannot
be read or validated is logged and counted, and the policies in use stay. Reservations
held keep the meters they took from; budgets keep their period's usage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path

import structlog
from aiohttp import web

from proxy.limits.limiter import Limiter
from proxy.limits.policy import Policies
from proxy.limits.problems import mistakes, read_limits, summary
from proxy.metrics import Metrics
from proxy.serving.catalog import Catalog
from proxy.serving.filewatch import POLL_SECONDS, Context, FileWatch, watch_context

log = structlog.get_logger("proxy.serving.limitsfile")


class LimitsFile:
    """The file in use: reloaded when asked or changed, each load said in the log with
    what it sets, and what in it is probably a mistake (a file that limits nothing, a
    tenant the key file does not name, a model the upstream does not serve) warned."""

    def __init__(
        self,
        path: Path,
        limiter: Limiter,
        metrics: Metrics,
        poll: float = POLL_SECONDS,
        *,
        check: Callable[[Policies], str | None] = lambda policies: None,
        tenants: Callable[[], Collection[str] | None] = lambda: None,
        catalog: Catalog | None = None,
    ) -> None:
        self.path = path
        self._limiter = limiter
        self._metrics = metrics
        # why policies cannot be used with the prices in use (a money budget on a model
        # without a price), or None
        self._check = check
        self._tenants = tenants
        self._catalog = catalog
        self._watch = FileWatch(path, poll)
        metrics.limits_loaded_at.set(time.time())
        announce(path, limiter.policies, "start", self._known())

    def reload(self, why: str) -> bool:
        """Load the file now; True when its policies are in use."""
        self._watch.loading()
        try:
            policies = read_limits(self.path)
            problem = self._check(policies)
            if problem is not None:
                raise ValueError(problem)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and LimitsFileError too
            self._metrics.limits_reload_failures.inc()
            log.error("limits_reload_failed", path=str(self.path), why=why, error=str(exc)[:500])
            return False
        self._limiter.replace(policies)
        self._metrics.limits_loaded_at.set(time.time())
        announce(self.path, policies, why, self._known())
        return True

    def _known(self) -> dict[str, Collection[str] | None]:
        """What the file is held against: the key file's tenants, the served models
        (once discovered)."""
        ready = self._catalog is not None and self._catalog.ready.is_set()
        models = list(self._catalog.models) if self._catalog is not None and ready else None
        return {"tenants": self._tenants(), "models": models}

    async def check_models(self) -> None:
        """Once the upstream's models are known, warn of limits on models it lacks."""
        if self._catalog is None:
            return
        await self._catalog.ready.wait()
        served = list(self._catalog.models)
        for problem in mistakes(self._limiter.policies, models=served):
            if ".models." in problem:
                log.warning("limits_mistake", path=str(self.path), problem=problem)

    async def watch(self) -> None:
        await self._watch.run(self.reload)


def announce(
    path: Path, policies: Policies, why: str, known: dict[str, Collection[str] | None]
) -> None:
    """One log line for a limits file now in use, with what it sets; a warning for each
    probable mistake (a file that limits nothing is ``limits_empty``)."""
    seen = summary(policies)
    log.info(
        "limits_loaded",
        path=str(path),
        why=why,
        policies=seen.levels,
        limits=seen.limits,
        budgets=seen.budgets,
        tenants=seen.tenants,
        default=seen.default,
        timezone=policies.timezone,
    )
    for problem in mistakes(policies, models=known["models"], tenants=known["tenants"]):
        event = "limits_empty" if not seen.limits else "limits_mistake"
        log.warning(event, path=str(path), problem=problem)


LIMITSFILE = web.AppKey("limits_file", LimitsFile)


def limits_file_context(limits: LimitsFile) -> Context:
    """cleanup_ctx: the file's watch, and the check of its models once they are known,
    for the application's lifetime."""
    return watch_context({"limits-file": limits.watch, "limits-models": limits.check_models})

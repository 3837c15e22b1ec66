"""The ``--limits`` file, reloaded while the proxy runs, as the key file is: on ``SIGHUP``
and when the file changes (polled, so a Kubernetes ConfigMap's symlink swap is seen).

New policies are validated whole before they replace the ones in use; a file that cannot
be read or validated is logged and counted, and the policies in use stay. Reservations
held keep the meters they took from; budgets keep their period's usage.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog
import yaml
from aiohttp import web
from pydantic import ValidationError

from proxy.limits.limiter import Limiter
from proxy.limits.policy import Policies, load_policies
from proxy.metrics import Metrics
from proxy.serving.keyfile import POLL_SECONDS, Stamp

log = structlog.get_logger("proxy.serving.limitsfile")


def read_stamp(path: Path) -> Stamp | None:
    """What changes when the file does (as ``KeyFile`` reads it): where the path leads,
    and that file's identity, size and modification time."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


class LimitsFile:
    def __init__(
        self,
        path: Path,
        limiter: Limiter,
        metrics: Metrics,
        poll: float = POLL_SECONDS,
        *,
        check: Callable[[Policies], str | None] = lambda policies: None,
    ) -> None:
        self.path = path
        self._limiter = limiter
        self._metrics = metrics
        self._poll = poll
        # why policies cannot be used with the prices in use (a money budget on a model
        # without a price), or None
        self._check = check
        self._stamp: Stamp | None = read_stamp(path)
        metrics.limits_loaded_at.set(time.time())

    def reload(self, why: str) -> bool:
        """Load the file now; True when its policies are in use."""
        self._stamp = read_stamp(self.path)
        try:
            policies = load_policies(self.path)
            problem = self._check(policies)
            if problem is not None:
                raise ValueError(problem)
        except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError, ValidationError) as exc:
            self._metrics.limits_reload_failures.inc()
            log.error("limits_reload_failed", path=str(self.path), why=why, error=str(exc)[:500])
            return False
        self._limiter.replace(policies)
        self._metrics.limits_loaded_at.set(time.time())
        log.info("limits_loaded", path=str(self.path), why=why, **_summary(policies))
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll)
            if read_stamp(self.path) != self._stamp:
                self.reload("changed")


def _summary(policies: Policies) -> dict[str, object]:
    return {
        "tenants": len(policies.tenants),
        "default": policies.default is not None,
        "timezone": policies.timezone,
    }


LIMITSFILE = web.AppKey("limits_file", LimitsFile)


def limits_file_context(limits: LimitsFile) -> Callable[[web.Application], AsyncIterator[None]]:
    """cleanup_ctx: the file's watch, for the application's lifetime."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(limits.watch(), name="limits-file")
        yield
        task.cancel()

    return ctx

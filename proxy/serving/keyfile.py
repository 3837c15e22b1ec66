"""The ``--api-keys`` file, reloaded while the proxy runs: on ``SIGHUP`` and when the file
changes (``proxy.serving.filewatch``: a Kubernetes Secret's symlink swap is a change).

A new map is loaded and validated whole before it replaces the old one in one
assignment; a file that cannot be read or holds no valid map is logged and counted, and
the map in use stays. A removed key is refused from the next request on; a request
already attributed keeps its tenant.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog
import yaml
from aiohttp import web

from proxy.metrics import Metrics
from proxy.serving.filewatch import POLL_SECONDS, Context, FileWatch, watch_context
from proxy.serving.tenancy import TenantResolver, load_api_keys

log = structlog.get_logger("proxy.serving.keyfile")


class KeyFile:
    def __init__(
        self, path: Path, resolver: TenantResolver, metrics: Metrics, poll: float = POLL_SECONDS
    ) -> None:
        self.path = path
        self._resolver = resolver
        self._metrics = metrics
        self._watch = FileWatch(path, poll)
        self._loaded(resolver.key_count)

    def reload(self, why: str) -> bool:
        """Load the file now; True when the new map is in use."""
        self._watch.loading()
        try:
            keys = load_api_keys(self.path)
            if not keys:
                raise ValueError("lists no keys")
        except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError) as exc:
            self._metrics.keys_reload_failures.inc()
            log.error("keys_reload_failed", path=str(self.path), why=why, error=str(exc)[:300])
            return False
        self._resolver.replace_keys(keys)
        self._metrics.trust(keys.values())
        self._loaded(len(keys))
        log.info("keys_loaded", path=str(self.path), why=why, keys=len(keys))
        return True

    def _loaded(self, keys: int) -> None:
        self._metrics.keys_loaded.set(keys)
        self._metrics.keys_loaded_at.set(time.time())

    async def watch(self) -> None:
        await self._watch.run(self.reload)


KEYFILE = web.AppKey("key_file", KeyFile)


def key_file_context(keys: KeyFile) -> Context:
    """cleanup_ctx: the file's watch, for the application's lifetime."""
    return watch_context({"key-file": keys.watch})

"""Where a worker of ``serve --workers N`` stands in its pod (docs/workers.md): its index,
the pod's size, and the supervisor's private runtime directory, which holds the control
socket, the limiter host's socket and the multiprocess metrics directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.ledger.shards import adopted, shard_path
from proxy.settings import Settings


@dataclass(frozen=True, slots=True)
class Place:
    """Worker ``index`` of ``workers``, under the supervisor's ``runtime`` directory."""

    index: int
    workers: int
    runtime: Path

    @property
    def control_socket(self) -> Path:
        """The supervisor's control channel (hello, ping and readiness, pod state)."""
        return self.runtime / "control.sock"

    @property
    def limiter_socket(self) -> Path:
        """The pod's limiter host (``limitstore.host``), without ``--limits-store``."""
        return self.runtime / "limiter.sock"

    @property
    def admin_socket(self) -> Path:
        """Worker 0's admin API, relayed by the supervisor's ``--admin-port``."""
        return self.runtime / "admin.sock"

    @property
    def metrics_dir(self) -> Path:
        """``PROMETHEUS_MULTIPROC_DIR``: every process of the pod writes its values here."""
        return self.runtime / "metrics"


@dataclass
class PodState:
    """The pod as the supervisor last told this worker (the control channel's ``pod``
    message): ready only when every worker is, and not draining."""

    ready: bool = False
    workers: dict[str, str] = field(default_factory=dict)

    def update(self, message: dict[str, object]) -> None:
        """Take the supervisor's ``pod`` message."""
        self.ready = message.get("status") == "ready"
        workers = message.get("workers")
        self.workers = (
            {str(k): str(v) for k, v in workers.items()} if isinstance(workers, dict) else {}
        )


def orders(place: Place, settings: Settings) -> bytes:
    """What the supervisor writes to worker ``place.index``'s stdin: its place and the
    pod's settings, secrets included (never in the environment)."""
    order = {
        "index": place.index,
        "workers": place.workers,
        "runtime": str(place.runtime),
        "settings": settings.model_dump(mode="json"),
    }
    return json.dumps(order).encode()


def read_orders(text: str) -> tuple[Place, Settings]:
    """The worker's place and the pod's settings (read as written: no environment, no
    configuration file)."""
    order: dict[str, Any] = json.loads(text)
    place = Place(int(order["index"]), int(order["workers"]), Path(order["runtime"]))
    return place, Settings.model_validate(order["settings"])


def own_settings(place: Place, pod: Settings) -> Settings:
    """The worker's settings: the pod's, with the journal at its shard."""
    if not pod.metering:
        return pod
    shard = shard_path(Path(pod.journal), place.index)
    return pod.model_copy(update={"journal": str(shard)})


def lone_adopted(settings: Settings) -> list[Path]:
    """The shards a pod left that one process (``--workers 1``) delivers and counts: it
    is a pod of one, so a rollback from a pod forgets no shard's records or month."""
    if not settings.metering:
        return []
    return adopted(Path(settings.journal), 0, 1)


def adopted_shards(place: Place, pod: Settings) -> list[Path]:
    """The shards left by a larger pod that this worker delivers (``shards.adopted``)."""
    if not pod.metering:
        return []
    return adopted(Path(pod.journal), place.index, place.workers)


# The pod's state as the supervisor last told a worker (its control channel keeps it).
POD_STATE = web.AppKey("pod_state", PodState)

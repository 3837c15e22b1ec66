"""Where a worker of ``serve --workers N`` stands in its pod (docs/workers.md): its index,
the pod's size, and the supervisor's private runtime directory, which holds the control
socket, the limiter host's socket and the multiprocess metrics directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    def metrics_dir(self) -> Path:
        """``PROMETHEUS_MULTIPROC_DIR``: every process of the pod writes its values here."""
        return self.runtime / "metrics"

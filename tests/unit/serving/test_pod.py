"""A worker's place in its pod names the pod's sockets and metrics directory."""

from __future__ import annotations

from pathlib import Path

from proxy.serving.pod import Place


def test_a_place_names_the_pods_runtime_files() -> None:
    """Every worker of one pod finds the same sockets and metrics directory."""
    first, second = Place(0, 2, Path("/run/p")), Place(1, 2, Path("/run/p"))
    assert first.control_socket == second.control_socket == Path("/run/p/control.sock")
    assert first.limiter_socket == Path("/run/p/limiter.sock")
    assert first.metrics_dir == Path("/run/p/metrics")
    assert first != second

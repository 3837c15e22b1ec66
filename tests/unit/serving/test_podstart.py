"""What a pod's supervisor refuses or checks before its first worker: each a one-line
start-up error (exit 2)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from proxy.serving.podstart import (
    journal_lock,
    probe_port,
    refusal,
    resolve_workers,
    runtime_dir,
)
from proxy.serving.startup import StartupError
from proxy.settings import Settings

POD = {"upstream": "http://vllm:8000", "workers": 2}


def test_a_pod_that_can_start_is_refused_nothing() -> None:
    """The defaults: nothing to refuse."""
    assert refusal(Settings(**POD)) is None


def test_a_pod_reconciles_with_the_defaults() -> None:
    """The pod's reconciler runs in the supervisor (serving.podreconcile): the default
    --reconcile-interval (15 s) is no longer refused, so ``--workers auto`` starts as is."""
    assert Settings(**POD).reconcile_interval > 0
    assert refusal(Settings(**POD)) is None


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"admin_tokens": "/etc/admin-tokens.yaml", "admin_port": 9001}, "--admin-tokens"),
    ],
)
def test_what_a_pod_cannot_do_yet_is_refused(extra: dict[str, object], said: str) -> None:
    """The admin API in a pod is not built: refused at start with the fix, never run
    wrong."""
    problem = refusal(Settings(**{**POD, **extra}))
    assert problem is not None
    assert said in problem
    assert "\n" not in problem


@pytest.mark.parametrize("store", [None, "redis://r:6379/0"])
def test_limits_are_not_refused(store: str | None) -> None:
    """Without a store the supervisor hosts the pod's limiter; with one every worker is
    one of the store's replicas."""
    settings = Settings(**POD, limits="/etc/limits.yaml", limits_store=store)
    assert refusal(settings) is None


def test_a_number_of_workers_is_taken_as_given() -> None:
    """Only ``auto`` reads the host."""
    assert resolve_workers(Settings(**{**POD, "workers": 3})) == 3
    assert resolve_workers(Settings(**{**POD, "workers": "auto"})) >= 1


def test_the_port_probe_fails_on_a_port_in_use() -> None:
    """A port held by anything (another pod's workers too) fails before any worker."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(StartupError, match="address already in use"):
            probe_port(Settings(**POD, host="127.0.0.1", port=port))


def test_one_pod_per_journal(tmp_path: Path) -> None:
    """A second pod on the same journal waits for the lock, then says so in one line."""
    settings = Settings(**POD, journal=str(tmp_path / "j.sqlite"))
    refused = pytest.raises(StartupError, match="one pod per journal")
    with journal_lock(settings), refused, journal_lock(settings, patience=0.3):
        pass
    with journal_lock(settings):  # released with the first pod
        pass


def test_the_runtime_directory_is_private_and_removed() -> None:
    """0700, with the metrics directory in it; gone after the pod."""
    with runtime_dir() as root:
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert (root / "metrics").is_dir()
    assert not root.exists()


def test_an_operators_metrics_directory_is_wiped_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PROMETHEUS_MULTIPROC_DIR set by the operator: its stale files go, it is used."""
    (tmp_path / "counter_1.db").write_bytes(b"old")
    (tmp_path / "keep.txt").write_text("not ours")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with runtime_dir() as root:
        assert (root / "metrics").resolve() == tmp_path.resolve()
        assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
    assert (tmp_path / "keep.txt").exists()

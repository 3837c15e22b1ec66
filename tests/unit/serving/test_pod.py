"""A worker's place in its pod names the pod's sockets and metrics directory."""

from __future__ import annotations

from pathlib import Path

from proxy.serving.pod import (
    Place,
    PodState,
    adopted_shards,
    lone_adopted,
    orders,
    own_settings,
    read_orders,
)
from proxy.settings import Settings


def test_a_place_names_the_pods_runtime_files() -> None:
    """Every worker of one pod finds the same sockets and metrics directory."""
    first, second = Place(0, 2, Path("/run/p")), Place(1, 2, Path("/run/p"))
    assert first.control_socket == second.control_socket == Path("/run/p/control.sock")
    assert first.limiter_socket == Path("/run/p/limiter.sock")
    assert first.metrics_dir == Path("/run/p/metrics")
    assert first != second


def test_a_workers_orders_carry_the_settings_and_its_shard(tmp_path: Path) -> None:
    """What the supervisor writes on a worker's stdin comes back as the pod's settings
    (secrets included), with the journal at the worker's own shard."""
    settings = Settings(
        upstream="http://vllm:8000",
        journal=str(tmp_path / "usage.sqlite"),
        workers=2,
        ledger_dsn="postgresql://u:secret@db/ledger",
    )
    runtime = tmp_path / "run"
    for index, name in ((0, "usage.sqlite"), (1, "usage.worker-1.sqlite")):
        place, pod = read_orders(orders(Place(index, 2, runtime), settings).decode())
        assert place == Place(index, 2, runtime)
        assert pod == settings
        read = own_settings(place, pod)
        assert read.journal == str(tmp_path / name)
        assert read.ledger_dsn == settings.ledger_dsn
        assert read.model_copy(update={"journal": settings.journal}) == settings


def test_orders_without_a_journal_keep_it_off() -> None:
    """--journal off stays off in every worker: there is no shard of nothing."""
    settings = Settings(upstream="http://vllm:8000", journal="off")
    place, pod = read_orders(orders(Place(1, 2, Path("/run/p")), settings).decode())
    assert own_settings(place, pod).journal == "off"
    assert adopted_shards(place, pod) == []


def test_one_process_adopts_every_shard_a_pod_left(tmp_path: Path) -> None:
    """--workers 1 after a pod: every worker's shard beside the journal is delivered and
    counted by the one process (none without a journal)."""
    journal = tmp_path / "usage.sqlite"
    for name in ("usage.sqlite", "usage.worker-1.sqlite", "usage.worker-3.sqlite"):
        (tmp_path / name).touch()
    settings = Settings(upstream="http://vllm:8000", journal=str(journal))
    assert lone_adopted(settings) == [
        tmp_path / "usage.worker-1.sqlite",
        tmp_path / "usage.worker-3.sqlite",
    ]
    assert lone_adopted(settings.model_copy(update={"journal": "off"})) == []


def test_a_worker_takes_the_pods_state() -> None:
    """The supervisor's ``pod`` message: ready only when it says so."""
    state = PodState()
    assert not state.ready
    state.update({"op": "pod", "status": "ready", "workers": {"0": "ready", "1": "ready"}})
    assert state.ready
    assert state.workers == {"0": "ready", "1": "ready"}
    state.update({"op": "pod", "status": "not ready", "workers": {"0": "ready"}})
    assert not state.ready

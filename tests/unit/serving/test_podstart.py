"""What a pod's supervisor refuses or checks before its first worker: each a one-line
start-up error (exit 2)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from proxy.serving import podstart
from proxy.serving.podstart import (
    drain_patience,
    journal_lock,
    probe_port,
    resolve_workers,
    runtime_dir,
)
from proxy.serving.startup import StartupError
from proxy.settings import Settings

POD = {"upstream": "http://vllm:8000", "workers": 2}


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


def test_the_port_probe_binds_every_address_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host name that resolves to ::1 and 127.0.0.1 (``localhost`` on most hosts) is
    bound on both by the workers' listener: a port held on ::1 alone fails the probe."""
    with socket.socket(socket.AF_INET6) as held:
        held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        held.bind(("::1", 0))
        held.listen()
        port = held.getsockname()[1]
        both = [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]
        monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: both)
        with pytest.raises(StartupError, match=r"\[::1\]:\d+ \(--port\): address already in use"):
            probe_port(Settings(**POD, host="localhost", port=port))


def test_an_ipv6_address_is_bracketed_in_the_probe_s_error() -> None:
    """``::1:8000`` is no address: the error names ``[::1]:8000``."""
    with socket.socket(socket.AF_INET6) as held:
        held.bind(("::1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(StartupError, match=rf"cannot listen on \[::1\]:{port} "):
            probe_port(Settings(**POD, host="::1", port=port))


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
    with runtime_dir() as (root, _):
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
    with runtime_dir() as (root, _):
        assert (root / "metrics").resolve() == tmp_path.resolve()
        assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
    assert (tmp_path / "keep.txt").exists()


def test_a_runtime_directory_that_cannot_be_made_is_one_line_naming_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TMPDIR that cannot take the directory (a read-only root file system, a missing
    directory) is a start-up error that says to set TMPDIR, not a traceback."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.raises(StartupError, match="set TMPDIR") as caught, runtime_dir():
        pass
    assert "\n" not in str(caught.value)
    assert str(tmp_path / "missing") in str(caught.value)


def test_a_tmpdir_too_long_for_a_unix_socket_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sockets' paths must fit sockaddr_un (107 bytes): a TMPDIR too deep for them is
    refused before any socket, and the directory made for it is gone."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(StartupError, match="shorter directory"), runtime_dir():
        pass
    assert list(deep.iterdir()) == []


HOLDER = (
    "import time; from proxy.serving.podstart import runtime_dir\n"
    "with runtime_dir():\n    print('up', flush=True); time.sleep(60)"
)


def _supervisor_holding_a_runtime(tmp_path: Path) -> subprocess.Popen[str]:
    """A process that made its runtime directory under ``tmp_path`` and keeps it."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    held = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True
    )
    assert held.stdout is not None
    while (line := held.stdout.readline()) != "up\n":  # its log lines come first
        assert line
    return held


def _runtimes(where: Path) -> set[Path]:
    return set(where.glob("usage-proxy-*"))


def test_a_killed_supervisors_runtime_directory_goes_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor SIGKILLed leaves its runtime directory under TMPDIR: the next pod's
    start removes it, never a live pod's (its supervisor still holds the directory)."""
    killed = _supervisor_holding_a_runtime(tmp_path)
    dead = _runtimes(tmp_path)
    killed.kill()
    killed.communicate()
    live = _supervisor_holding_a_runtime(tmp_path)  # the next start
    try:
        alive = _runtimes(tmp_path)
        assert alive.isdisjoint(dead)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with runtime_dir() as (mine, _):  # another start, beside the live pod
            assert _runtimes(tmp_path) == alive | {mine}
    finally:
        live.kill()
        live.communicate()
    assert len(dead) == len(alive) == 1


def test_what_is_not_a_stale_runtime_directory_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only this user's directories whose lock nobody holds go: one without the lock (an
    older proxy's, or not a pod's) and a link of the same name stay."""
    unlocked = tmp_path / "usage-proxy-older"
    unlocked.mkdir()
    (tmp_path / "usage-proxy-link").symlink_to(unlocked)
    (tmp_path / "usage-proxy-file").write_text("not a directory")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with runtime_dir():
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "usage-proxy-file",
        "usage-proxy-link",
        "usage-proxy-older",
    ]


def test_the_drain_patience_adds_up_a_workers_shutdown() -> None:
    """aiohttp's 30 s, the exchanges' and the own outbox's --drain-timeout, one more for
    adopted shards (drained together), and a margin."""
    settings = Settings(**POD, drain_timeout=10)
    assert drain_patience(settings, adopting=False) == 30 + 2 * 10 + 5
    assert drain_patience(settings, adopting=True) == 30 + 3 * 10 + 5


def test_a_new_pod_waits_for_the_old_ones_longest_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling update's new pod waits for the journal lock at least as long as the old
    pod's supervisor may wait for its workers to drain, adopted shards included: with a
    shorter patience the new pod gave up while the old one still drained within its
    rights (35 s against 65 s at --drain-timeout 10)."""
    settings = Settings(**POD, journal=str(tmp_path / "j.sqlite"), drain_timeout=10)
    waited: list[float] = []
    monkeypatch.setattr(podstart, "_hold", lambda fd, path, patience: waited.append(patience))
    with journal_lock(settings):
        pass
    assert waited
    assert waited[0] >= drain_patience(settings, adopting=True)

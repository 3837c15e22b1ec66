"""``usage-proxy serve --workers 2`` attacked as a bad day would (issue #61's probe): the
supervisor SIGKILLed while its workers still hold their shards."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from pathlib import Path

from scripts.vllm_cpu import Process, free_port, start_proxy
from tests.support.processes import workers_of

POD = ("--workers", "2", "--reconcile-interval", "0")


def start_pod(upstream: str, workdir: Path, port: int) -> Process:
    """``serve --workers 2`` journalling to ``workdir/j.sqlite``, ready."""
    journal = ("--journal", str(workdir / "j.sqlite"))
    proxy = start_proxy(upstream, workdir, *POD, *journal, port=port)
    proxy.wait_ready("/readyz", 60)
    return proxy


def alive(pid: int) -> bool:
    """``pid`` runs (or is stopped), neither gone nor a zombie waiting for its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def lock_is_free(path: Path) -> bool:
    """Whether another pod could take ``path`` (the pod's journal lock) now."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return True


def test_a_killed_supervisors_workers_keep_the_journal_until_they_exit(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """The supervisor SIGKILLed while both workers still run (held stopped here, as a
    worker still draining its exchanges is): the journal's lock stays held, so no second
    pod starts writing the same shards beside them. Once they have drained and exited
    the lock is free, and the next pod takes the journal and the port."""
    port = free_port()
    proxy = start_pod(fake_upstream.url, tmp_path, port)
    lock = tmp_path / "j.sqlite.lock"
    pids = workers_of(proxy)
    assert len(pids) == 2
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        os.kill(proxy.popen.pid, signal.SIGKILL)
        proxy.popen.wait(10)
        held_while_alive = not lock_is_free(lock)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in pids), "the workers outlived their supervisor"
        assert held_while_alive, "the journal lock was free while the old workers ran"
        assert lock_is_free(lock)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proxy.popen.pid, signal.SIGCONT)
            os.killpg(proxy.popen.pid, signal.SIGKILL)
    after = start_pod(fake_upstream.url, tmp_path, port)
    try:
        assert len(workers_of(after)) == 2
    finally:
        after.stop()
    assert after.popen.returncode == 0, after.tail()

"""``usage-proxy serve --workers N`` (docs/workers.md): one supervisor, N worker
processes on one port; ``--workers 1`` is today's process. The supervisor serves no
client: it checks what a worker would refuse, takes the pod's journal lock, makes its
runtime directory, then runs the pod (``podlife``). It imports prometheus_client only
then: the library picks its multiprocess mode when imported, from
``PROMETHEUS_MULTIPROC_DIR``, which must name the pod's directory by that time."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from proxy.logs import configure_logging
from proxy.serving.loops import new_event_loop
from proxy.serving.pod import Place
from proxy.serving.podstart import journal_lock, probe_port, resolve_workers, runtime_dir
from proxy.serving.startup import StartupError
from proxy.settings import Settings


def main(settings: Settings) -> int:
    """Serve with as many workers as ``--workers`` says: one is today's process."""
    # SIGHUP's default action ends a process: ignored until the reload handler (one
    # process's) or the forwarding one (a pod's supervisor) is installed, once serving.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    configure_logging(settings.log_level)
    workers = resolve_workers(settings)
    if workers == 1:
        from proxy.serving import process  # the whole application: a pod's supervisor needs none

        return process.run_or_explain(settings)
    try:
        probe_port(settings)
        with journal_lock(settings) as lock, runtime_dir() as runtime:
            # Every worker inherits both locks: the journal stays the pod's, and its
            # runtime directory is not stale, while any process of the pod lives.
            held = (runtime.lock,) if lock is None else (lock, runtime.lock)
            return run_pod(settings, workers, runtime.path, held)
    except StartupError as exc:
        print(f"usage-proxy: {exc}", file=sys.stderr)
        return 2


def run_pod(settings: Settings, workers: int, runtime: Path, held: tuple[int, ...]) -> int:
    """The pod in ``runtime``, until it stops; its exit code. The pod's modules (and
    prometheus_client with them) are imported once ``PROMETHEUS_MULTIPROC_DIR`` names
    the pod's metrics directory, so this process's counters are written there."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(Place(0, workers, runtime).metrics_dir)
    from proxy.serving.podlife import Pod  # after the directory: see above

    pod = Pod(settings, workers, runtime, held)
    loop = new_event_loop(settings.event_loop)
    try:
        return loop.run_until_complete(pod.run())
    finally:
        loop.close()

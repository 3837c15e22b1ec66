"""SIGHUP while ``usage-proxy serve`` is still starting (its tokenizers loading, its
budgets rebuilt, before the reload handler is installed) does not end it: SIGHUP's
default action ends a process, and an operator's reload or a file manager's may come at
any time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from scripts.vllm_cpu import Process, start_proxy


def test_a_sighup_while_the_proxy_starts_does_not_end_it(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """Regression: a SIGHUP between the ``starting`` log line and the reload handler ended
    the process (exit by signal, nothing served). Now it is ignored until the handler
    comes, and the proxy becomes ready."""
    proxy = start_proxy(fake_upstream.url, tmp_path, "--journal", "off")
    try:
        deadline = time.monotonic() + 60
        while '"starting"' not in proxy.log.read_text(errors="replace"):
            assert proxy.popen.poll() is None, proxy.tail()
            assert time.monotonic() < deadline, proxy.tail()
            time.sleep(0.005)
        proxy.popen.send_signal(signal.SIGHUP)
        proxy.wait_ready("/readyz", 60)
        assert proxy.popen.poll() is None
    finally:
        proxy.stop()

"""SIGHUP, the usual reload signal, reloads the key file of a running ``usage-proxy
serve`` and never ends it (issue #28: it used to kill the proxy with no drain)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import Process, start_proxy
from tests.support.processes import status_with_key

RERANK = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}


def status_with(url: str, key: str) -> int:
    """A rerank with ``key``."""
    return status_with_key(url, key, "/rerank", RERANK)


def test_sighup_reloads_the_keys_and_the_proxy_keeps_serving(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """Regression: SIGHUP killed the proxy. Now the new key works right after it, the
    old one is refused, and the process is still serving."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-old')}\n")
    proxy = start_proxy(fake_upstream.url, tmp_path, "--api-keys", str(keys), "--journal", "off")
    try:
        proxy.wait_ready("/readyz", 60)
        assert status_with(proxy.url, "sk-old") == 200
        keys.write_text(f"acme: {key_digest('sk-new')}\n")
        proxy.popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while status_with(proxy.url, "sk-new") != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status_with(proxy.url, "sk-new") == 200
        assert status_with(proxy.url, "sk-old") == 401
        assert proxy.popen.poll() is None
    finally:
        proxy.stop()


def test_sighup_without_a_key_file_is_harmless(fake_upstream: Process, tmp_path: Path) -> None:
    """With nothing to reload, SIGHUP is logged and the proxy serves on."""
    proxy = start_proxy(fake_upstream.url, tmp_path, "--journal", "off")
    try:
        proxy.wait_ready("/readyz", 60)
        proxy.popen.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proxy.popen.poll() is None
        assert status_with(proxy.url, "any") == 200
    finally:
        proxy.stop()

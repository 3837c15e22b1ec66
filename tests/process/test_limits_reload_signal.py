"""SIGHUP reloads the --limits file of a running ``usage-proxy serve`` (as it reloads the
key file), and the process serves on; a limits file that does not validate at start stops
the start (there are no policies in use to keep)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from scripts.vllm_cpu import Process, start_proxy

EMBED = {"input": "What is the capital of France?"}


def status_of(url: str) -> int:
    request = urllib.request.Request(
        url + "/v1/embeddings",
        data=json.dumps(EMBED).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sighup_reloads_the_limits(fake_upstream: Process, tmp_path: Path) -> None:
    """One request a minute: the second is refused; after the file allows more and
    SIGHUP, the next one passes and the process is still serving."""
    limits = tmp_path / "limits.yaml"
    limits.write_text("default: {requests_per_minute: 1}\n")
    proxy = start_proxy(fake_upstream.url, tmp_path, "--limits", str(limits), "--journal", "off")
    try:
        proxy.wait_ready("/readyz", 60)
        assert status_of(proxy.url) == 200
        assert status_of(proxy.url) == 429
        limits.write_text("default: {requests_per_minute: 1000}\n")
        proxy.popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while status_of(proxy.url) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status_of(proxy.url) == 200
        assert proxy.popen.poll() is None
    finally:
        proxy.stop()


def test_an_invalid_limits_file_stops_the_start(tmp_path: Path) -> None:
    """A misspelt limit at start is an error naming it, not a proxy without limits."""
    limits = tmp_path / "limits.yaml"
    limits.write_text("default: {requests_per_fortnight: 1}\n")
    argv = [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:9"]
    done = subprocess.run(
        [*argv, "--limits", str(limits), "--journal", "off"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "requests_per_fortnight" in done.stderr + done.stdout

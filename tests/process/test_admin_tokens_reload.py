"""The admin API of a running ``usage-proxy serve`` (issue #62): served on --admin-port
with --admin-tokens only, and its token file reloaded by SIGHUP as --api-keys is."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import Process, free_port, start_proxy


def status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sighup_reloads_the_admin_tokens(fake_upstream: Process, tmp_path: Path) -> None:
    """The admin token in the file opens the admin API, no token does not; after the
    file changes and SIGHUP, the new token works and the old one is refused; the main
    port never serves it."""
    tokens = tmp_path / "admin.yaml"
    tokens.write_text(f"ops: {key_digest('old-token')}\n")
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-acme')}\n")
    port = free_port()
    proxy = start_proxy(
        fake_upstream.url,
        tmp_path,
        *("--api-keys", str(keys), "--journal", str(tmp_path / "journal.sqlite")),
        *("--admin-port", str(port), "--admin-host", "127.0.0.1", "--admin-tokens", str(tokens)),
    )
    admin = f"http://127.0.0.1:{port}/usage-proxy/admin/v1/standings"
    try:
        proxy.wait_ready("/readyz", 60)
        assert status(admin, None) == 401
        assert status(admin, "old-token") == 200
        assert status(proxy.url + "/usage-proxy/admin/v1/standings", "sk-acme") == 404
        assert status(proxy.url + "/usage-proxy/v1/standing", "sk-acme") == 200
        tokens.write_text(f"ops: {key_digest('new-token')}\n")
        proxy.popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while status(admin, "new-token") != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(admin, "new-token") == 200
        assert status(admin, "old-token") == 401
        assert proxy.popen.poll() is None
    finally:
        proxy.stop()

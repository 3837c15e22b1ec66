"""A throwaway Redis (or Valkey) server from the system binary, in a temp directory, on
a free loopback port, with no persistence: stopping it and starting it again on the same
port is a store that restarts empty.

No system service is used. Where no binary exists the tests that need it skip loudly,
except under CI=true, where they fail: CI must install it (scripts/system-deps does).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scripts.vllm_cpu import free_port


def server_binary() -> str | None:
    return shutil.which("valkey-server") or shutil.which("redis-server")


@dataclass
class Store:
    binary: str
    base: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (empty: no RDB, no AOF) and wait until it accepts."""
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.base),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(self.base / "server.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on {self.port}")

    def kill(self) -> None:
        """SIGKILL: the store is gone at once, with everything it held."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def redis_store() -> Iterator[Store]:
    """A fresh, empty server per test (it starts in a few milliseconds)."""
    binary = server_binary()
    if binary is None:
        message = "redis-server not found (apt-get install redis-server; scripts/system-deps)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    base = Path(tempfile.mkdtemp(prefix="usage-proxy-redis-"))
    store = Store(binary, base, free_port())
    try:
        store.start()
        yield store
    finally:
        store.kill()
        shutil.rmtree(base, ignore_errors=True)

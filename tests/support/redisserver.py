"""A throwaway Redis (or Valkey) server from the system binary, in a temp directory, on
a free loopback port, with no persistence: stopping it and starting it again on the same
port is a store that restarts empty.

No system service is used. Where no binary exists the tests that need it skip loudly,
except under CI=true, where they fail: CI must install it (scripts/system-deps does).

``tls_redis_store`` serves TLS only (a self-signed certificate for 127.0.0.1 made with
the openssl command) and requires a password, set in its config file, never argv.
"""

from __future__ import annotations

import contextlib
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
    tls: bool = False  # serve TLS only, with base/cert.pem (its own CA) and base/key.pem
    password: str | None = None  # required by the server (in its config file)

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.base / 'cert.pem'}"
        return f"redis://127.0.0.1:{self.port}/0"

    def _listen(self) -> list[str]:
        """The config file (the password) and the port options."""
        config: list[str] = []
        if self.password is not None:
            (self.base / "redis.conf").write_text(f"requirepass {self.password}\n")
            config = [str(self.base / "redis.conf")]
        if not self.tls:
            return [*config, "--port", str(self.port)]
        cert, key = str(self.base / "cert.pem"), str(self.base / "key.pem")
        return [
            *config,
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            cert,
            "--tls-auth-clients",
            "no",
        ]

    def start(self) -> None:
        """Start the server (empty: no RDB, no AOF) and wait until it accepts."""
        self.process = subprocess.Popen(
            [
                self.binary,
                *self._listen(),
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
                    if self.tls or self.password is not None:
                        return  # accepting; the tests speak TLS and AUTH themselves
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


def _missing(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _binary() -> str:
    binary = server_binary()
    if binary is None:
        _missing("redis-server not found (apt-get install redis-server; scripts/system-deps)")
    assert binary is not None
    return binary


def self_signed(base: Path) -> None:
    """A certificate for 127.0.0.1 (its own CA) and its key, in ``base``."""
    if shutil.which("openssl") is None:
        _missing("openssl not found (apt-get install openssl)")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(base / "key.pem"),
            "-out",
            str(base / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )


@contextlib.contextmanager
def _running(tls: bool = False, password: str | None = None) -> Iterator[Store]:
    """A server in its own temporary directory, killed and removed afterwards."""
    binary = _binary()
    base = Path(tempfile.mkdtemp(prefix="usage-proxy-redis-"))
    if tls:
        self_signed(base)
    store = Store(binary, base, free_port(), tls=tls, password=password)
    try:
        store.start()
        yield store
    finally:
        store.kill()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tls_redis_store() -> Iterator[Store]:
    """A fresh server per test that speaks TLS only and requires ``store.password``."""
    with _running(tls=True, password="store-s3cret") as store:
        yield store


@pytest.fixture
def redis_store() -> Iterator[Store]:
    """A fresh, empty server per test (it starts in a few milliseconds)."""
    with _running() as store:
        yield store

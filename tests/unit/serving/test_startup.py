"""Start-up errors as one line: each names the flag, the address or path, and the fix."""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
from pathlib import Path

import pytest
from aiohttp import web

from proxy.serving.startup import (
    StartupError,
    journal_problem,
    listen,
    listen_problem,
    store_password,
)
from proxy.settings import Settings


@pytest.mark.parametrize(
    ("code", "flag", "expected"),
    [
        (errno.EADDRINUSE, "--port", "(--port): address already in use; stop what listens"),
        (errno.EACCES, "--admin-port", "(--admin-port): permission denied; ports below 1024"),
        (errno.EADDRNOTAVAIL, "--port", "(--port, --host): Cannot assign requested address;"),
        (errno.EADDRNOTAVAIL, "--admin-port", "(--admin-port, --admin-host): Cannot assign"),
    ],
)
def test_each_bind_failure_names_its_flag(code: int, flag: str, expected: str) -> None:
    """The errno decides the advice; the flag comes from the caller."""
    error = listen_problem(OSError(code, os.strerror(code)), "10.9.9.9", 80, flag)
    assert str(error).startswith("cannot listen on 10.9.9.9:80 ")
    assert expected in str(error)


async def test_listen_on_a_taken_port_is_a_startup_error() -> None:
    """The bind failure aiohttp raises (an OSError with a long text) becomes StartupError."""
    runner = web.AppRunner(web.Application())
    await runner.setup()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=rf"127\.0\.0\.1:{port} \(--port\): address"):
            await listen(runner, "127.0.0.1", port, "--port")
    await runner.cleanup()


def test_journal_problem_names_the_path_and_the_flag() -> None:
    """sqlite's own text ("unable to open database file") says neither."""
    error = journal_problem(sqlite3.OperationalError("unable to open database file"), "/j/x")
    assert str(error).startswith(
        "cannot open the journal /j/x (--journal): unable to open database file; "
    )
    assert "mount a writable volume there" in str(error)


@pytest.mark.parametrize(
    ("error", "advice"),
    [
        (sqlite3.DatabaseError("file is not a database"), "the file is not a usage journal"),
        (sqlite3.OperationalError("database is locked"), "another process holds it"),
        (OSError(errno.EROFS, "Read-only file system"), "mount a writable volume there"),
    ],
)
def test_journal_advice_fits_the_cause(error: Exception, advice: str) -> None:
    """A file that is not a journal, or one another process holds, is not helped by
    advice about writable volumes."""
    assert isinstance(error, OSError | sqlite3.Error)
    assert advice in str(journal_problem(error, "/j/x"))


def test_the_password_comes_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's password is read from USAGE_PROXY_LIMITS_STORE_PASSWORD, or from the
    file, which wins; none when neither is set."""
    settings = Settings(upstream="http://127.0.0.1:8000", limits_store="redis://127.0.0.1:6379/0")
    monkeypatch.delenv("USAGE_PROXY_LIMITS_STORE_PASSWORD", raising=False)
    assert store_password(settings) is None
    monkeypatch.setenv("USAGE_PROXY_LIMITS_STORE_PASSWORD", "from-env")
    assert store_password(settings) == "from-env"
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    filed = Settings(
        upstream="http://127.0.0.1:8000",
        limits_store="redis://127.0.0.1:6379/0",
        limits_store_password_file=secret,
    )
    assert store_password(filed) == "from-file"

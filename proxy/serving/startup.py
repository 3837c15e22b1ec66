"""Start-up mistakes an operator can fix, as one line each: which flag, which path or
address, and what to do. They are raised as ``StartupError`` where the context is known
(a port, the journal, the key file) and printed once, by ``process.run_or_explain``, which
exits 2 as the configuration errors do. Anything else is a defect and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from aiohttp import web

from proxy.serving.tenancy import KeyFileError
from proxy.settings import ENV_PREFIX, Settings

SHUTDOWN_SECONDS = 30.0  # aiohttp's shutdown timeout for the requests in flight (serve)


class StartupError(Exception):
    """A start-up failure the operator can fix; the message is the whole story."""


def listen_problem(exc: OSError, host: str, port: int, flag: str) -> StartupError:
    """A port that cannot be bound, said as the flag and the fix (an IPv6 address in
    brackets: ``[::1]:8000``)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        fix = f"stop what listens there (ss -ltnp 'sport = :{port}') or choose another {flag}"
        return StartupError(f"cannot listen on {where} ({flag}): address already in use; {fix}")
    if exc.errno == errno.EACCES:
        fix = f"ports below 1024 need privileges: choose {flag} 1024 or above"
        return StartupError(f"cannot listen on {where} ({flag}): permission denied; {fix}")
    host_flag = "--admin-host" if flag == "--admin-port" else "--host"
    reason = exc.strerror or str(exc)
    return StartupError(
        f"cannot listen on {where} ({flag}, {host_flag}): {reason}; "
        f"give {host_flag} an address of this host (0.0.0.0 for all, 127.0.0.1 for local)"
    )


async def listen(
    runner: web.BaseRunner, host: str, port: int, flag: str, *, reuse_port: bool = False
) -> None:
    """Start ``runner`` on ``host:port`` (``reuse_port``: beside a pod's other workers); a
    port that cannot be bound is a StartupError."""
    try:
        await web.TCPSite(runner, host, port, reuse_port=reuse_port or None).start()
    except OSError as exc:
        raise listen_problem(exc, host, port, flag) from exc


def journal_problem(exc: OSError | sqlite3.Error, path: str) -> StartupError:
    """A journal that cannot be opened or created, with where it must live."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    head = f"cannot open the journal {path} (--journal): {reason}; "
    if isinstance(exc, sqlite3.OperationalError) and "locked" in reason:
        return StartupError(head + "another process holds it: one proxy per journal")
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return StartupError(
            head + "the file is not a usage journal: move it away or point "
            "--journal at another path"
        )
    return StartupError(
        head + f"the directory must be writable by this process (uid {os.getuid()}): "
        "mount a writable volume there (not a read-only root filesystem) or point "
        "--journal at one"
    )


def key_file_problem(exc: KeyFileError) -> StartupError:
    return StartupError(f"--api-keys {exc}")


def file_problem(exc: Exception, flag: str, path: object, fix: str) -> StartupError:
    """A file given by a flag that cannot be read or is not what the flag takes: the flag,
    the path, why, and ``fix``."""
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
    elif isinstance(exc, UnicodeDecodeError):
        reason = f"not UTF-8 text (byte {exc.start})"
    else:
        reason = " ".join(str(exc).split())  # one line
    return StartupError(f"cannot read {flag} {path}: {reason}; {fix}")


def store_password(settings: Settings) -> str | None:
    """The store's password: from the environment, or a file (never the command line)."""
    password = os.environ.get(ENV_PREFIX + "LIMITS_STORE_PASSWORD")
    path = settings.limits_store_password_file
    if path is not None:
        try:
            password = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            fix = "mount the store's password there as a UTF-8 text file (one line)"
            raise file_problem(exc, "--limits-store-password-file", path, fix) from None
    return password or None

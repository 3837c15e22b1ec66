"""What a pod's supervisor does before its first worker (docs/workers.md, "Start"): how
many workers, the port probe, the pod's journal lock and the
private runtime directory. Each mistake is a ``StartupError``: one line, exit 2."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import structlog

from proxy.serving.cpus import budget
from proxy.serving.pod import Place
from proxy.serving.startup import SHUTDOWN_SECONDS, StartupError, listen_problem
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.podstart")

DRAIN_MARGIN = 5.0  # a worker's exit after its drain: closing files, the interpreter


def drain_patience(settings: Settings, *, adopting: bool) -> float:
    """How long the supervisor waits for a worker to drain before it kills it: the parts
    of the worker's own shutdown, each bounded, one after another: aiohttp's (the
    requests in flight), the exchanges' records and its shard's outbox (a
    ``--drain-timeout`` each), its adopted shards' outboxes (together, one more), and a
    margin."""
    waits = 3 if adopting else 2
    return SHUTDOWN_SECONDS + waits * settings.drain_timeout + DRAIN_MARGIN


def resolve_workers(settings: Settings) -> int:
    """``--workers``: a number, or ``auto``, the cores this process may use."""
    if settings.workers != "auto":
        return settings.workers
    found = budget()
    log.info("workers", workers=found.workers, affinity=found.affinity, cgroup_quota=found.quota)
    return found.workers


def probe_port(settings: Settings) -> None:
    """Bind the port without SO_REUSEPORT on every address of ``--host``, as the workers'
    listener will (asyncio binds each address ``getaddrinfo`` gives, an IPv6 one
    IPV6_V6ONLY), then let them go: a port held by anything else, another pod's workers
    included, fails here instead of joining their group."""
    host, port = settings.host, settings.port
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise listen_problem(exc, host, port, "--port") from None
    with contextlib.ExitStack() as probes:
        for family, kind, proto, _, address in dict.fromkeys(found):
            probe = probes.enter_context(socket.socket(family, kind, proto))
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise listen_problem(exc, str(address[0]), port, "--port") from None


@contextmanager
def journal_lock(settings: Settings, patience: float | None = None) -> Iterator[int | None]:
    """The pod's hold on its journal shards: ``<journal>.lock``, waited for up to
    ``patience`` seconds, by default the longest an old pod's supervisor waits for its
    workers to drain (a rolling update's old pod may still be draining). Yields the
    locked descriptor (None without a journal): the workers inherit it, so the lock
    outlives a supervisor killed before them."""
    if not settings.metering:
        yield None
        return
    path = Path(settings.journal + ".lock")
    try:
        handle = path.open("a")
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise StartupError(f"cannot create {path} (--journal): {why}") from None
    with handle:
        wait = drain_patience(settings, adopting=True) if patience is None else patience
        _hold(handle.fileno(), path, wait)
        yield handle.fileno()


def _hold(fd: int, path: Path, patience: float) -> None:
    deadline = time.monotonic() + patience
    said = 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        now = time.monotonic()
        if now >= deadline:
            raise StartupError(
                f"another proxy holds the journal {path.with_suffix('')} (--journal, "
                f"{path} locked for {patience:g} s): one pod per journal"
            )
        if now - said >= 5:
            log.info("waiting_for_journal_lock", lock=str(path))
            said = now
        time.sleep(0.2)


SOCKET_PATH_BYTES = 107  # sockaddr_un's sun_path on Linux, less its terminating NUL
PREFIX = "usage-proxy-"
LOCK = "pod.lock"  # flock'd from the directory's birth while any process of its pod lives


class Runtime(NamedTuple):
    """The pod's private directory, and the descriptor of its held lock (the workers
    inherit it: a directory is stale only once every process of its pod is gone)."""

    path: Path
    lock: int


def _private_dir() -> Runtime:
    """A fresh 0700 directory under TMPDIR whose sockets' paths fit a Unix socket, its
    lock held before it takes its name (``PREFIX``): no start sees it unlocked."""
    where = tempfile.gettempdir()
    try:
        born = Path(tempfile.mkdtemp(prefix="." + PREFIX))
    except OSError as exc:
        raise _unmade(where, exc) from None
    lock = os.open(born / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
    root = born.with_name(born.name.removeprefix("."))
    try:
        born.rename(root)
    except OSError as exc:
        shutil.rmtree(born, ignore_errors=True)
        os.close(lock)
        raise _unmade(where, exc) from None
    longest = max(len(os.fsencode(p)) for p in _sockets(root))
    if longest > SOCKET_PATH_BYTES:
        shutil.rmtree(root, ignore_errors=True)
        os.close(lock)
        raise StartupError(
            f"the pod's sockets under {where} would be {longest} bytes long, over a Unix "
            f"socket's {SOCKET_PATH_BYTES} (set TMPDIR to a shorter directory)"
        )
    return Runtime(root, lock)


def _unmade(where: str, exc: OSError) -> StartupError:
    why = exc.strerror or str(exc)
    return StartupError(
        f"cannot create the pod's runtime directory in {where}: {why} "
        "(set TMPDIR to a writable directory)"
    )


def _sockets(root: Path) -> list[Path]:
    place = Place(0, 1, root)
    return [place.control_socket, place.limiter_socket, place.admin_socket]


def remove_stale(where: Path) -> None:
    """The runtime directories under ``where`` that pods of this user left when their
    supervisor was SIGKILLed: each whose lock no process holds. A directory without the
    lock (an older proxy's, or not a pod's) stays: whether it is live cannot be told."""
    for found in where.glob(PREFIX + "*"):
        try:
            info = found.lstat()
            lock = os.open(found / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a live pod's
            shutil.rmtree(found, ignore_errors=True)
            log.info("stale_runtime_removed", path=str(found))
        finally:
            os.close(lock)


@contextmanager
def runtime_dir() -> Iterator[Runtime]:
    """The supervisor's private directory (0700): the control socket, the limiter
    host's socket and the multiprocess metrics (an operator's ``PROMETHEUS_MULTIPROC_DIR``
    instead when set, wiped of its ``*.db`` files). Those a killed supervisor left go
    first (``remove_stale``)."""
    remove_stale(Path(tempfile.gettempdir()))
    runtime = _private_dir()
    root = runtime.path
    own = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    metrics = root / "metrics"
    try:
        if own:
            for stale in Path(own).glob("*.db"):
                stale.unlink()
            metrics.symlink_to(Path(own).resolve(), target_is_directory=True)
        else:
            metrics.mkdir(mode=0o700)
        yield runtime
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.close(runtime.lock)

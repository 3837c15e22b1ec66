"""The process: serve the application until SIGINT/SIGTERM, with the limits a sidecar
needs (open files, client connections) and a heap the garbage collector walks cheaply."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from proxy import __version__
from proxy.logs import configure_logging
from proxy.metrics import Metrics
from proxy.serving.admin_api import ADMIN_TOKENS
from proxy.serving.allocator import tune_allocator
from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG, Catalog
from proxy.serving.keyfile import KEYFILE
from proxy.serving.keys import METRICS
from proxy.serving.limitsfile import LIMITSFILE
from proxy.serving.loops import new_event_loop
from proxy.serving.pod import Place, lone_adopted
from proxy.serving.pricesfile import PRICESFILE
from proxy.serving.startup import SHUTDOWN_SECONDS, StartupError, key_file_problem, listen
from proxy.serving.tenancy import KeyFileError
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.process")


def raise_open_files_limit() -> None:
    """Every client and upstream connection is a file descriptor: use the hard limit
    (often 1,024 soft), so connection floods meet the proxy's own bounds first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log.info("open_files_limit", limit=max(soft, hard))


def run_or_explain(settings: Settings, pod: PodLink | None = None) -> int:
    """Serve; a start-up mistake the operator can fix is one line on stderr and exit 2."""
    try:
        run(settings, pod)
    except KeyFileError as exc:
        print(f"usage-proxy: {key_file_problem(exc)}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"usage-proxy: {exc}", file=sys.stderr)
        return 2
    return 0


def run(settings: Settings, pod: PodLink | None = None) -> None:
    """Serve until SIGINT/SIGTERM (a pod's worker: or until its supervisor is gone)."""
    tune_allocator()
    configure_logging(settings.log_level)
    raise_open_files_limit()
    log.info(
        "starting",
        version=__version__,
        upstream=settings.upstream_base,
        listen=f"{settings.host}:{settings.port}",
        mode=settings.mode.value,
        event_loop=settings.event_loop.value,
    )
    loop = new_event_loop(settings.event_loop)
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve(settings, pod))
    try:
        with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
            loop.run_until_complete(main)
    finally:
        # As aiohttp's run_app: first let the server's own shutdown run (drain requests,
        # finish exchanges, deliver records) while its background tasks are still alive;
        # only then cancel whatever is left.
        _cancel(loop, {main})
        _cancel(loop, asyncio.all_tasks(loop))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _cancel(loop: asyncio.AbstractEventLoop, tasks: set[asyncio.Task[Any]]) -> None:
    pending = {t for t in tasks if not t.done()}
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


@dataclass(frozen=True, slots=True)
class PodLink:
    """How a pod's worker serves (``serving.worker``): its place, sharing the port with
    the other workers (SO_REUSEPORT), and ``until``, which returns when it must stop
    (SIGTERM or SIGINT, or its supervisor gone; a second signal changes nothing, so a
    drain is never cut short by the signal the supervisor forwards after the group's)."""

    place: Place
    until: Callable[[web.Application], Awaitable[None]]
    adopted: Sequence[Path] = ()  # shards left by a larger pod, delivered here


async def serve(settings: Settings, pod: PodLink | None = None) -> None:
    """aiohttp's run_app, plus the client connection cap (which run_app cannot take)."""
    if pod is None:
        app = create_app(settings, adopted=lone_adopted(settings))
    else:
        app = create_app(settings, pod=pod.place, adopted=pod.adopted)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=pod is None,
        shutdown_timeout=SHUTDOWN_SECONDS,
        keepalive_timeout=settings.keepalive_timeout,  # aiohttp's handler default: 3,630 s
        # A client that hangs up does not cancel its handler (aiohttp's default, said
        # here because the exchanges rely on it and the tests run with it too).
        handler_cancellation=False,
    )
    await runner.setup()
    assert runner.server is not None
    cap_connections(runner.server, settings.max_connections, app[METRICS])
    shared = pod is not None
    await listen(runner, settings.host, settings.port, "--port", reuse_port=shared)
    reload_on_hangup(app)
    freeze = asyncio.create_task(freeze_heap(app[CATALOG]), name="freeze-heap")
    try:
        if pod is not None:
            await pod.until(app)
        else:
            await asyncio.Event().wait()  # until SIGINT/SIGTERM (GracefulExit)
    finally:
        freeze.cancel()
        await runner.cleanup()


def reload_on_hangup(app: web.Application) -> None:
    """SIGHUP, the usual reload signal, reloads the key file, the price file and the
    limits file (and never ends the process: its default action would, with no drain).
    Prices first, so that limits with a budget on a newly priced model load; prices
    again when they failed, for prices of a model the new limits no longer budget."""
    keys, limits, prices = app.get(KEYFILE), app.get(LIMITSFILE), app.get(PRICESFILE)
    tokens = app.get(ADMIN_TOKENS)

    def hangup() -> None:
        if tokens is not None:
            tokens.reload("SIGHUP")
        if keys is None and limits is None and prices is None and tokens is None:
            log.info("sighup_ignored", reason="no --api-keys, --limits or --prices to reload")
        if keys is not None:
            keys.reload("SIGHUP")
        priced = prices.reload("SIGHUP") if prices is not None else True
        if limits is not None:
            limits.reload("SIGHUP")
        if not priced and prices is not None:
            prices.reload("SIGHUP")

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup)


async def freeze_heap(catalog: Catalog) -> None:
    """Once the first discovery has loaded the tokenizers, move every object made so far
    (modules, tokenizers, validators) out of the cyclic garbage collector's reach: its
    full collections then walk what requests allocate, not the whole interpreter."""
    await catalog.ready.wait()
    gc.collect()
    gc.freeze()


def busy_answer() -> bytes:
    """What a client beyond --max-connections gets before its connection is closed."""
    error = {
        "message": "too many connections to the proxy; retry",
        "type": "ServiceUnavailable",
        "param": None,
        "code": 503,
    }
    body = json.dumps({"error": error}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Retry-After: 1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def cap_connections(server: web.Server, limit: int, metrics: Metrics) -> None:
    """Refuse connections beyond ``limit`` at once (a 503 in vLLM's error shape, then
    closed), so a flood of idle or trickling connections cannot use up the process's file
    descriptors and starve everyone else."""
    admit = server.connection_made
    answer = busy_answer()

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        if len(server.connections) >= limit:
            metrics.refused.labels("503").inc()
            log.warning("connection_refused", open=len(server.connections), limit=limit)
            transport.write(answer)
            transport.close()
            return
        admit(handler, transport)

    server.connection_made = connection_made  # type: ignore[method-assign]

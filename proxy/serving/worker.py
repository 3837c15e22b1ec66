"""A worker of ``usage-proxy serve --workers N`` (docs/workers.md), started by the
supervisor as ``python -m proxy.serving.worker``: today's ``serve``, sharing the port
(SO_REUSEPORT), journaling to its own shard, its metrics in the pod's directory, linked
to the supervisor by the control channel. Its orders (the settings, secrets included,
and its place) arrive as JSON on stdin, never in the environment: ``/proc/<pid>/environ``
outlives the need."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from proxy.serving.control import worker_link
from proxy.serving.pod import Place, adopted_shards, own_settings, read_orders
from proxy.serving.process import PodLink, run_or_explain


def until_stopped(place: Place) -> Callable[[web.Application], Awaitable[None]]:
    """``PodLink.until``: the control channel runs until SIGTERM or SIGINT (once; later
    ones change nothing) or until the supervisor hangs up."""

    async def until(app: web.Application) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        link = asyncio.create_task(worker_link(place, app, stop), name="control")
        link.add_done_callback(lambda _: stop.set())
        await stop.wait()
        link.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await link

    return until


def main() -> int:
    # SIGHUP's default action ends a process: the supervisor forwards it to every worker,
    # this one's reload handler (process.reload_on_hangup) comes only once it listens.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    place, pod = read_orders(sys.stdin.read())
    structlog.contextvars.bind_contextvars(worker=place.index)
    link = PodLink(place, until_stopped(place), adopted_shards(place, pod))
    return run_or_explain(own_settings(place, pod), link)


if __name__ == "__main__":
    sys.exit(main())

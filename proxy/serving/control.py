"""The control channel between a pod's supervisor and its workers (docs/workers.md): one
Unix socket in the supervisor's private runtime directory, one connection per worker,
one JSON object per line.

- worker → supervisor: ``hello`` (index, pid) once, then ``ping`` every
  ``PING_SECONDS`` (its loop turns: liveness) and ``state`` (ready, problems: the body
  of its own ``/readyz``) after each readiness check, one a ``PING_SECONDS`` at most
  (a check may wait on a slow disk: that worker is not ready, not hung);
- supervisor → worker: ``pod`` (status, workers: each index's state) on every change;
- the pod's reconciliation: the supervisor's asks (``quiet``, ``take``, ``peek``,
  ``confirm``, ``give_back``, ``window``; ``serving.podtally``), the worker's ``answer``s.

A worker whose connection closes (the supervisor is gone) drains and exits as on
SIGTERM; a worker that sends nothing for ``HUNG_SECONDS`` is killed by the supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any

from aiohttp import web

from proxy.serving.pod import POD_STATE, Place
from proxy.serving.podtally import TallyDesk
from proxy.serving.readiness import READINESS

PING_SECONDS = 1.0
# Far above the longest the loop may legitimately block (the gc.freeze at start included).
HUNG_SECONDS = 10.0

Message = dict[str, Any]


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message:
    """One line as a message; anything else is an empty message (ignored)."""
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


async def worker_link(place: Place, app: web.Application, stop: asyncio.Event) -> None:
    """The worker's end, for as long as the worker serves: hello, then its readiness
    every second; the pod's state into ``app[POD_STATE]``. Sets ``stop`` when the
    supervisor hangs up."""
    reader, writer = await asyncio.open_unix_connection(str(place.control_socket))
    writer.write(encode({"op": "hello", "index": place.index, "pid": os.getpid()}))
    desk = TallyDesk(app, lambda answer: writer.write(encode({"op": "answer", **answer})))
    report = asyncio.create_task(_report(app, writer), name="control-report")
    ping = asyncio.create_task(_ping(writer), name="control-ping")
    try:
        while line := await reader.readline():
            message = decode(line)
            if message.get("op") == "pod":
                app[POD_STATE].update(message)
            else:
                desk.handle(message)
    except OSError:
        pass
    finally:
        desk.close()
        for task in (report, ping):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        writer.close()
        stop.set()


async def _report(app: web.Application, writer: asyncio.StreamWriter) -> None:
    check = app[READINESS]
    while True:
        ready, body = await check()
        writer.write(encode({"op": "state", "ready": ready, "problems": body["problems"]}))
        await writer.drain()
        await asyncio.sleep(PING_SECONDS)


async def _ping(writer: asyncio.StreamWriter) -> None:
    """Liveness, apart from readiness: only a loop that stops turning stops it."""
    while True:
        await asyncio.sleep(PING_SECONDS)
        writer.write(encode({"op": "ping"}))
        await writer.drain()

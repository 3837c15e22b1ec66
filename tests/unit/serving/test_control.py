"""The control channel's messages, and a worker's end of it against a real Unix socket."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from proxy.serving.control import decode, encode, worker_link
from proxy.serving.pod import POD_STATE, Place, PodState
from proxy.serving.readiness import READINESS
from tests.support.podworkers import Worker


def test_a_message_is_one_line_of_json() -> None:
    """Encoded messages decode to themselves; anything else is an empty message."""
    message = {"op": "state", "ready": True, "problems": {}}
    line = encode(message)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode(line) == message
    assert decode(b"not json\n") == {}
    assert decode(b"[1, 2]\n") == {}


async def test_a_worker_says_hello_reports_and_takes_the_pods_state() -> None:
    """Hello with its index and pid, then its readiness; the supervisor's ``pod`` message
    reaches ``app[POD_STATE]``; when the supervisor hangs up, ``stop`` is set."""
    with tempfile.TemporaryDirectory() as runtime:
        place = Place(1, 2, Path(runtime))
        heard: list[dict[str, Any]] = []

        async def supervisor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            heard.append(json.loads(await reader.readline()))
            heard.append(json.loads(await reader.readline()))
            writer.write(encode({"op": "pod", "status": "ready", "workers": {"0": "ready"}}))
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.close()

        async def check() -> tuple[bool, dict[str, Any]]:
            return True, {"status": "ready", "problems": {}}

        app = Worker(1, os.getpid()).app  # a worker's exchanges and reconciler
        app[READINESS], app[POD_STATE] = check, PodState()
        server = await asyncio.start_unix_server(supervisor, path=str(place.control_socket))
        stop = asyncio.Event()
        async with asyncio.timeout(5):
            await worker_link(place, app, stop)
        server.close()
    assert heard[0] == {"op": "hello", "index": 1, "pid": os.getpid()}
    assert heard[1] == {"op": "state", "ready": True, "problems": {}}
    assert app[POD_STATE].ready
    assert app[POD_STATE].workers == {"0": "ready"}
    assert stop.is_set()


async def test_a_worker_whose_readiness_check_waits_still_pings() -> None:
    """Liveness is apart from readiness: a check stuck on a slow disk (a journal commit
    waiting) leaves the worker's loop turning, and its pings keep coming, so the
    supervisor does not kill it as hung."""
    with tempfile.TemporaryDirectory() as runtime:
        place = Place(0, 1, Path(runtime))
        heard: list[dict[str, Any]] = []

        async def supervisor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(3):
                heard.append(json.loads(await reader.readline()))
            writer.close()

        async def check() -> tuple[bool, dict[str, Any]]:
            await asyncio.Event().wait()
            raise AssertionError("never")

        app = Worker(0, os.getpid()).app
        app[READINESS], app[POD_STATE] = check, PodState()
        server = await asyncio.start_unix_server(supervisor, path=str(place.control_socket))
        async with asyncio.timeout(5):
            await worker_link(place, app, asyncio.Event())
        server.close()
    assert heard == [
        {"op": "hello", "index": 0, "pid": os.getpid()},
        {"op": "ping"},
        {"op": "ping"},
    ]

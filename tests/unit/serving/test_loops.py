"""A process's event loop (proxy/serving/loops.py; the rest of the process: limits,
signals, the run loop, in tests/process): uvloop by default (--event-loop) with asyncio's
own to fall back to, and the in-process tests on the same loop the proxy serves on."""

from __future__ import annotations

import asyncio
import os

import pytest
import uvloop

from proxy.serving.loops import new_event_loop
from proxy.settings import EventLoop, load_settings


def test_uvloop_by_default_asyncio_to_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """--event-loop is uvloop unless asyncio is asked for."""
    monkeypatch.delenv("USAGE_PROXY_EVENT_LOOP", raising=False)
    assert load_settings({"upstream": "http://vllm:8000"}, None).event_loop is EventLoop.UVLOOP
    monkeypatch.setenv("USAGE_PROXY_EVENT_LOOP", "asyncio")
    assert load_settings({"upstream": "http://vllm:8000"}, None).event_loop is EventLoop.ASYNCIO


@pytest.mark.parametrize(("kind", "uv"), [(EventLoop.UVLOOP, True), (EventLoop.ASYNCIO, False)])
def test_the_loop_the_process_creates(kind: EventLoop, uv: bool) -> None:
    """Each kind gives a loop of its own kind, and it runs."""
    loop = new_event_loop(kind)
    try:
        assert isinstance(loop, uvloop.Loop) is uv
        assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
    finally:
        loop.close()


async def test_the_suite_runs_on_the_serving_loop() -> None:
    """tests/conftest.py's loop factory: what USAGE_PROXY_EVENT_LOOP says, else uvloop."""
    uv = os.environ.get("USAGE_PROXY_EVENT_LOOP", "uvloop") == "uvloop"
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop) is uv

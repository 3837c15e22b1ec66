"""The event loop a process of the proxy runs on, a worker's or the supervisor's: light to
import, so the supervisor need not import the application to get one."""

from __future__ import annotations

import asyncio

import uvloop

from proxy.settings import EventLoop


def new_event_loop(kind: EventLoop) -> asyncio.AbstractEventLoop:
    """The loop the process serves on: uvloop's (aiohttp runs on it unchanged) or, to fall
    back, asyncio's own."""
    if kind is EventLoop.UVLOOP:
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()

"""The proxy's own endpoints' helpers: a pod worker's task sampler."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from proxy.metrics import Metrics
from proxy.serving.admin import task_sampler_context
from proxy.settings import Settings


async def test_a_workers_task_gauge_is_sampled_while_the_app_runs() -> None:
    """In a pod (multiprocess metrics) no scrape-time callback can read a worker's loop:
    the sampler sets the leak canary from the loop's tasks, follows new ones, and stops
    with the application (its own task is not left behind)."""
    metrics = Metrics(Settings(upstream="http://x"), multiprocess_dir=None)
    lifetime = task_sampler_context(metrics, every=0.01)(web.Application())
    await lifetime.__anext__()
    await asyncio.sleep(0.05)
    before = metrics.tasks._value.get()
    assert before == len(asyncio.all_tasks())
    sleepers = [asyncio.create_task(asyncio.sleep(10)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert metrics.tasks._value.get() == before + 3
    for task in sleepers:
        task.cancel()
    with pytest.raises(StopAsyncIteration):
        await lifetime.__anext__()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "task-sampler"]

"""Fixtures of the whole-app tests."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.proxies import fake_and_proxy

# Modules whose tests time the store's calls against its timeout (50 to 500 ms).
TIMED_STORE_MODULES = ("test_shared_limits",)


@pytest.fixture(autouse=True)
def earlier_tests_frozen(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that times the store's calls runs with the objects every earlier test left
    frozen out of the collector's reach: in a run of 3,000 tests a full collection walks
    all of them and can stall the event loop past a 50 ms store timeout, which is the
    test process's heap, not the proxy's behaviour (two full runs each failed one timing
    check of these modules, each passing alone; the likeliest cause found, not proven).
    The test's own objects are collected as usual."""
    if not request.node.path.name.startswith(TIMED_STORE_MODULES):
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture
async def open_proxy(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    """Proxy without keys: a gateway in front sets X-Tenant-Id."""
    return await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tenant_header="X-Tenant-Id"
    )


@pytest.fixture
def exporting(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, api_keys: Any
) -> Callable[..., Awaitable[tuple[Any, Any, Path, Path]]]:
    """Start a proxy with a key map (``keys``: tenant to key) exporting JSON lines; it
    gives the fake, the client, the journal and the export file."""

    async def start(keys: dict[str, str], **options: Any) -> tuple[Any, Any, Path, Path]:
        export = tmp_path / "out.jsonl"
        fake, client = await fake_and_proxy(
            aiohttp_server,
            aiohttp_client,
            minilm_path,
            api_keys=api_keys(**keys),
            jsonl=str(export),
            **options,
        )
        return fake, client, tmp_path / "journal.sqlite", export

    return start

"""The upstream side of connections: one session, never more than --upstream-connections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.serving.upstream import SESSION
from tests.support.proxies import fake_and_proxy


async def test_upstream_connections_are_capped(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """The one ClientSession never opens more than --upstream-connections to vLLM."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, upstream_connections=3
    )
    assert client.app[SESSION].connector.limit == 3

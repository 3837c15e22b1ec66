"""Fixtures of the whole-app tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.proxies import fake_and_proxy


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

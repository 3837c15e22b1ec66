"""Operator mistakes the proxy must explain (issue #39 cases 10 and 11): /readyz says why
it is not ready, and a request does not wait for discovery that cannot succeed."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.settings import Settings
from tests.support.fakevllm import FakeVLLM
from tests.support.texts import DOCS, QUERY


@pytest.fixture(scope="session")
def raw_minilm(minilm_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


async def until_problem(client: TestClient[Any, Any]) -> dict[str, Any]:
    """/readyz's body once the first discovery attempt has failed."""
    catalog = client.app[CATALOG]
    async with asyncio.timeout(10):
        while catalog.problem is None:
            await asyncio.sleep(0.02)
    ready = await client.get("/readyz")
    assert ready.status == 503
    body: dict[str, Any] = await ready.json()
    return body


async def test_upstream_ending_in_v1(
    aiohttp_server: Any, aiohttp_client: Any, raw_minilm: Any, minilm_path: Path
) -> None:
    """--upstream http://host:8000/v1: /readyz said "not ready" with problems {} and every
    rerank waited the 5 s accounting timeout. Now /readyz names the 404 and suggests the
    root, and a rerank is answered at once (billed unaudited, as before)."""
    server = await aiohttp_server(FakeVLLM(raw_minilm, minilm_path).app())
    base = str(server.make_url("")).rstrip("/")
    settings = Settings(upstream=f"{base}/v1", accounting_timeout=5)
    client = await aiohttp_client(create_app(settings))
    problem = (await until_problem(client))["problems"]["upstream"]
    assert f"{base}/v1/version" in problem
    assert f"--upstream {base}/v1 ends in /v1: give vLLM's root ({base})" in problem
    started = time.monotonic()
    resp = await client.post("/rerank", data=json.dumps({"query": QUERY, "documents": DOCS}))
    assert resp.status == 200
    assert resp.headers["x-usage-verdict"] == "unaudited"
    assert time.monotonic() - started < 2


async def test_unreachable_upstream_is_a_named_problem(aiohttp_client: Any) -> None:
    """An upstream nobody listens on: /readyz says unreachable (problems was empty)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(upstream=f"http://127.0.0.1:{port}", connect_timeout=1)
    client = await aiohttp_client(create_app(settings))
    problem = (await until_problem(client))["problems"]["upstream"]
    assert problem.startswith(f"discovery failed: http://127.0.0.1:{port}/version: upstream ")
    assert "unreachable" in problem


async def test_missing_tokenizer_directory_is_said_as_such(
    aiohttp_server: Any, aiohttp_client: Any, raw_minilm: Any, minilm_path: Path
) -> None:
    """models.X.tokenizer naming a directory that is not there was reported as "no
    readable config.json ... set family" (advice that then failed with "Repo id must be in
    the form"); now the problem says the directory is missing, logged as a warning."""
    server = await aiohttp_server(FakeVLLM(raw_minilm, minilm_path).app())
    missing = "/models/does-not-exist"
    settings = Settings(
        upstream=str(server.make_url("")), models={"minilm": {"tokenizer": missing}}
    )
    with capture_logs() as logs:
        client = await aiohttp_client(create_app(settings))
        assert await client.app[CATALOG].wait_ready(10)
    body = await (await client.get("/readyz")).json()
    assert body["problems"]["minilm"] == (
        f"models.minilm.tokenizer: {missing} is not a directory in the proxy's container; "
        "fix the path or mount the model there"
    )
    found = [e for e in logs if e["event"] == "model_discovered"]
    assert [e["log_level"] for e in found] == ["warning"]

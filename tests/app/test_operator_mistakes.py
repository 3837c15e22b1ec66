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


async def test_limits_are_said_when_loaded_and_their_mistakes_warned(
    aiohttp_server: Any, aiohttp_client: Any, raw_minilm: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Issue #54 item 4: a limits file was loaded without a log line, and an unknown model,
    a tenant not in the key file or an empty file started without a word; a bad reload was
    logged as pydantic's dump. Now: ``limits_loaded`` with the policy count at start and on
    each reload, a warning per probable mistake (the model once discovery knows the served
    names), ``limits_empty`` for a file that limits nothing, and a reload's problems as
    plain sentences."""
    import hashlib

    from proxy.serving.limitsfile import LIMITSFILE

    fake = FakeVLLM(raw_minilm, minilm_path)
    server = await aiohttp_server(fake.app())
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {hashlib.sha256(b'k').hexdigest()}\n")
    limits = tmp_path / "limits.yaml"
    limits.write_text(
        "tenants:\n  acme: {requests_per_minute: 5, models: {minilmm: {requests_per_day: 1}}}\n"
        "  acmee: {requests_per_day: 5}\n"
    )
    settings = Settings(
        upstream=str(server.make_url("")),
        api_keys=str(keys),
        limits=str(limits),
        journal=str(tmp_path / "journal.sqlite"),
    )
    with capture_logs() as logs:
        client = await aiohttp_client(create_app(settings))
        assert await client.app[CATALOG].wait_ready(10)
        for _ in range(50):  # the model check runs once discovery is done
            if any(e["event"] == "limits_mistake" and ".models." in e["problem"] for e in logs):
                break
            await asyncio.sleep(0.02)
    (loaded,) = [e for e in logs if e["event"] == "limits_loaded"]
    assert (loaded["why"], loaded["policies"], loaded["limits"], loaded["tenants"]) == (
        "start",
        3,
        3,
        2,
    )
    warned = [e["problem"] for e in logs if e["event"] == "limits_mistake"]
    assert warned == [
        "tenants.acmee: no tenant 'acmee' in the --api-keys file, so no request is ever "
        "billed to it; did you mean 'acme'?",
        f"tenants.acme.models.minilmm: the upstream serves no model 'minilmm' (it serves "
        f"{fake.name}); did you mean '{fake.name}'?",
    ]
    limits.write_text("tenants:\n  acme: {prompt_token_per_minute: 5}\n")
    with capture_logs() as logs:
        assert not client.app[LIMITSFILE].reload("SIGHUP")
    (failed,) = logs
    assert failed["event"] == "limits_reload_failed"
    assert failed["error"] == (
        "'prompt_token_per_minute' is not a limit or setting of tenant 'acme'; "
        "did you mean 'prompt_tokens_per_minute'?"
    )
    limits.write_text("")
    with capture_logs() as logs:
        assert client.app[LIMITSFILE].reload("changed")
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("limits_loaded", "info"),
        ("limits_empty", "warning"),
    ]
    assert logs[1]["problem"] == "the file sets no limit: every tenant is unlimited"


def test_a_limits_file_that_does_not_validate_stops_the_start_in_one_sentence(
    tmp_path: Path,
) -> None:
    """At start-up too: the flag, the path and the plain problem, no pydantic dump."""
    from proxy.serving.startup import StartupError

    limits = tmp_path / "limits.yaml"
    limits.write_text("tenant:\n  acme: {requests_per_minute: 5}\n")
    settings = Settings(upstream="http://127.0.0.1:9", limits=str(limits), journal="off")
    with pytest.raises(StartupError) as refused:
        create_app(settings)
    assert str(refused.value) == (
        f"cannot read --limits {limits}: 'tenant' is not a key of a limits file (timezone, "
        "default, tenants); did you mean 'tenants'?; fix the path, or the file (README: "
        "Budgets and rate limits)"
    )

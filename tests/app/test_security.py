"""Security: secrets never leak, tenants cannot be spoofed, the proxy only reaches its
upstream, request smuggling is rejected."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.journal_files import read_journal
from proxy.serving.keys import OUTBOX
from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import free_port
from tests.support.proxies import fake_and_proxy
from tests.support.waits import eventually

KEY = "sk-live-SECRETKEY-0123456789"
PASSWORD = "pw-SECRETPASSWORD"
GOOD = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}


@pytest.fixture
async def rig(exporting: Any) -> Any:
    """Proxy with a secret key, a ledger password and debug logs, exporting JSON lines."""
    dsn = f"postgresql://billing:{PASSWORD}@127.0.0.1:{free_port()}/usage"
    return await exporting({"acme": KEY}, log_level="debug", drain_timeout=1, ledger_dsn=dsn)


async def test_secrets_never_written_anywhere(
    rig: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Bearer key and ledger password appear in no log, record, export, metric or error."""
    _fake, client, journal, jsonl = rig
    headers = {"Authorization": f"Bearer {KEY}"}
    assert (await client.post("/rerank", json=GOOD, headers=headers)).status == 200
    bad = await client.post("/rerank", json={"query": 1}, headers=headers)
    await bad.read()
    chat = await client.post("/v1/chat/completions", json={"messages": []}, headers=headers)
    await chat.read()
    metrics = await (await client.get("/metrics")).text()
    outbox = client.app[OUTBOX]
    assert outbox is not None

    async def ledger_failed() -> bool:  # its retries and their error are then logged
        return outbox.state["postgres"].failures >= 1

    await eventually(ledger_failed)
    written = "\n".join(
        [
            capsys.readouterr().out,
            capsys.readouterr().err,
            caplog.text,
            metrics,
            "\n".join(read_journal(journal)),
            jsonl.read_text() if jsonl.exists() else "",
            await bad.text(),
            str(outbox.state["postgres"].last_error),
        ]
    )
    assert KEY not in written
    assert PASSWORD not in written
    records = [json.loads(r) for r in read_journal(journal)]
    assert {r["tenant"] for r in records} == {"acme"}
    assert {r["key_hash"] for r in records} == {key_digest(KEY)[:12]}


async def test_unconfigured_tenant_header_is_not_trusted(rig: Any) -> None:
    """Without --tenant-header, a client's X-Tenant-Id cannot pick the tenant."""
    _, client, journal, _ = rig
    headers = {"X-Tenant-Id": "someone-else", "Authorization": f"Bearer {KEY}"}
    await client.post("/rerank", json=GOOD, headers=headers)
    assert [json.loads(r)["tenant"] for r in read_journal(journal)] == ["acme"]


async def raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    return data


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (
            b"GET http://evil.example/v1/models HTTP/1.1\r\nHost: evil.example\r\n"
            b"Connection: close\r\n\r\n",
            b"400",
        ),
        (
            b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n"
            b"Connection: close\r\n\r\n",
            b"40",
        ),
        (
            b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\nGET /v1/models "
            b"HTTP/1.1\r\nHost: x\r\n\r\n",
            b"400",
        ),
    ],
    ids=["absolute-form", "connect", "cl-te-smuggling"],
)
async def test_hostile_request_targets_never_reach_upstream(
    rig: Any, request_bytes: bytes, status: bytes
) -> None:
    """Absolute-form, CONNECT and CL/TE conflicts are refused before anything is forwarded."""
    fake, client, _, _ = rig
    before = len(fake.raw_bodies)
    answer = await raw_exchange(client.server.port, request_bytes)
    assert answer.split(b" ", 2)[1].startswith(status)
    assert len(fake.raw_bodies) == before


async def test_host_header_cannot_redirect(rig: Any) -> None:
    """A forged Host header still goes to the configured upstream, with its own Host."""
    _, client, _, _ = rig
    resp = await client.get(
        "/echo/x", headers={"Host": "evil.example", "Authorization": f"Bearer {KEY}"}
    )
    echo = await resp.json()
    assert resp.status == 200
    assert echo["headers"]["host"] != "evil.example"


async def test_upstream_cookies_are_never_kept_for_other_clients(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """The proxy's one upstream session is shared by every tenant: a cookie the upstream
    (or a sticky load balancer before it) sets in one client's answer goes to that client
    only, and is never sent upstream with anyone else's request; a client's own Cookie
    header reaches the upstream unchanged. The upstream is named by
    host name, as in a deployment (aiohttp keeps no cookies for bare IP addresses)."""
    from aiohttp import web

    seen: list[str | None] = []  # the Cookie of each client's request upstream
    own: list[str | None] = []  # and of the proxy's own reads (discovery, counters)

    @web.middleware
    async def sticky(request: web.Request, handler: Any) -> web.StreamResponse:
        cookie = request.headers.get("Cookie")
        (seen if "X-Who" in request.headers else own).append(cookie)
        response: web.StreamResponse = await handler(request)
        response.set_cookie("lb", f"backend-for-{request.headers.get('X-Who')}")
        return response

    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(sticky,),
        upstream_host="localhost",
    )
    for path, send in (("/rerank", client.post), ("/v1/models", client.get)):
        for who in ("tenant-a", "tenant-b"):
            client.session.cookie_jar.clear()  # each request as from a client of its own
            seen.clear()
            kwargs: dict[str, Any] = {"json": GOOD} if path == "/rerank" else {}
            headers = {"X-Who": who, "Cookie": f"own={who}"}
            response = await send(path, headers=headers, **kwargs)
            assert response.status == 200
            assert response.cookies["lb"].value == f"backend-for-{who}"
            assert seen == [f"own={who}"], (path, who, seen)  # the client's, and only it
    assert own  # discovery read the upstream, and was answered cookies too
    assert set(own) == {None}  # the proxy's own reads carry no client's cookie

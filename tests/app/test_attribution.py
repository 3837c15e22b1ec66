"""Who pays: record ids are the proxy's, the key decides the tenant, tenant headers are
trusted only where configured, and header bytes that are not text never cost a record."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.serving.keys import METRICS
from scripts.vllm_cpu import free_port
from tests.support.proxies import fake_and_proxy
from tests.support.records import journal_records
from tests.support.texts import RERANK

ACME = {"Authorization": "Bearer sk-acme"}


BETA = {"Authorization": "Bearer sk-beta"}


@pytest.fixture
async def keyed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, api_keys: Any
) -> Any:
    """Proxy with a key map (acme, beta) and a tenant header that must not matter."""
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        api_keys=api_keys(acme="sk-acme", beta="sk-beta"),
        tenant_header="X-Tenant-Id",
        metrics_tenant_label=True,
        metrics_max_tenants=1,
        admin_port=free_port(),  # tenant labels are never served on the main port
        admin_host="127.0.0.1",
    )
    return fake, client, tmp_path / "journal.sqlite"


async def test_repeated_client_request_id_gives_one_record_per_exchange(keyed: Any) -> None:
    """Regression: five calls with X-Request-Id: fixed-id gave one record."""
    fake, client, journal = keyed
    ids = []
    for _ in range(5):
        resp = await client.post(
            "/rerank", json=RERANK, headers={**ACME, "X-Request-Id": "fixed-id"}
        )
        assert resp.status == 200
        ids.append(resp.headers["x-usage-record-id"])
    got = journal_records(journal)
    assert [r.record_id for r in got] == ids
    assert len(set(ids)) == 5
    assert sorted(ids) == ids  # UUIDv7: time-ordered
    assert {r.client_request_id for r in got} == {"fixed-id"}
    assert [h.get("X-Request-Id") for h in fake.seen_headers] == ["fixed-id"] * 5


async def test_another_tenants_request_id_cannot_drop_a_record(keyed: Any) -> None:
    """Regression: an old id of another tenant made INSERT OR IGNORE drop the new record."""
    _, client, journal = keyed
    await client.post("/rerank", json=RERANK, headers={**ACME, "X-Request-Id": "r-1"})
    await client.post("/rerank", json=RERANK, headers={**BETA, "X-Request-Id": "r-1"})
    assert [r.tenant for r in journal_records(journal)] == ["acme", "beta"]


@pytest.mark.parametrize(
    ("headers", "status", "tenant"),
    [
        ({**ACME, "X-Tenant-Id": "beta"}, 200, "acme"),
        ({"X-Tenant-Id": "beta"}, 401, None),
        ({"Authorization": "Bearer sk-unknown", "X-Tenant-Id": "beta"}, 401, None),
        ({**ACME, "X-Tenant-Id": "beta", "Connection": "X-Tenant-Id"}, 200, "acme"),
    ],
)
async def test_key_decides_the_tenant(
    keyed: Any, headers: dict[str, str], status: int, tenant: str | None
) -> None:
    """Regression: the header picked the tenant although keys were configured, and a
    request without a known key was forwarded and billed to anonymous."""
    fake, client, journal = keyed
    resp = await client.post("/rerank", json=RERANK, headers=headers)
    assert resp.status == status
    if status == 401:
        assert await resp.json() == {"error": "Unauthorized"}  # vLLM's own shape
        assert fake.raw_bodies == []  # never forwarded
        assert journal_records(journal) == []
    else:
        assert [r.tenant for r in journal_records(journal)] == [tenant]


async def test_probes_need_no_key(keyed: Any) -> None:
    """Health, readiness and the upstream's /health stay reachable without a key (this
    proxy has an admin port: /metrics is there, and refused here)."""
    _, client, _ = keyed
    assert (await client.get("/metrics")).status == 404
    for path in ("/healthz", "/readyz", "/health"):
        assert (await client.get(path)).status == 200, path


async def test_key_map_tenants_are_never_folded_into_other(keyed: Any) -> None:
    """With --metrics-max-tenants 1, both key-map tenants keep their own label."""
    _, client, _ = keyed
    await client.post("/rerank", json=RERANK, headers=ACME)
    await client.post("/rerank", json=RERANK, headers=BETA)
    text = client.app[METRICS].render().decode()
    assert 'tenant="acme"' in text
    assert 'tenant="beta"' in text
    assert 'tenant="other"' not in text


@pytest.mark.parametrize(
    ("value", "problem"),
    [("", "is empty"), ("x" * 201, "longer than 200"), ("a\tb", "not printable")],
)
async def test_bad_tenant_header_is_refused(open_proxy: Any, value: str, problem: str) -> None:
    """Regression: an empty value became anonymous, a long one was cut to 200 chars."""
    fake, client = open_proxy
    resp = await client.post("/rerank", json=RERANK, headers={"X-Tenant-Id": value})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert problem in error["message"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert fake.raw_bodies == []


async def test_tenant_header_listed_in_connection_is_not_trusted(
    open_proxy: Any, tmp_path: Path
) -> None:
    """Regression: `Connection: X-Tenant-Id` still attributed to the named tenant."""
    _, client = open_proxy
    headers = {"X-Tenant-Id": "tenant-b", "Connection": "X-Tenant-Id"}
    assert (await client.post("/rerank", json=RERANK, headers=headers)).status == 200
    assert [r.tenant for r in journal_records(tmp_path / "journal.sqlite")] == ["anonymous"]


async def raw_post(port: int, path: str, headers: bytes, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + headers
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return data


@pytest.mark.parametrize("stream", [False, True])
async def test_latin1_request_id_costs_neither_status_nor_record(
    open_proxy: Any, tmp_path: Path, stream: bool
) -> None:
    """Regression: a latin-1 byte in X-Request-Id gave a 500 and no record (and a streamed
    chat lost its [DONE])."""
    _, client = open_proxy
    port = client.server.port
    if stream:
        body = json.dumps({"stream": True, "messages": []}).encode()
        answer = await raw_post(port, "/v1/chat/completions", b"X-Request-Id: caf\xe9\r\n", body)
        assert b"data: [DONE]" in answer
    else:
        answer = await raw_post(
            port, "/rerank", b"X-Request-Id: caf\xe9\r\n", json.dumps(RERANK).encode()
        )
    assert answer.startswith(b"HTTP/1.1 200")
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert record.client_request_id == "caf?"


async def test_latin1_tenant_header_is_a_clear_400(open_proxy: Any) -> None:
    """A tenant name that is not UTF-8 is refused before forwarding, never a 500."""
    fake, client = open_proxy
    answer = await raw_post(
        client.server.port, "/rerank", b"X-Tenant-Id: caf\xe9\r\n", json.dumps(RERANK).encode()
    )
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"not printable UTF-8" in answer
    assert fake.raw_bodies == []


async def test_latin1_bearer_key_is_refused_not_crashed(keyed: Any) -> None:
    """An undecodable key byte is hashed as sent: unknown key, vLLM's 401."""
    _, client, _ = keyed
    answer = await raw_post(
        client.server.port,
        "/rerank",
        b"Authorization: Bearer sk-acm\xe9\r\n",
        json.dumps(RERANK).encode(),
    )
    assert answer.startswith(b"HTTP/1.1 401")

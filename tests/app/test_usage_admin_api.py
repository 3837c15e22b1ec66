"""The operators' read-only admin API of issue #62 on the admin port (an admin token), the
served OpenAPI descriptions held to what the handlers answer, and the records of two
replicas read from a real PostgreSQL ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml

from proxy.ledger.report import aggregate
from proxy.ledger.sinks.postgres import read_ledger
from proxy.serving.usage_openapi import document
from scripts.vllm_cpu import free_port
from tests.support.postgres import Cluster, fresh_database
from tests.support.records import journal_records
from tests.support.texts import RERANK
from tests.support.usage_api import (
    ACME,
    ADMIN,
    ADMIN_BASE,
    GLOBEX,
    RECORDS,
    USAGE,
    admin_proxy,
    conforms,
    traffic,
    untimed,
    usage_proxy,
)
from tests.support.waits import eventually


async def test_the_admin_api_needs_its_token_and_is_absent_from_the_main_port(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """On the admin port, the admin API answers 401 without an admin token; with one,
    every tenant's standing and the records of a range as JSON lines, a page at a time,
    filtered by tenant. On the main port it is not served (404), whatever the key."""
    client, admin = await admin_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    await traffic(client, ACME, n=2)
    await traffic(client, GLOBEX, n=1)
    base = admin + ADMIN_BASE
    paths = ("/standings", "/standings/acme", "/records", "/openapi.json")
    async with aiohttp.ClientSession() as http:
        for path in paths:
            for headers in ({}, ACME, {"Authorization": "Bearer wrong"}):
                async with http.get(base + path, headers=headers) as resp:
                    assert resp.status == 401, path
            main = await client.get("/usage-proxy/admin/v1" + path, headers=ACME)
            assert main.status == 404, path
        async with http.get(admin + "/healthz") as resp:
            assert resp.status == 200  # the rest of the port is as before
        async with http.get(base + "/standings", headers=ADMIN) as resp:
            everyone = await resp.json()
        for standing in everyone:
            conforms(standing, "Standing", "admin")
        assert [s["tenant"] for s in everyone] == ["acme", "globex"]
        async with http.get(base + "/standings/acme", headers=ADMIN) as resp:
            assert untimed(await resp.json()) == untimed(everyone[0])

        pages, after = [], None
        while True:
            query = {"limit": "3", **({"after": after} if after else {})}
            async with http.get(base + "/records", headers=ADMIN, params=query) as resp:
                assert resp.headers["x-usage-source"] == "journal"
                pages.append([yaml.safe_load(line) for line in (await resp.text()).splitlines()])
                after = resp.headers.get("x-usage-next-page")
            if after is None:
                break
        journaled = journal_records(tmp_path / "journal.sqlite")
        assert [len(p) for p in pages] == [3, 3]
        assert sorted(r["record_id"] for p in pages for r in p) == sorted(
            r.record_id for r in journaled
        )
        async with http.get(base + "/records", headers=ADMIN, params={"tenant": "globex"}) as resp:
            lines = (await resp.text()).splitlines()
        assert len(lines) == 2
        assert all('"tenant":"globex"' in line for line in lines)


async def test_without_admin_tokens_the_admin_api_is_not_served(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """An admin port without --admin-tokens serves no admin API (404 to any token, a
    tenant's key included), while the rest of the port is as before."""
    port = free_port()
    _, client = await usage_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, admin_port=port
    )
    await traffic(client, ACME, n=1)
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for path in ("/standings", "/standings/acme", "/records", "/openapi.json"):
            for headers in ({}, ADMIN, ACME):
                async with http.get(base + ADMIN_BASE + path, headers=headers) as resp:
                    assert resp.status == 404, path
        async with http.get(base + "/healthz") as resp:
            assert resp.status == 200


async def test_the_admin_api_changes_nothing_over_http(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Read only: every other method on the admin API's paths is refused, 401 without
    an admin token, 405 with one (``Allow: GET``), in vLLM's error shape, and the
    standings are as before. Audit of #62: the 405s (and a 404 under the API's prefix)
    were aiohttp's plain text."""
    client, admin = await admin_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    await traffic(client, ACME, n=1)
    base = admin + ADMIN_BASE
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/standings", headers=ADMIN) as resp:
            before = untimed((await resp.json())[0])
        for path in ("/standings", "/standings/acme", "/records", "/openapi.json"):
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                body = {"prompt_tokens_per_month": 1}
                async with http.request(method, base + path, json=body) as resp:
                    assert resp.status == 401, (method, path)
                async with http.request(method, base + path, json=body, headers=ADMIN) as resp:
                    assert resp.status == 405, (method, path)
                    assert resp.headers["Allow"] == "GET"
                    conforms(await resp.json(), "Error", "admin")
        async with http.get(base + "/nothing", headers=ADMIN) as resp:
            assert resp.status == 404
            conforms(await resp.json(), "Error", "admin")
        async with http.get(base + "/standings", headers=ADMIN) as resp:
            assert untimed((await resp.json())[0]) == before


def described(which: str, path: str) -> set[str]:
    """The statuses the description gives a path's GET."""
    return set(document(which)["paths"][path]["get"]["responses"])


async def test_every_status_a_question_is_answered_with_is_described(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Each question asked every way a client can get wrong (no key, a bad range, an
    unknown id, two different questions at once) is answered with a status the served
    description lists for that path, in the shape it describes (review of #62: the
    descriptions themselves answered an undescribed 401, and a busy tenant's 429 was
    nowhere)."""
    client, admin = await admin_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    ids = await traffic(client, ACME, n=1)
    tenant = {
        "/usage-proxy/v1/standing": ["", "?x=1"],
        "/usage-proxy/v1/usage": ["", "?since=never", "?since=2026-12-05&until=2026-12-01"],
        "/usage-proxy/v1/records/{record_id}": [ids[0], "not-an-id"],
        "/usage-proxy/v1/openapi.json": [""],
    }
    answered: dict[str, set[str]] = {}
    for template, tails in tenant.items():
        base = template.replace("{record_id}", "")
        for tail in tails:
            for headers in (ACME, {}):
                resp = await client.get(base + tail, headers=headers)
                answered.setdefault(template, set()).add(str(resp.status))
                if resp.status >= 400 and resp.status != 401:
                    conforms(await resp.json(), "Error")
    asked = [client.get(f"{USAGE}?since=2026-0{m}-01", headers=GLOBEX) for m in range(1, 10)]
    for resp in await asyncio.gather(*asked):
        answered[USAGE].add(str(resp.status))
    assert "429" in answered[USAGE]  # nine different questions at once: one at a time
    for template, statuses in answered.items():
        assert statuses <= described("tenant", template), template

    admin_paths = {
        "/usage-proxy/admin/v1/standings": [""],
        "/usage-proxy/admin/v1/standings/{tenant}": ["acme"],
        "/usage-proxy/admin/v1/records": ["", "?limit=0", "?after=nothing", "?since=never"],
        "/usage-proxy/admin/v1/openapi.json": [""],
    }
    async with aiohttp.ClientSession() as http:
        for template, tails in admin_paths.items():
            base = admin + template.replace("{tenant}", "")
            statuses = set()
            for tail in tails:
                for headers in (ADMIN, {}):
                    async with http.get(base + tail, headers=headers) as resp:
                        statuses.add(str(resp.status))
            assert statuses <= described("admin", template), template


def described_headers(which: str, path: str, status: int) -> set[str]:
    """The headers the description gives a path's GET answer of ``status``."""
    answer = document(which)["paths"][path]["get"]["responses"][str(status)]
    return {name.lower() for name in answer.get("headers", {})}


def own_headers(headers: Any) -> set[str]:
    """The headers an answer carries that the APIs set themselves (not aiohttp's)."""
    return {k.lower() for k in headers if k.lower().startswith(("x-usage-", "retry-after"))}


async def test_every_header_the_apis_answer_with_is_described(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Each header of its own an answer carries (a records page's source, whose records
    it holds, the next page's cursor; a busy tenant's retry-after) is one the served
    description gives that path and status: a client generated from the description
    finds the next page (audit of #62: the records page's x-usage-source, x-usage-holds
    and x-usage-next-page were in no description)."""
    client, admin = await admin_proxy(aiohttp_server, aiohttp_client, minilm_path, tmp_path)
    await traffic(client, ACME, n=2)
    asked = [client.get(f"{USAGE}?since=2026-0{m}-01", headers=GLOBEX) for m in range(1, 10)]
    busy = [r for r in await asyncio.gather(*asked) if r.status == 429]
    assert busy
    for resp in busy:
        assert own_headers(resp.headers) <= described_headers("tenant", USAGE, 429)
    seen: set[str] = set()
    async with aiohttp.ClientSession() as http:
        for query in ({"limit": "1"}, {}):
            path = "/usage-proxy/admin/v1/records"
            async with http.get(admin + path, headers=ADMIN, params=query) as resp:
                assert resp.status == 200
                told = own_headers(resp.headers)
                assert told <= described_headers("admin", path, 200)
                seen |= told
    assert seen == {"x-usage-source", "x-usage-holds", "x-usage-next-page"}


LEDGER = {"source": "ledger", "holds": "every replica's records"}


async def reranks(client: Any, n: int) -> list[str]:
    """``n`` of acme's reranks; the record ids their answers carry."""
    ids = []
    for _ in range(n):
        resp = await client.post("/rerank", json=RERANK, headers=ACME)
        assert resp.status == 200, await resp.text()
        ids.append(resp.headers["x-usage-record-id"])
    return ids


async def test_either_replica_answers_every_replicas_records_from_the_ledger(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    postgres: Cluster,
) -> None:
    """acme's reranks on two replicas, delivered to the ledger: replica 0's usage counts
    both replicas' records (the report's aggregate of both journals) and says it read
    the ledger; a record replica 1 made is answered by replica 0 (to acme, 404 to
    globex); the admin API's pages on replica 0 hold both replicas' records."""
    dsn = await fresh_database(postgres)
    for i in range(2):
        (tmp_path / f"r{i}").mkdir()
    first, admin = await admin_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path / "r0",
        ledger_dsn=dsn,
        instance="replica0",
    )
    _, second = await usage_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path / "r1",
        ledger_dsn=dsn,
        instance="replica1",
    )
    clients = [first, second]

    async def delivered() -> bool:
        try:
            return len(await read_ledger(dsn, None, None)) == 5
        except asyncpg.UndefinedTableError:  # the ledger makes its table on first delivery
            return False

    # Both replicas' first deliveries may race to create the ledger's table: the loser
    # retries, its pool closed (it was left open, and uvloop's close then hung here).
    mine = await reranks(clients[0], 3)
    theirs = await reranks(clients[1], 2)
    await eventually(delivered)
    journals = [journal_records(tmp_path / f"r{i}" / "journal.sqlite") for i in range(2)]
    assert {r.record_id for r in journals[0]} == set(mine)  # each replica journals its own

    usage = await (await clients[0].get(USAGE, headers=ACME)).json()
    conforms(usage, "Usage")
    assert {k: usage[k] for k in LEDGER} == LEDGER
    expected = aggregate([*journals[0], *journals[1]], group_by=("model", "operation"))
    assert [(r["requests"], r["prompt_tokens"]) for r in usage["rows"]] == [
        (row.requests, row.prompt_tokens_billed) for row in expected.rows
    ]

    answer = await clients[0].get(RECORDS + theirs[0], headers=ACME)
    assert answer.status == 200
    found = await answer.json()
    conforms(found, "RecordAnswer")
    assert {k: found[k] for k in LEDGER} == LEDGER
    assert found["record"]["record_id"] == theirs[0]
    assert (await clients[0].get(RECORDS + theirs[0], headers=GLOBEX)).status == 404

    async with aiohttp.ClientSession() as http:
        url = admin + "/usage-proxy/admin/v1/records"
        pages, after = [], None
        while True:
            query = {"limit": "2", "tenant": "acme", **({"after": after} if after else {})}
            async with http.get(url, headers=ADMIN, params=query) as resp:
                assert resp.status == 200
                assert resp.headers["x-usage-source"] == "ledger"
                assert resp.headers["x-usage-holds"] == LEDGER["holds"]
                pages.append([yaml.safe_load(line) for line in (await resp.text()).splitlines()])
                after = resp.headers.get("x-usage-next-page")
            if after is None:
                break
    assert [len(page) for page in pages] == [2, 2, 1]
    assert sorted(r["record_id"] for page in pages for r in page) == sorted(mine + theirs)

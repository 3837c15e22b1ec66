"""Where a tenant stands, with a PostgreSQL ledger (issue #62): two replicas, each with
its own journal, deliver to one real ledger; a range's usage, a record and the admin
API's pages are read from the ledger, so either replica answers every replica's records,
and says that it read the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml

from proxy.ledger.report import aggregate
from proxy.ledger.sinks.postgres import read_ledger
from tests.app.test_usage_api import (
    ACME,
    ADMIN,
    GLOBEX,
    RECORDS,
    USAGE,
    admin_proxy,
    conforms,
    usage_proxy,
)
from tests.support.postgres import (
    Cluster,
    fresh_database,
    postgres,  # noqa: F401  (session fixture)
)
from tests.support.records import journal_records
from tests.support.texts import RERANK
from tests.support.waits import eventually

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
    postgres: Cluster,  # noqa: F811
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
    mine = await reranks(clients[0], 3)
    theirs = await reranks(clients[1], 2)

    async def delivered() -> bool:
        try:
            return len(await read_ledger(dsn, None, None)) == 5
        except asyncpg.UndefinedTableError:  # the ledger makes its table on first delivery
            return False

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

"""The usage API and the admin API of ``serve --workers 2`` (issues #61, #62): whichever
worker a connection reaches, a tenant's usage and records are the pod's (every worker's
shard, each record once), and the admin API on the supervisor's ``--admin-port`` answers
the pod's standings and records behind its token."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from proxy.serving.tenancy import key_digest
from scripts.vllm_cpu import Process, free_port, start_proxy
from tests.support.processes import shard_records

POD = ("--workers", "2", "--reconcile-interval", "0")
SINCE = "2000-01-01T00:00:00Z"
COUNT = 60
TOKEN = "admin-token"
BUDGET = 100_000


def start_pod(upstream: str, workdir: Path, *args: str) -> Process:
    """``serve --workers 2`` journalling to ``workdir/j.sqlite``, with the key file of
    acme (``sk-acme``) and globex (``sk-globex``), ready."""
    keys = workdir / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-acme')}\nglobex: {key_digest('sk-globex')}\n")
    journal = ("--journal", str(workdir / "j.sqlite"), "--api-keys", str(keys))
    proxy = start_proxy(upstream, workdir, *POD, *journal, *args, port=free_port())
    proxy.wait_ready("/readyz", 60)
    return proxy


async def spend(url: str, key: str, count: int) -> list[str]:
    """``count`` embeddings with ``key``, each on a connection of its own (spread over
    both workers); the record ids answered."""
    headers = {"Authorization": f"Bearer {key}"}
    fresh = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=fresh, headers=headers) as session:

        async def one(i: int) -> str:
            body = {"model": "minilm", "input": f"embedding {i} of the pod's reads"}
            async with session.post(url + "/v1/embeddings", json=body) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
                return resp.headers["x-usage-record-id"]

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def get(url: str, token: str | None) -> tuple[int, dict[str, str], str]:
    """GET ``url`` on a new connection (the kernel may hand it to either worker): its
    status, headers and body, errors included."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def usage(url: str) -> dict[str, Any]:
    status, _, body = get(f"{url}/usage-proxy/v1/usage?since={SINCE}", "sk-acme")
    assert status == 200, body
    found: dict[str, Any] = json.loads(body)
    return found


async def test_a_tenants_usage_is_the_pods_through_any_connection(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """Records land in both shards; ten usage questions, each on a new connection, all
    count every request once with the records' prompt tokens, and every record id is
    found, whichever worker journaled it (before: each worker read its own shard only)."""
    proxy = start_pod(fake_upstream.url, tmp_path)
    try:
        ids = await spend(proxy.url, "sk-acme", COUNT)
        held = shard_records(tmp_path / "j.sqlite")
        answers = [usage(proxy.url) for _ in range(10)]
        found = [get(f"{proxy.url}/usage-proxy/v1/records/{i}", "sk-acme")[0] for i in ids]
        other = get(f"{proxy.url}/usage-proxy/v1/records/{ids[0]}", "sk-globex")[0]
    finally:
        proxy.stop()
    sizes = {p.name: len(r) for p, r in held.items()}
    assert len(held) == 2, sizes
    assert all(held.values()), sizes
    prompt = sum(r.prompt_tokens_billed or 0 for shard in held.values() for r in shard)
    for answer in answers:
        assert sum(row["requests"] for row in answer["rows"]) == COUNT, answer
        assert sum(row["prompt_tokens"] for row in answer["rows"]) == prompt, answer
    assert found == [200] * COUNT
    assert other == 404


def pages(admin: str, size: int, tenant: str = "") -> list[list[str]]:
    """Every page of the admin API's records (of ``tenant``, or everyone's), each
    after the last one's cursor."""
    out: list[list[str]] = []
    base = f"since={SINCE}&limit={size}" + (f"&tenant={tenant}" if tenant else "")
    query = base
    while True:
        status, headers, body = get(f"{admin}/usage-proxy/admin/v1/records?{query}", TOKEN)
        assert status == 200, body
        out.append([json.loads(line)["record_id"] for line in body.splitlines()])
        after = headers.get("x-usage-next-page")
        if after is None:
            return out
        query = f"{base}&after={after}"


def timeless(limits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Limits less the seconds to their reset (which differ by when each was read)."""
    return [{k: v for k, v in limit.items() if k != "reset_seconds"} for limit in limits]


def settled(url: str, token: str, billed: int) -> dict[str, Any]:
    """A standing, asked again (each time on a new connection) until its budget's use
    is ``billed`` (a reservation settles just after its answer is sent)."""
    deadline = time.monotonic() + 10
    while True:
        status, _, body = get(url, token)
        assert status == 200, body
        found: dict[str, Any] = json.loads(body)
        if found["limits"][0]["used"] == billed or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


async def test_the_admin_api_answers_the_pods_figures(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """--admin-tokens with --workers 2 (refused before): the supervisor's admin port
    answers the standings of every tenant (acme's monthly budget used by what both
    shards billed it, as the tenant's own standing says) and the pod's records, page by
    page, each once; no token or a wrong one is refused (401), and the main port serves
    none of it."""
    tokens = tmp_path / "admin.yaml"
    tokens.write_text(f"ops: {key_digest(TOKEN)}\n")
    limits = tmp_path / "limits.yaml"
    budget = {"prompt_tokens_per_month": BUDGET}
    limits.write_text(yaml.safe_dump({"tenants": {"acme": budget, "globex": budget}}))
    port = free_port()
    admin = f"http://127.0.0.1:{port}"
    flags = ("--admin-port", str(port), "--admin-tokens", str(tokens), "--limits", str(limits))
    proxy = start_pod(fake_upstream.url, tmp_path, *flags)
    try:
        acme = await spend(proxy.url, "sk-acme", COUNT // 2)
        globex = await spend(proxy.url, "sk-globex", COUNT // 2)
        billed = sum(
            r.prompt_tokens_billed or 0
            for shard in shard_records(tmp_path / "j.sqlite").values()
            for r in shard
            if r.tenant == "acme"
        )
        one = settled(f"{admin}/usage-proxy/admin/v1/standings/acme", TOKEN, billed)
        own = settled(f"{proxy.url}/usage-proxy/v1/standing", "sk-acme", billed)
        standings = get(f"{admin}/usage-proxy/admin/v1/standings", TOKEN)
        read = pages(admin, 7)
        theirs = pages(admin, 4, "globex")
        refused = [
            get(f"{admin}/usage-proxy/admin/v1/standings", token)[0]
            for token in (None, "wrong-token", "sk-acme")
        ]
        main = get(f"{proxy.url}/usage-proxy/admin/v1/standings", "sk-acme")[0]
    finally:
        proxy.stop()
    assert standings[0] == 200, standings
    assert sorted(s["tenant"] for s in json.loads(standings[2])) == ["acme", "globex"]
    assert one["tenant"] == "acme"
    assert timeless(one["limits"]) == timeless(own["limits"])
    assert one["limits"][0]["remaining"] == BUDGET - billed
    listed = [i for page in read for i in page]
    assert sorted(listed) == sorted(acme + globex)
    assert all(len(page) == 7 for page in read[:-1])
    assert sorted(i for page in theirs for i in page) == sorted(globex)
    assert refused == [401, 401, 401]
    assert main == 404


def worker_0(proxy: Process) -> int:
    """The pid of the pod's worker 0 as last started (the supervisor's log)."""
    started = [
        json.loads(line)
        for line in proxy.log.read_text().splitlines()
        if '"worker_started"' in line
    ]
    return int([s for s in started if s["worker"] == 0][-1]["pid"])


def test_the_admin_api_waits_for_a_restarting_worker_0(
    fake_upstream: Process, tmp_path: Path
) -> None:
    """Worker 0 killed: the supervisor's admin port answers 503 in vLLM's shape with
    Retry-After until the new worker 0 serves, then 200 again."""
    tokens = tmp_path / "admin.yaml"
    tokens.write_text(f"ops: {key_digest(TOKEN)}\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/usage-proxy/admin/v1/standings"
    proxy = start_pod(
        fake_upstream.url, tmp_path, "--admin-port", str(port), "--admin-tokens", str(tokens)
    )
    try:
        assert get(url, TOKEN)[0] == 200
        os.kill(worker_0(proxy), signal.SIGKILL)
        seen: list[tuple[int, dict[str, str], str]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen.append(get(url, TOKEN))
            if seen[-1][0] == 200 and len(seen) > 1:
                break
            time.sleep(0.05)
    finally:
        proxy.stop()
    statuses = [status for status, _, _ in seen]
    assert statuses[-1] == 200, statuses
    away = [(headers, body) for status, headers, body in seen if status == 503]
    assert away, statuses
    assert set(statuses) <= {200, 503}, statuses
    assert int(away[0][0]["Retry-After"]) > 0
    assert json.loads(away[0][1])["error"]["code"] == 503

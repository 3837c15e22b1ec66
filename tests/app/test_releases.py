"""vLLM 0.33.0 and 0.34.0 in front of the whole proxy (the fake answers as their code does):
``/v1/decisions`` metered in the Responses shape, joint reads refused unless opted in, and
a client's ``X-Cache-Salt`` never sent while the proxy salts per tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.proxies import FAKE_ROUTES, fake_and_proxy
from tests.support.records import journal_records

QUESTION = {"type": "predicate", "instructions": "Is it raining?"}
DECISION = {"model": "minilm", "input": "It rains.", "questions": [QUESTION]}


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
async def test_openai_decisions_are_billed_in_the_responses_shape(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, version: str
) -> None:
    """``/v1/decisions`` reports ``input_tokens`` (the whole prompt: cache reads and cache
    writes are both inside it) and ``output_tokens``: billed as they are, the cached part
    recorded, the cache writes not added again."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version=version
    )
    resp = await client.post("/v1/decisions", json=DECISION)
    assert resp.status == 200, await resp.text()
    (record,) = journal_records(tmp_path / "journal.sqlite")
    assert (record.operation, record.endpoint) == ("decisions", "/v1/decisions")
    assert (record.prompt_tokens_billed, record.completion_tokens_billed) == (12, 3)
    assert record.units.cached_prompt_tokens == 8
    assert fake.prompt_tokens_total == 12


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
async def test_joint_reads_are_refused_unless_allowed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, path: str
) -> None:
    """A joint read (0.33+) runs one engine request per canvas of questions, padded to a
    width its usage does not show: refused with 400 naming --allow-unmetered
    decisions.joint, nothing forwarded; ``"joint": "true"`` is no joint read (vLLM's
    StrictBool refuses it) and is forwarded for vLLM to answer."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version="0.34.0"
    )
    resp = await client.post(path, json={**DECISION, "joint": True})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert "--allow-unmetered decisions.joint" in error["message"]
    assert error["param"] == "joint"
    assert fake.seen_headers == []
    assert journal_records(tmp_path / "journal.sqlite") == []
    await client.post(path, json={**DECISION, "joint": "true"})
    assert len(fake.seen_headers) == 1


async def test_joint_reads_relay_unmetered_by_opt_in(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """With --allow-unmetered decisions.joint the request reaches vLLM (which answers it
    as the model can) and no record is made."""
    fake, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        version="0.34.0",
        allow_unmetered=f"{FAKE_ROUTES},decisions.joint",
    )
    resp = await client.post("/v1/decisions", json={**DECISION, "joint": True})
    assert resp.status == 400  # the fake's model is no DiffusionGemma: vLLM's own answer
    assert "DiffusionGemma" in (await resp.json())["error"]["message"]
    assert (len(fake.seen_headers), fake.prompt_tokens_total) == (1, 0)
    assert journal_records(tmp_path / "journal.sqlite") == []


@pytest.mark.parametrize(("salting", "sent"), [("tenant", None), ("off", "mine")])
async def test_a_client_cache_salt_header_is_not_sent_while_salting_per_tenant(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, salting: str, sent: Any
) -> None:
    """An ``X-Cache-Salt`` header (an open vLLM change: it would override the body's
    salt) is dropped under --cache-salt tenant, as a client's body salt is never the one
    vLLM sees; with --cache-salt off it is passed as the body's is."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, version="0.34.0", cache_salt=salting
    )
    chat = {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}
    resp = await client.post("/v1/chat/completions", json=chat, headers={"X-Cache-Salt": "mine"})
    assert resp.status == 200
    (seen,) = fake.seen_headers
    assert seen.get("X-Cache-Salt") == sent

"""Closed world, round two (issue #44): request fields whose engine work the usage does not
show, fields vLLM echoes into its answer, and tenants who could read, continue, overwrite
or probe each other's stored responses and prefix cache. Each test reproduces one
numbered case of the issue against the fake vLLM (which answers as vLLM's code does)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.serving.keys import METRICS
from tests.support.fakevllm.generation import CHAT_PROMPT, beam_search_work
from tests.support.proxies import FAKE_ROUTES
from tests.support.records import journal_records
from tests.support.waits import eventually

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}


def key(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture
async def tenants(exporting: Any) -> tuple[Any, Any, Path]:
    """The fake, a client of a proxy with alice's and bob's keys, and its journal."""
    fake, client, journal, _ = await exporting(KEYS)
    return fake, client, journal


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 20, "n": 4}),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 20, "n": 4}),
    ],
)
async def test_beam_search_is_refused_with_no_engine_work(
    tenants: tuple[Any, Any, Path], path: str, body: dict[str, Any]
) -> None:
    """Case 1: beam search runs one engine request per beam per token, each re-reading the
    prompt (4,687 prompt tokens for a reported 51 on real vLLM); the usage bills the
    prompt once. It is refused before forwarding, in vLLM's error shape."""
    fake, client, journal = tenants
    resp = await client.post(path, json={**body, "use_beam_search": True}, headers=key("bob"))
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["param"] == "beam_search"
    assert "--allow-unmetered" in error["message"]
    assert (fake.prompt_tokens_total, fake.generation_tokens_total) == (0, 0)
    assert journal_records(journal) == []


async def test_beam_search_relayed_only_when_an_operator_allows_it(exporting: Any) -> None:
    """With --allow-unmetered chat.beam_search the request is relayed as vLLM answers it,
    counted as unmetered, and no record claims to bill it."""
    fake, client, journal, _ = await exporting(
        KEYS, allow_unmetered=f"{FAKE_ROUTES},chat.beam_search"
    )
    body = {"messages": [], "max_tokens": 20, "n": 4, "use_beam_search": "true"}
    resp = await client.post("/v1/chat/completions", json=body, headers=key("bob"))
    assert resp.status == 200
    assert (fake.prompt_tokens_total, fake.generation_tokens_total) == beam_search_work(
        CHAT_PROMPT, 4, 20
    )
    assert journal_records(journal) == []
    assert client.app[METRICS].unmetered.labels("chat.beam_search")._value.get() == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [], "stream": True, "request_id": "x" * (5 << 20)}),
        ("/v1/completions", {"prompt": "hi", "stream": True, "request_id": "x" * (5 << 20)}),
        ("/v1/responses", {"input": "hi", "stream": True, "metadata": {"k": "v" * (5 << 20)}}),
    ],
    ids=["chat", "completions", "responses"],
)
async def test_huge_echoed_fields_are_refused_before_forwarding(
    tenants: tuple[Any, Any, Path], path: str, body: dict[str, Any]
) -> None:
    """Case 2: a field vLLM echoes into its stream's events (``request_id`` into every
    chunk's id, ``metadata`` into the Responses events) made the event that carries the
    usage longer than the scanner reads: engine work, record ``invalid``, nothing billed.
    Echoed fields above 64 KiB together are refused with no engine work."""
    fake, client, journal = tenants
    sent = io.BytesIO(json.dumps(body).encode())  # aiohttp warns of a large bytes body
    headers = {**key("bob"), "Content-Type": "application/json"}
    resp = await client.post(path, data=sent, headers=headers)
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] in ("request_id", "metadata")
    assert fake.prompt_tokens_total == 0
    assert journal_records(journal) == []


async def test_an_echoed_field_within_the_bound_is_billed(tenants: tuple[Any, Any, Path]) -> None:
    """A client's request_id (echoed in every chunk) below the bound streams and bills as
    before; the chunk ids carry it."""
    _fake, client, journal = tenants
    body = {"messages": [], "stream": True, "request_id": "r" * 1000}
    resp = await client.post("/v1/chat/completions", json=body, headers=key("bob"))
    assert resp.status == 200
    assert f"chatcmpl-{'r' * 1000}" in await resp.text()
    (record,) = journal_records(journal)
    assert (record.verdict, record.prompt_tokens_billed) == ("reported", CHAT_PROMPT)


async def test_n_choices_are_recorded_and_expected_of_the_engine(
    tenants: tuple[Any, Any, Path],
) -> None:
    """Case 4: ``n`` choices each read the prompt (the engine's counter grows n times); the
    usage bills it once, as OpenAI does. The record says n, and the reconciler's window
    expects n times the billed prompt, so a settled window has no drift."""
    from proxy.serving.keys import RECONCILER

    fake, client, journal = tenants
    body = {"messages": [], "n": 3}
    resp = await client.post("/v1/chat/completions", json=body, headers=key("bob"))
    assert resp.status == 200
    (record,) = journal_records(journal)
    assert (record.prompt_tokens_billed, record.n) == (CHAT_PROMPT, 3)
    assert fake.prompt_tokens_total == 3 * CHAT_PROMPT
    window = client.app[RECONCILER].tally
    assert window.prompt_billed == CHAT_PROMPT
    assert window.prompt_expected == fake.prompt_tokens_total


async def _store(client: Any, tenant: str, text: str) -> str:
    """A stored response of ``tenant``; its id."""
    resp = await client.post("/v1/responses", json={"input": text}, headers=key(tenant))
    assert resp.status == 200
    return str((await resp.json())["id"])


async def test_a_stored_response_is_read_only_by_its_tenant(
    tenants: tuple[Any, Any, Path],
) -> None:
    """Case 5: bob, knowing alice's response id, read her stored answer (200). Now he gets
    vLLM's answer for an unknown id; alice still reads it."""
    fake, client, _ = tenants
    alice_id = await _store(client, "alice", "alice's secret plan")
    assert alice_id.startswith("resp_")
    assert len(alice_id) == len("resp_") + 32
    assert alice_id in fake.stored_responses  # the id the proxy minted is vLLM's key
    resp = await client.get(f"/v1/responses/{alice_id}", headers=key("bob"))
    assert resp.status == 404
    assert await resp.json() == {
        "error": {
            "message": f"Response with id '{alice_id}' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
    }
    cancel = await client.post(f"/v1/responses/{alice_id}/cancel", headers=key("bob"))
    assert cancel.status == 404
    mine = await client.get(f"/v1/responses/{alice_id}", headers=key("alice"))
    assert mine.status == 200
    assert (await mine.json())["id"] == alice_id


async def test_another_tenants_response_cannot_be_continued(
    tenants: tuple[Any, Any, Path],
) -> None:
    """Case 6: bob's ``previous_response_id`` naming alice's response made the engine
    re-read her conversation, billed to him. Refused as an unknown id, no engine work."""
    fake, client, journal = tenants
    alice_id = await _store(client, "alice", "alice's secret plan")
    before = fake.prompt_tokens_total
    body = {"input": "go on", "previous_response_id": alice_id}
    resp = await client.post("/v1/responses", json=body, headers=key("bob"))
    assert resp.status == 404
    assert (await resp.json())["error"]["param"] == "response_id"
    assert fake.prompt_tokens_total == before
    assert [r.tenant for r in journal_records(journal)] == ["alice"]
    own = await client.post("/v1/responses", json=body, headers=key("alice"))
    assert own.status == 200


async def test_a_client_chosen_response_id_is_refused(tenants: tuple[Any, Any, Path]) -> None:
    """Case 7: bob's ``request_id`` equal to alice's response id overwrote her stored
    response (vLLM stores under the request id). The proxy mints every response id: a
    chosen one is refused, alice's response stays hers and unchanged."""
    fake, client, _ = tenants
    alice_id = await _store(client, "alice", "alice's secret plan")
    stored = dict(fake.stored_responses[alice_id])
    body = {"input": "bob's text " * 100, "request_id": alice_id}
    resp = await client.post("/v1/responses", json=body, headers=key("bob"))
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "request_id"
    assert fake.stored_responses[alice_id] == stored


async def test_tenants_do_not_share_the_prefix_cache(tenants: tuple[Any, Any, Path]) -> None:
    """Case 8: bob sending alice's exact prompt was told ``cached_tokens`` (he learned she
    sent it). Each tenant's requests carry a salt of their own, also when bob sends a
    salt of his choosing; a tenant's own repeat is still served from the cache."""
    fake, client, _ = tenants
    fake.prefix_cache = True

    async def cached(tenant: str, **extra: Any) -> int:
        body = {"input": "alice's long secret prompt", **extra}
        resp = await client.post("/v1/responses", json=body, headers=key(tenant))
        return int((await resp.json())["usage"]["input_tokens_details"]["cached_tokens"])

    assert await cached("alice") == 0
    assert await cached("alice") > 0
    assert await cached("bob") == 0
    salts = {salt for salt, _ in fake.cached_prompts}
    assert await cached("bob", cache_salt=next(iter(salts))) == 0
    assert len({salt for salt, _ in fake.cached_prompts}) == 3


async def test_the_prefix_cache_is_shared_when_turned_off(exporting: Any) -> None:
    """--cache-salt off (a single-tenant deployment): the body is sent as it came."""
    fake, client, _, _ = await exporting(KEYS, cache_salt="off")
    body = {"messages": [], "cache_salt": "mine"}
    resp = await client.post("/v1/chat/completions", json=body, headers=key("bob"))
    assert resp.status == 200
    assert json.loads(fake.last_body or b"{}").get("cache_salt", "mine") == "mine"


async def test_a_client_gone_before_a_metered_answer_is_recorded_aborted(
    tenants: tuple[Any, Any, Path],
) -> None:
    """Case 9: a non-streamed metered answer whose client hung up was recorded
    ``aborted: false``; it is billed and marked aborted, as docs/metering.md says."""
    fake, client, journal = tenants
    fake.answer_delay = 0.5
    body = json.dumps({"messages": [], "stream": False}).encode()
    _reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEYS['bob']}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    writer.close()

    async def recorded() -> bool:
        return bool(journal_records(journal))

    await eventually(recorded)
    (record,) = journal_records(journal)
    assert (record.prompt_tokens_billed, record.aborted) == (CHAT_PROMPT, True)


async def test_a_relay_the_operator_allows_unmetered_still_keeps_tenants_apart(
    exporting: Any,
) -> None:
    """Review: with --allow-unmetered responses.background, bob's background request naming
    alice's response (``previous_response_id``, or her id as its ``request_id``) went to
    vLLM unchecked: it re-read or replaced her stored response. An unmetered relay is
    still kept apart; the tenant's own background response is its own."""
    fake, client, _, _ = await exporting(
        KEYS, allow_unmetered=f"{FAKE_ROUTES},responses.background"
    )
    alice_id = await _store(client, "alice", "alice's secret plan")
    stored = dict(fake.stored_responses[alice_id])
    before = fake.prompt_tokens_total
    body = {"input": "go on", "previous_response_id": alice_id, "background": True}
    assert (await client.post("/v1/responses", json=body, headers=key("bob"))).status == 404
    body = {"input": "bob's", "request_id": alice_id, "background": True}
    assert (await client.post("/v1/responses", json=body, headers=key("bob"))).status == 400
    assert fake.prompt_tokens_total == before
    assert fake.stored_responses[alice_id] == stored
    mine = await client.post(
        "/v1/responses", json={"input": "x", "background": True}, headers=key("bob")
    )
    assert mine.status == 200
    bob_id = (await mine.json())["id"]
    assert (await client.get(f"/v1/responses/{bob_id}", headers=key("bob"))).status == 200
    assert (await client.get(f"/v1/responses/{bob_id}", headers=key("alice"))).status == 404

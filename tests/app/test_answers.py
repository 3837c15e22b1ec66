"""Upstream answers too large to hold (issue #11): passed on as they come, their end held
until the record is committed, billed from the usage at their end or recorded invalid."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.ledger.journal_files import read_journal
from proxy.ledger.records import UsageRecord
from proxy.serving.downstream import ANSWER_END_BYTES
from proxy.serving.keys import METRICS
from proxy.serving.metered import METERED
from tests.support.answers import ANSWER_LIMIT, REQUESTS, slow_embeddings, streamed_answer
from tests.support.proxies import fake_and_proxy
from tests.support.sockets import trickle
from tests.support.waits import eventually


def padded(sent: list[bytes], where: bytes) -> Any:
    """A tamper for the fake vLLM: 4 x ANSWER_LIMIT of whitespace before ``where`` (the
    answer stays the same JSON document), each answer kept in ``sent``."""

    def pad(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        at = body.index(where) if where else len(body)
        sent.append(body[:at] + b" " * (4 * ANSWER_LIMIT) + body[at:])
        return sent[-1], headers

    return pad


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", sorted(REQUESTS))
async def test_an_answer_above_the_limit_is_never_held(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    path: str,
    chunked: bool,
) -> None:
    """Regression: the audited and metered paths read every upstream answer whole into
    memory, however large. Past --max-answer-bytes the client gets the upstream's bytes
    unchanged, as they arrive. A scoring answer is then recorded ``invalid`` (billed
    nothing, never missing); a metered one is billed from its end, where vLLM writes
    ``usage`` (regression: it was recorded ``invalid``, so a large enough batch of
    embeddings, e.g. 13,000 inputs of a 1,024-dimension model, cost nothing)."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, max_answer_bytes=ANSWER_LIMIT
    )
    assert (await client.post(path, json=REQUESTS[path])).status == 200  # within the limit
    (within,) = [UsageRecord.from_json(line) for line in read_journal(tmp_path / "journal.sqlite")]
    assert within.verdict != "invalid"
    fake.chunked_answers = chunked
    sent: list[bytes] = []
    fake.tamper = padded(sent, b'"usage"')
    resp = await client.post(path, json=REQUESTS[path])
    assert resp.status == 200
    assert await resp.read() == sent[0]
    record = UsageRecord.from_json(read_journal(tmp_path / "journal.sqlite")[-1])
    metrics = await (await client.get("/metrics")).text()
    invalid = f'usage_proxy_invalid_usage_total{{endpoint="{path}"}} 1.0'
    if path == "/rerank":
        assert (record.verdict, record.prompt_tokens_billed) == ("invalid", None)
        assert resp.headers["x-usage-record-id"] == record.record_id
        assert resp.headers["x-usage-verdict"] == "invalid"
        assert invalid in metrics
    else:
        assert record.verdict == "reported"
        assert record.prompt_tokens_billed == within.prompt_tokens_billed == 4
        assert invalid not in metrics


async def test_a_chat_answer_too_large_to_hold_is_billed_from_its_end(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """vLLM's chat answer has members after ``usage`` (``prompt_logprobs``,
    ``kv_transfer_params``, ... mostly null): the usage is still read from the end."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, max_answer_bytes=ANSWER_LIMIT
    )
    sent: list[bytes] = []
    pad = padded(sent, b'"usage"')
    trailing = b',"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}'
    fake.tamper = lambda body, headers: pad(body[:-1] + trailing, headers)
    resp = await client.post("/v1/chat/completions", json={"messages": []})
    assert resp.status == 200
    assert await resp.read() == sent[0]
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "reported",
        5,
        3,
    )


@pytest.mark.parametrize("room_full", [False, True], ids=["above-8-MiB", "room-full"])
async def test_megabytes_after_the_usage_of_a_chat_answer_passed_on_are_billed(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    room_full: bool,
) -> None:
    """Regression (#27, case 4): an answer passed on as it came was billed only from a
    usage within its last 64 KiB, and vLLM writes ``prompt_logprobs`` after ``usage``: a
    chat answer above 8 MiB with more after its usage, or any such answer while other
    clients' answers filled the room for held answers, was recorded ``invalid``, prompt
    and completion free. The top-level usage is now read as the answer passes."""
    import proxy.serving.metered

    if room_full:  # bob's unread answers took the room: alice's small one is passed on
        monkeypatch.setattr(proxy.serving.metered, "HELD_ANSWERS_TOTAL", 0)
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, max_answer_bytes=ANSWER_LIMIT
    )
    logprobs = [{"7": {"logprob": -0.25, "rank": 1, "decoded_token": '"usage": {}'}}] * 2_000
    after = b',"prompt_logprobs":' + json.dumps(logprobs).encode() + b',"kv_transfer_params":null}'
    assert len(after) > 64 * 1024
    sent: list[bytes] = []
    pad = padded(sent, b'"usage"') if not room_full else None

    def tamper(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        body = body[:-1] + after
        if pad is None:
            sent.append(body)
            return body, headers
        return pad(body, headers)

    fake.tamper = tamper
    resp = await client.post("/v1/chat/completions", json={"messages": []})
    assert resp.status == 200
    assert await resp.read() == sent[0]
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "reported",
        5,
        3,
    )


async def test_a_large_metered_answer_is_not_held_even_below_the_limit(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: a metered answer of up to --max-answer-bytes (256 MiB) was held whole
    and parsed (memory, and the GIL: about 20 ms per 16 MB). Above HELD_ANSWER_BYTES it
    streams through like one above the limit, billed from its end."""
    from proxy.serving.metered import HELD_ANSWER_BYTES

    client, first, release = await slow_embeddings(
        aiohttp_server, aiohttp_client, minilm_path, HELD_ANSWER_BYTES, limit=None
    )
    early = len(first) - ANSWER_END_BYTES
    try:  # headers and all but the end arrive while the upstream still sends
        post = client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"])
        resp = await asyncio.wait_for(post, 10)
        assert resp.status == 200
        assert await asyncio.wait_for(resp.content.readexactly(early), 10) == first[:early]
    finally:
        release.set()
    assert (await resp.read()).endswith(b'"total_tokens": 3}}')
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed) == ("reported", 3)
    assert "x-usage-record-id" not in resp.headers  # sent before the usage came


async def test_metered_answers_held_at_once_are_bounded(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: every metered answer up to 8 MiB was held whole whatever the others
    held, so many clients fetching answers of a few MiB (or not reading them) added up
    without bound. Past HELD_ANSWERS_TOTAL held at once, the next one is passed on as it
    comes and billed from its end; its room is given back once each answer has gone."""
    import proxy.serving.metered

    monkeypatch.setattr(proxy.serving.metered, "HELD_ANSWER_BYTES", 600_000)
    monkeypatch.setattr(proxy.serving.metered, "HELD_ANSWERS_TOTAL", 1_000_000)
    client, _, release = await slow_embeddings(
        aiohttp_server, aiohttp_client, minilm_path, 100_000, limit=None
    )
    room = client.app[METERED].room
    held = asyncio.create_task(client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"]))

    async def taken() -> bool:  # length unknown: the most one answer may hold
        return room.held == 600_000

    await eventually(taken)
    # no room left: passed on as it comes, its headers before the upstream is done
    post = client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"])
    passed = await asyncio.wait_for(post, 10)
    release.set()
    answers = [await held, passed]
    for resp in answers:
        assert resp.status == 200
        assert (await resp.read()).endswith(b'"total_tokens": 3}}')
    assert "x-usage-record-id" in answers[0].headers  # held whole, read, then sent
    assert "x-usage-record-id" not in answers[1].headers  # passed on as it came
    records = [UsageRecord.from_json(line) for line in read_journal(tmp_path / "journal.sqlite")]
    assert [(r.verdict, r.prompt_tokens_billed) for r in records] == [("reported", 3)] * 2
    assert room.held == 0  # given back once each answer has gone
    again = await client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"])
    assert "x-usage-record-id" in again.headers


async def test_a_client_leaving_a_large_answer_still_pays(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: a client that hung up while an answer above the limit was passed on
    (a large batch of embeddings, the engine's work done) left no record at all. The
    upstream is read to its end and the usage billed, the record marked aborted."""
    client, _, release = await slow_embeddings(
        aiohttp_server, aiohttp_client, minilm_path, 4 * ANSWER_LIMIT
    )
    body = json.dumps(REQUESTS["/v1/embeddings"]).encode()
    reader, writer = await trickle(client.server.port, "/v1/embeddings", len(body), body)
    seen = b""
    while len(seen) < 2 * ANSWER_LIMIT:
        seen += await asyncio.wait_for(reader.read(65536), 10)
    with capture_logs() as logs:
        writer.close()
        await asyncio.sleep(0.2)  # the proxy notices on its next write
        release.set()
        await eventually(lambda: _has_records(tmp_path / "journal.sqlite"))
    events = [entry["event"] for entry in logs]
    assert "client_disconnected" in events
    assert "upstream_failed_mid_body" not in events  # it used to blame the upstream
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed, record.aborted) == ("reported", 3, True)
    assert client.app[METRICS].aborted.labels("/v1/embeddings")._value.get() == 1


async def _has_records(journal: Path) -> bool:
    return bool(read_journal(journal))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_metered_answer_too_large_and_not_ending_with_usage_is_invalid(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path, chunked: bool
) -> None:
    """An answer passed on as it came without a top-level usage member (here its usage
    is nested in another member) is recorded ``invalid``: billed nothing, never missing."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, max_answer_bytes=ANSWER_LIMIT
    )
    fake.chunked_answers = chunked
    sent: list[bytes] = []
    pad = padded(sent, b"")

    def nested(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        return pad(body.replace(b'"usage":', b'"extra": {"usage":')[:-1] + b"}}", headers)

    fake.tamper = nested
    resp = await client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"])
    assert resp.status == 200
    assert await resp.read() == sent[0]
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed) == ("invalid", None)
    metrics = await (await client.get("/metrics")).text()
    assert 'usage_proxy_invalid_usage_total{endpoint="/v1/embeddings"} 1.0' in metrics


async def test_a_large_answer_streams_through_before_it_ends(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Past the limit the proxy holds nothing but the answer's last ANSWER_END_BYTES
    (where the usage is): the client reads the bytes before them while the upstream is
    still sending."""
    client, first, release = await slow_embeddings(
        aiohttp_server, aiohttp_client, minilm_path, 2 * ANSWER_LIMIT
    )
    resp = await client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"])
    assert resp.status == 200
    early = len(first) - ANSWER_END_BYTES
    assert await asyncio.wait_for(resp.content.readexactly(early), 10) == first[:early]
    release.set()
    assert (await resp.read()).endswith(b'"total_tokens": 3}}')


async def test_a_stream_event_above_the_bound_is_passed_on_and_the_stream_still_billed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: a streamed completion whose first event is longer than
    MAX_EVENT_BYTES (``echo`` with ``logprobs`` on a long prompt) was passed on unread to
    its end and recorded ``invalid``: the client chose not to pay. Now that event passes
    on as it comes, never held, and the usage after it is billed and hidden from the
    client that did not ask for it."""
    from proxy.wire.sse import MAX_EVENT_BYTES

    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    events = [
        b'data: {"choices":[{"text":"' + b"x" * 2 * MAX_EVENT_BYTES + b'"}]}\n\n',
        b'data: {"choices":[{"text":"hi"}]}\n\n',
        usage,
        b"data: [DONE]\n\n",
    ]

    async def parts() -> AsyncIterator[bytes]:
        for event in events:
            for i in range(0, len(event), 65536):
                yield event[i : i + 65536]

    giant = streamed_answer("/v1/completions", "text/event-stream", parts)
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(giant,)
    )
    body = {"stream": True, "echo": True, "logprobs": 20, "prompt": "a long prompt"}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200
    assert await resp.read() == b"".join(e for e in events if e != usage)
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed, record.completion_tokens_billed) == (
        "reported",
        5,
        2,
    )


async def test_a_cohere_embed_answer_too_large_to_hold_is_billed_from_its_meta(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """vLLM's ``/v2/embed`` answers in Cohere's shape: no ``usage``, but
    ``meta.billed_units`` (before the embeddings or after them). An answer too large to
    hold is billed from it as it passes (regression: only ``usage`` was looked for, so a
    large Cohere batch was recorded ``invalid``, billed nothing)."""
    from aiohttp import web

    rows = [[0.125] * 256 for _ in range(4 * ANSWER_LIMIT // 1500)]
    answer = {
        "id": "embd-1",
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 7}},
        "embeddings": {"float": rows},
        "texts": ["Paris."],
    }

    @web.middleware
    async def cohere(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/v2/embed":
            return await handler(request)  # type: ignore[no-any-return]
        return web.json_response(answer)

    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(cohere,),
        max_answer_bytes=ANSWER_LIMIT,
    )
    resp = await client.post("/v2/embed", json={"texts": ["Paris."], "input_type": "query"})
    assert resp.status == 200
    assert len(await resp.read()) > ANSWER_LIMIT
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed) == ("reported", 7)

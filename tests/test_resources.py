"""Bounded resources (issue #11): admission for held bodies, body deadlines, slow
uploads that must not hold an upstream connection, and upstream answers too large to hold."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from structlog.testing import capture_logs

from proxy.ledger.journal_files import read_journal
from proxy.ledger.records import UsageRecord
from proxy.serving.app import EXCHANGES
from proxy.serving.downstream import ANSWER_END_BYTES
from proxy.serving.keys import METRICS
from proxy.serving.metered import METERED
from proxy.serving.upstream import SESSION
from tests.conftest import eventually, fake_and_proxy

RERANK = json.dumps({"query": "What is the capital of France?", "documents": ["Paris."]})


async def trickle(
    port: int, path: str, length: int, first: bytes, sock: socket.socket | None = None
) -> tuple[Any, Any]:
    """Open a request announcing ``length`` body bytes and send only ``first`` (all of
    it when ``first`` is the whole body); on ``sock`` when given, already connected."""
    if sock is None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    else:  # a stream reader's buffer of 256 KiB
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 17)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
        + first
    )
    await writer.drain()
    return reader, writer


@pytest.fixture
async def tight(aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path) -> Any:
    return await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        max_inflight_body_bytes=4096,
        body_read_timeout=0.5,
    )


@pytest.mark.parametrize("path", ["/rerank", "/v1/embeddings", "/echo/upload"])
async def test_stalled_upload_is_cut_by_the_deadline(tight: Any, path: str) -> None:
    """Regression: uploads stalled one byte short were held with no timeout (and on
    pass-through paths each held a vLLM connection). Now 408 after --body-read-timeout,
    and nothing reached the upstream."""
    fake, client = tight
    reader, writer = await trickle(client.server.port, path, 1000, b'{"query": ')
    answer = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"Connection: close" in answer
    assert b"RequestTimeout" in answer
    assert fake.raw_bodies == []
    assert fake.seen_headers == []
    assert client.app[EXCHANGES].budget.held == 0


async def test_bodies_over_the_budget_get_503_with_retry_after(tight: Any) -> None:
    """Regression: no admission limit (20 concurrent 60 MiB bodies peaked at 3.5 GB).
    While one body holds the budget, the next gets vLLM-shaped 503 + Retry-After; once it
    is released, requests are admitted again."""
    _, client = tight
    reader, writer = await trickle(client.server.port, "/rerank", 4090, b"{")
    await asyncio.sleep(0.1)
    resp = await client.post("/rerank", data=RERANK, headers={"Content-Type": "application/json"})
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    assert (await resp.json())["error"]["type"] == "ServiceUnavailable"
    assert (await asyncio.wait_for(reader.read(4096), 5)).startswith(b"HTTP/1.1 408")
    writer.close()
    assert client.app[EXCHANGES].budget.held == 0
    ok = await client.post("/rerank", data=RERANK, headers={"Content-Type": "application/json"})
    assert ok.status == 200


async def test_a_lone_body_larger_than_the_budget_is_still_served(tight: Any) -> None:
    """The budget bounds bodies held together; one body alone is limited only by
    --max-body-bytes, so a big but legal request is never refused on an idle proxy."""
    _, client = tight
    docs = ["Paris is the capital of France."] * 300
    body = json.dumps({"query": "q", "documents": docs})
    assert len(body) > 4096
    resp = await client.post("/rerank", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 200


async def test_upstream_connections_are_capped(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """The one ClientSession never opens more than --upstream-connections to vLLM."""
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, upstream_connections=3
    )
    assert client.app[SESSION].connector.limit == 3


async def test_giant_word_is_proven_by_derivation_not_tokenized(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A document that is one 100 KiB word is not tokenized by the proxy (memory bound);
    the correction is still proven from the query length alone, as vLLM's engine saw it."""
    from proxy.ledger.journal_files import read_journal

    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)
    body = {"query": "What is the capital of France?", "documents": ["a" * 100_000, "Paris."]}
    resp = await client.post("/rerank", json=body)
    assert resp.status == 200
    assert resp.headers["x-usage-verdict"] == "corrected"
    (record,) = [json.loads(r) for r in read_journal(tmp_path / "journal.sqlite")]
    # Q = 9; the giant word is one [UNK]: D = 3 and 4 ("Paris." is [CLS] paris . [SEP])
    assert record["prompt_tokens_billed"] == 9 + 3 + 4


async def test_connections_beyond_the_cap_get_503_and_are_closed(
    fake_upstream: Any, tmp_path: Path
) -> None:
    """Regression: 20,000 trickling connections hit EMFILE and normal requests timed out.
    The real server refuses connections beyond --max-connections (vLLM-shaped 503, closed,
    counted) and serves again once they are gone."""
    from scripts.vllm_cpu import start_proxy

    proxy = start_proxy(fake_upstream.url, tmp_path, "--max-connections", "5", "--journal", "off")
    await asyncio.to_thread(proxy.wait_ready, "/readyz", 60)
    port = int(proxy.url.rsplit(":", 1)[1])
    try:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(reader.read(), 5)  # the proxy closes it
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503")
        assert b'"type": "ServiceUnavailable"' in answer
        for _, w in idle:
            w.close()
        await asyncio.sleep(0.3)
        status = await asyncio.to_thread(lambda: urlopen(proxy.url + "/healthz").status)
        assert status == 200
        metrics = await asyncio.to_thread(lambda: urlopen(proxy.url + "/metrics").read())
        assert b'usage_proxy_refused_requests_total{status="503"} 1.0' in metrics
    finally:
        proxy.stop()


async def test_idle_and_slow_header_connections_are_closed(
    fake_upstream: Any, tmp_path: Path
) -> None:
    """Regression: the real server kept idle client connections for aiohttp's handler
    default of 3,630 s (the docs said 75 s), so a client that connected and sent nothing,
    or trickled its headers, held one of --max-connections for an hour. Now a connection
    with no complete request within --keepalive-timeout is closed, as is one left idle
    after its answer."""
    from scripts.vllm_cpu import start_proxy

    proxy = start_proxy(fake_upstream.url, tmp_path, "--keepalive-timeout", "1", "--journal", "off")
    await asyncio.to_thread(proxy.wait_ready, "/readyz", 60)
    port = int(proxy.url.rsplit(":", 1)[1])

    async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
        return await asyncio.wait_for(reader.read(), seconds)  # b"" once closed

    try:
        silent, silent_w = await asyncio.open_connection("127.0.0.1", port)
        slow, slow_w = await asyncio.open_connection("127.0.0.1", port)
        used, used_w = await asyncio.open_connection("127.0.0.1", port)
        slow_w.write(b"POST /rerank HTTP/1.1\r\nHost: x\r\n")
        used_w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")

        async def trickle() -> None:
            for _ in range(20):  # one header byte every 0.2 s, never the blank line
                await asyncio.sleep(0.2)
                slow_w.write(b"X")

        feeding = asyncio.create_task(trickle())
        assert await closed_within(silent, 5) == b""
        assert await closed_within(slow, 5) == b""
        assert (await closed_within(used, 5)).startswith(b"HTTP/1.1 200")
        feeding.cancel()
        for w in (silent_w, slow_w, used_w):
            w.close()
    finally:
        proxy.stop()


def test_the_c_library_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: every trim after a large body ran ctypes.util.find_library (it spawns
    ldconfig, about 2 ms) on the event loop; the lookup now happens once."""
    import ctypes.util

    from proxy.serving import memory

    calls: list[str] = []
    real = ctypes.util.find_library

    def counting(name: str) -> str | None:
        calls.append(name)
        return real(name)

    memory._libc.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", counting)
    try:
        for _ in range(3):
            memory.malloc_trim()
        memory.tune_allocator()
    finally:
        memory._libc.cache_clear()
    assert calls == ["c"]


ANSWER_LIMIT = 64 * 1024
REQUESTS = {"/rerank": json.loads(RERANK), "/v1/embeddings": {"input": "Paris."}}


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
    """Whatever does not end with the usage member (here 256 KiB of whitespace after it:
    the kept end holds none) is recorded ``invalid``: billed nothing, never missing."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, max_answer_bytes=ANSWER_LIMIT
    )
    fake.chunked_answers = chunked
    sent: list[bytes] = []
    fake.tamper = padded(sent, b"")
    resp = await client.post("/v1/embeddings", json=REQUESTS["/v1/embeddings"])
    assert resp.status == 200
    assert await resp.read() == sent[0]
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.verdict, record.prompt_tokens_billed) == ("invalid", None)
    metrics = await (await client.get("/metrics")).text()
    assert 'usage_proxy_invalid_usage_total{endpoint="/v1/embeddings"} 1.0' in metrics


def streamed_answer(path: str, content_type: str, parts: Callable[[], AsyncIterator[bytes]]) -> Any:
    """A middleware for the fake vLLM: ``path`` is answered 200 with ``parts()`` written
    one by one as they come (other paths as usual)."""
    from aiohttp import web

    @web.middleware
    async def answer(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != path:
            return await handler(request)  # type: ignore[no-any-return]
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        async for part in parts():
            await response.write(part)
        await response.write_eof()
        return response

    return answer


async def slow_embeddings(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    padding: int,
    limit: int | None = ANSWER_LIMIT,
    **settings: Any,
) -> tuple[Any, bytes, asyncio.Event]:
    """A proxy (--max-answer-bytes ``limit``, None: the default; other ``settings`` as
    given) whose upstream answers embeddings with ``first`` (``padding`` bytes into
    ``data``), then waits for ``release`` to send the rest and the usage (3 tokens)."""
    release = asyncio.Event()
    first = b'{"object": "list", "data": [' + b" " * padding

    async def parts() -> AsyncIterator[bytes]:
        yield first
        await release.wait()
        yield b'], "usage": {"prompt_tokens": 3, "total_tokens": 3}}'

    slow = streamed_answer("/v1/embeddings", "application/json", parts)
    options = settings if limit is None else {"max_answer_bytes": limit, **settings}
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(slow,), **options
    )
    return client, first, release


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


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
async def test_json_work_on_large_bodies_runs_off_the_event_loop(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    large: bool,
) -> None:
    """docs/reliability.md's event-loop guarantee: parsing a metered request, reading a
    metered answer's usage and finding a scoring answer's usage run in a worker thread for
    bodies of 64 KiB and more (inline below, where a hop costs more than the work), and
    decompressing an answer always does."""
    import threading

    import proxy.serving.audited
    import proxy.serving.metered
    import proxy.serving.upstream

    on_loop: dict[str, list[bool]] = {}

    def spy(module: Any, name: str) -> None:
        original = getattr(module, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            on_loop.setdefault(name, []).append(
                threading.current_thread() is threading.main_thread()
            )
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    for module, name in (
        (proxy.serving.metered, "prepare"),
        (proxy.serving.metered, "read_usage"),
        (proxy.serving.audited, "find_usage"),
        (proxy.serving.upstream, "decode_body"),
    ):
        spy(module, name)
    fake, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)
    padding = b" " * (100 * 1024 if large else 10)

    def pad(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        return body + padding, headers  # the same JSON document, as long as asked

    fake.tamper = pad
    text = "word " * (20_000 if large else 2)
    assert (await client.post("/v1/embeddings", json={"input": text})).status == 200
    assert (await client.post("/rerank", json=json.loads(RERANK))).status == 200

    def gzipped(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        return gzip.compress(body), {**headers, "Content-Encoding": "gzip"}

    fake.tamper = gzipped
    assert (await client.post("/v1/embeddings", json={"input": "word"})).status == 200
    expected_on_loop = not large
    assert on_loop.pop("decode_body") == [False]
    assert on_loop == {
        "prepare": [expected_on_loop, True],
        "read_usage": [expected_on_loop, True],
        "find_usage": [expected_on_loop],
    }


# aiohttp's hint for a large bytes body (in the test client, and in the proxy's upstream
# request, which sends the body it holds): a copy on the event loop, not a fault.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
async def test_freed_memory_is_given_back_after_a_large_body(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/reliability.md's memory guarantee: once no body is held any more after one of
    8 MiB or more, the heap's free pages are handed back (``malloc_trim``, in a worker
    thread); smaller bodies never pay for it."""
    import proxy.serving.bodies

    trims: list[int] = []
    monkeypatch.setattr(proxy.serving.bodies, "malloc_trim", lambda: trims.append)
    _, client = await fake_and_proxy(aiohttp_server, aiohttp_client, minilm_path)

    async def chat(size: int) -> None:
        body = {"messages": [{"role": "user", "content": "x" * size}]}
        assert (await client.post("/v1/chat/completions", json=body)).status == 200

    await chat(1024)
    await asyncio.sleep(0.2)
    assert trims == []
    await chat(proxy.serving.bodies.TRIM_AFTER_BYTES)

    async def trimmed() -> bool:
        return trims == [0]

    await eventually(trimmed)
    assert client.app[EXCHANGES].budget.held == 0


async def reads_nothing(port: int, path: str, body: bytes) -> tuple[Any, Any]:
    """Send one request, then read nothing: with a 64 KiB receive buffer (and the stream
    reader's 256 KiB), the proxy's send buffer fills after a few MiB of answer and stays
    full."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await trickle(port, path, len(body), body, sock)


STALLED_ANSWER = 6 * 1024 * 1024


async def test_a_client_that_reads_nothing_lets_go_of_its_upstream_connection(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: a client that stopped reading an answer passed on as it came kept the
    upstream connection for as long as it kept its own open; --upstream-connections such
    clients (two here, 256 by default) made every other request wait for a connection and
    fail with 504. A client that accepts no byte for --send-timeout is now disconnected;
    the answer is still read to its end and billed, the record marked aborted."""
    client, _, release = await slow_embeddings(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        STALLED_ANSWER,
        send_timeout=0.5,
        upstream_connections=1,
        connect_timeout=5,
    )
    release.set()
    body = json.dumps(REQUESTS["/v1/embeddings"]).encode()
    _, writer = await reads_nothing(client.server.port, "/v1/embeddings", body)
    await asyncio.sleep(0.3)  # its answer holds the one upstream connection
    resp = await client.post("/rerank", json=REQUESTS["/rerank"])
    assert resp.status == 200, await resp.text()
    writer.close()

    async def billed() -> bool:
        return len(read_journal(tmp_path / "journal.sqlite")) == 2

    await eventually(billed)
    records = [UsageRecord.from_json(line) for line in read_journal(tmp_path / "journal.sqlite")]
    (embedded,) = [r for r in records if r.operation == "embeddings"]
    assert (embedded.prompt_tokens_billed, embedded.aborted) == (3, True)
    assert client.app[METRICS].stalled_clients._value.get() == 1


async def test_a_client_that_reads_nothing_does_not_pin_a_held_answer(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """Regression: an answer held whole (a metered answer up to 8 MiB, a scoring answer)
    stayed in memory for as long as its client kept the connection open without reading:
    40 such clients of 7 MiB answers held 370 MB, for good. Such a client is now
    disconnected after --send-timeout and the answer freed."""
    client, first, release = await slow_embeddings(
        aiohttp_server, aiohttp_client, minilm_path, STALLED_ANSWER, limit=None, send_timeout=0.5
    )
    release.set()
    body = json.dumps(REQUESTS["/v1/embeddings"]).encode()
    reader, writer = await reads_nothing(client.server.port, "/v1/embeddings", body)

    async def cut() -> bool:
        return bool(client.app[METRICS].stalled_clients._value.get() == 1)

    await eventually(cut, 5)
    got = 0
    with contextlib.suppress(ConnectionResetError):
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
            got += len(chunk)
    writer.close()
    assert got < len(first)  # the connection was closed, the rest never sent


class Buffered(asyncio.WriteTransport):
    """A client connection whose unsent bytes the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.unsent, self.aborted = 0, False

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_only_a_send_buffer_that_does_not_move_for_the_timeout_is_cut() -> None:
    """The rule behind --send-timeout: an empty send buffer, or one whose size changed
    since the last sweep (the client read some, or the proxy wrote more), is progress;
    the same unsent bytes for the whole timeout are a client that accepts nothing."""
    from proxy.metrics import Metrics
    from proxy.serving.sendwatch import SendWatch
    from proxy.settings import Settings

    watch = SendWatch(1.0, Metrics(Settings(upstream="http://127.0.0.1:1")))
    reading, idle, stalled = Buffered(), Buffered(), Buffered()
    for transport in (reading, idle, stalled):
        watch.watch(transport)
    stalled.unsent = 70_000
    for tick in range(40):  # 10 s in sweeps of a quarter timeout
        reading.unsent = 70_000 - 1_000 * (tick % 2)  # drains a little, refilled
        watch.sweep(tick * 0.25)
        assert stalled.aborted == (tick >= 4), tick  # cut once unmoved for 1 s
    assert not reading.aborted
    assert not idle.aborted
    assert watch.interval == 0.25


async def test_a_slow_client_that_keeps_reading_gets_the_whole_answer(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path
) -> None:
    """A client that reads in bursts, with pauses shorter than --send-timeout, is never
    cut, however much longer the whole answer takes: what it takes from the kernel's
    queue counts, even while the proxy's own buffer has not moved."""
    client, first, release = await slow_embeddings(
        aiohttp_server, aiohttp_client, minilm_path, STALLED_ANSWER, limit=None, send_timeout=1.0
    )
    release.set()
    body = json.dumps(REQUESTS["/v1/embeddings"]).encode()
    reader, writer = await reads_nothing(client.server.port, "/v1/embeddings", body)
    answer = b""
    while not answer.endswith(b'"total_tokens": 3}}'):
        await asyncio.sleep(0.3)
        burst = await asyncio.wait_for(reader.read(1 << 20), 5)
        assert burst, "cut"
        answer += burst
    writer.close()
    assert len(answer) > len(first)
    assert client.app[METRICS].stalled_clients._value.get() == 0


async def test_a_stream_whose_client_reads_nothing_is_still_billed(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A streamed completion whose client stops reading is cut after --send-timeout like
    any answer; the events after the cut are still read from vLLM and the usage billed,
    the record marked aborted."""
    event = b'data: {"choices":[{"text":"' + b"x" * 65_000 + b'"}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'

    async def parts() -> AsyncIterator[bytes]:
        for _ in range(STALLED_ANSWER // len(event)):
            yield event
        yield usage
        yield b"data: [DONE]\n\n"

    stream = streamed_answer("/v1/completions", "text/event-stream", parts)
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, middlewares=(stream,), send_timeout=0.5
    )
    body = json.dumps({"stream": True, "prompt": "a prompt"}).encode()
    _, writer = await reads_nothing(client.server.port, "/v1/completions", body)

    async def billed() -> bool:
        return bool(read_journal(tmp_path / "journal.sqlite"))

    await eventually(billed)
    writer.close()
    (line,) = read_journal(tmp_path / "journal.sqlite")
    record = UsageRecord.from_json(line)
    assert (record.prompt_tokens_billed, record.completion_tokens_billed, record.aborted) == (
        5,
        2,
        True,
    )
    assert client.app[METRICS].stalled_clients._value.get() == 1

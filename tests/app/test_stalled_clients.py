"""Clients that stop reading: cut after --send-timeout, their upstream connection and held
answer let go, the answer still read to its end and billed; a slow reader is never cut."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from proxy.ledger.journal_files import read_journal
from proxy.ledger.records import UsageRecord
from proxy.serving.keys import METRICS
from tests.support.answers import REQUESTS, slow_embeddings, streamed_answer
from tests.support.proxies import fake_and_proxy
from tests.support.sockets import reads_nothing
from tests.support.waits import eventually

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
        tenant_share=1.0,  # one tenant: the connection it leaves is what is tested
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

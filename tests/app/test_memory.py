"""Memory and the event loop: JSON work on large bodies runs in worker threads, and the
heap's free pages are handed back after a large body."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.serving.exchange import EXCHANGES
from tests.support.proxies import fake_and_proxy
from tests.support.waits import eventually

RERANK = json.dumps({"query": "What is the capital of France?", "documents": ["Paris."]})


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

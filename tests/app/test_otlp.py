"""The whole proxy with --otlp-metrics-endpoint: a metered request's billed tokens reach a
local OTLP/HTTP receiver as gen_ai.client.token.usage, flushed when the proxy stops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.proxies import fake_and_proxy
from tests.support.receivers import OtlpReceiver
from tests.support.records import journal_records


async def test_a_chat_is_exported_as_genai_token_usage(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """One chat is one input and one output measurement of the chat operation, under the
    served model's name, of the tokens its journaled record bills."""
    receiver = OtlpReceiver()
    collector = await aiohttp_server(receiver.app())
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        otlp_metrics_endpoint=str(collector.make_url("/v1/metrics")),
    )
    chat = {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=chat)).status == 200
    await client.close()  # the app's cleanup flushes the last export
    points = receiver.points("gen_ai.client.token.usage")
    seen = {
        (a["gen_ai.token.type"], a["gen_ai.request.model"], a["gen_ai.operation.name"])
        for a, _, _ in points
    }
    assert seen == {("input", "minilm", "chat"), ("output", "minilm", "chat")}
    (record,) = journal_records(tmp_path / "journal.sqlite")
    billed = (record.prompt_tokens_billed, record.completion_tokens_billed)
    assert sorted((a["gen_ai.token.type"], n, s) for a, n, s in points) == [
        ("input", 1, billed[0]),
        ("output", 1, billed[1]),
    ]

"""The GenAI token-usage histogram, exported by the OpenTelemetry SDK to a local OTLP/HTTP
receiver: the conventions' metric and attribute names, billed tokens, nothing without an
endpoint."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from proxy.serving.otlp import TokenUsage
from proxy.settings import Settings
from tests.support.receivers import OtlpReceiver
from tests.support.records import make_record

METRIC = "gen_ai.client.token.usage"


async def test_each_record_is_one_input_and_one_output_measurement(aiohttp_server: Any) -> None:
    """Billed prompt tokens are ``input``, billed completion tokens ``output``, under the
    current semantic conventions' names (gen_ai.provider.name, not the deprecated
    gen_ai.system); the proxy's chat is the conventions' ``chat``, a rerank keeps its
    own name; a record with no completion reports no output."""
    receiver = OtlpReceiver()
    server = await aiohttp_server(receiver.app())
    settings = Settings(
        upstream="http://127.0.0.1:8000",
        otlp_metrics_endpoint=str(server.make_url("/v1/metrics")),
        instance="proxy-1",
    )
    usage = TokenUsage(settings)
    chat = make_record(1, billed=40).model_copy(
        update={"operation": "chat", "completion_tokens_billed": 7, "model": "qwen"}
    )
    chat = chat.model_validate({**chat.model_dump(), "units": None})
    usage(chat)
    usage(make_record(2, billed=36))  # a rerank: prompt only
    await asyncio.to_thread(usage.shutdown)
    (metric,) = receiver.metrics(METRIC)
    assert metric.unit == "{token}"
    points = {
        (p[0]["gen_ai.operation.name"], p[0]["gen_ai.token.type"]): p
        for p in receiver.points(METRIC)
    }
    assert set(points) == {("chat", "input"), ("chat", "output"), ("rerank", "input")}
    attributes, count, total = points[("chat", "input")]
    assert (count, total) == (1, 40)
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.token.type": "input",
        "gen_ai.request.model": "qwen",
        "server.address": "127.0.0.1",
        "server.port": 8000,
    }
    assert points[("chat", "output")][1:] == (1, 7)
    assert points[("rerank", "input")][1:] == (1, 36)
    resource = receiver.exports[0].resource_metrics[0].resource
    named = {a.key: a.value.string_value for a in resource.attributes}
    assert (named["service.name"], named["service.instance.id"]) == ("vllm-usage-proxy", "proxy-1")


def test_without_an_endpoint_nothing_exports() -> None:
    """A proxy built without --otlp-metrics-endpoint loads no exporter of its own and
    starts no exporting thread (redis-py, which the proxy imports, loads parts of the SDK
    for its own observability, off unless configured: the OTLP exporter is not among them)."""
    code = (
        "import sys, threading\n"
        "from proxy.serving.app import create_app\n"
        "from proxy.settings import Settings\n"
        "create_app(Settings(upstream='http://127.0.0.1:9', journal='off'))\n"
        "loaded = [m for m in sys.modules if m == 'proxy.serving.otlp' or 'otlp' in m]\n"
        "print(loaded, [t.name for t in threading.enumerate() if 'tokenize' not in t.name])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] ['MainThread']"

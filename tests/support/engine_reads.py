"""Issue #58's bursts: one tenant's concurrent requests under a limits file, through the
whole proxy in front of the fake vLLM at its worst (``to_cap``: every engine request
generates to the cap vLLM 0.32.0 gives it), and the engine's work they caused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.support.fakevllm import FakeVLLM
from tests.support.proxies import limited_proxy

LONG = " ".join(f"word{i}" for i in range(40))


def at_the_cap(context: int, media_tokens: int = 200, adapters: tuple[str, ...] = ()) -> Any:
    """A fake vLLM 0.32.0 whose engine works to every cap, with a ``context`` window and
    LoRA ``adapters`` listed from the start."""

    def build(tokenizer: Any, root: Path, **options: Any) -> FakeVLLM:
        return FakeVLLM(
            tokenizer,
            root,
            **options,
            max_model_len=context,
            to_cap=True,
            media_tokens=media_tokens,
            adapters=adapters,
        )

    return build


async def burst(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    limits: dict[str, int],
    path: str,
    body: bytes,
    times: int,
    context: int = 1024,
    media_tokens: int = 200,
    adapters: tuple[str, ...] = (),
    late: tuple[str, ...] = (),
    **settings: Any,
) -> tuple[FakeVLLM, list[tuple[int, str]]]:
    """``times`` concurrent requests of one tenant under ``limits``: the fake and the
    answers the client saw (status, body). ``late``: adapters loaded once the proxy has
    discovered the rest; ``settings``: the proxy's."""
    fake, client = await limited_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        {"tenants": {"acme": limits}},
        version="0.32.0",
        fake_class=at_the_cap(context, media_tokens, adapters),
        **settings,
    )
    fake.adapters += late
    headers = {"X-Tenant-Id": "acme", "Content-Type": "application/json"}

    async def one() -> tuple[int, str]:
        resp = await client.post(path, data=body, headers=headers)
        return int(resp.status), await resp.text()

    statuses = list(await asyncio.gather(*(one() for _ in range(times))))
    return fake, statuses


def work(fake: FakeVLLM) -> int:
    """The engine's work so far: its prompt and generation counters together."""
    return fake.prompt_tokens_total + fake.generation_tokens_total


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, **fields}

"""A tenant's usage questions one at a time (``usage_api.Turns``): the same question asked
again meanwhile shares the answer being read, another question of that tenant is
answered 429 in vLLM's shape, and other tenants are never held up (review of #62)."""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy.serving.usage_api import Busy, Turns, busy


async def test_a_tenant_asks_one_question_at_a_time() -> None:
    """While acme's question is read, the same question shares its answer (read once);
    another question of acme's is refused; globex's is answered meanwhile; once the
    answer is out, acme may ask again."""
    turns, gate, reads = Turns(), asyncio.Event(), []

    async def slow(answer: str) -> str:
        reads.append(answer)
        await gate.wait()
        return answer

    first = asyncio.create_task(turns.ask("acme", ("usage", "2000"), lambda: slow("a")))
    again = asyncio.create_task(turns.ask("acme", ("usage", "2000"), lambda: slow("b")))
    await asyncio.sleep(0)
    with pytest.raises(Busy):
        await turns.ask("acme", ("usage", "2001"), lambda: slow("c"))
    other = asyncio.create_task(turns.ask("globex", ("usage", "2001"), lambda: slow("d")))
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(first, again, other) == ["a", "a", "d"]
    assert reads == ["a", "d"]
    assert await turns.ask("acme", ("usage", "2001"), lambda: slow("e")) == "e"


async def test_a_client_that_leaves_neither_ends_the_read_nor_fails_the_others() -> None:
    """The first asker leaves (its handler is cancelled): the read goes on and the one
    who asked the same question still gets the answer; a failure reaches every asker."""
    turns, gate = Turns(), asyncio.Event()

    async def slow() -> str:
        await gate.wait()
        return "answer"

    first = asyncio.create_task(turns.ask("acme", "q", slow))
    second = asyncio.create_task(turns.ask("acme", "q", slow))
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    assert await second == "answer"

    async def broken() -> str:
        raise LookupError("no")

    with pytest.raises(LookupError):
        await turns.ask("acme", "q", broken)


def test_busy_is_a_429_in_vllms_shape_with_retry_after() -> None:
    """The refusal is vLLM's error shape, code 429, with a retry-after in seconds."""
    response = busy()
    assert response.status == 429
    assert response.headers["retry-after"] == "1"
    assert response.body is not None
    error = json.loads(bytes(response.body))["error"]  # type: ignore[arg-type]
    assert (error["type"], error["code"]) == ("TooManyRequests", 429)

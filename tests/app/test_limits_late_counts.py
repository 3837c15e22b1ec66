"""Issue #58's late recounts under a token budget, the other way: a scoring request whose
count does not come within ``--accounting-timeout`` is priced at its bound (every query
and document at the context), and a bound beyond the whole limit says nothing of the
request itself. It is not told that it can never be admitted when its count fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.engine_reads import LONG, burst

# 30 documents: 2,572 tokens counted, 31 x 1,024 at the bound.
RERANK = json.dumps({"query": LONG, "documents": [f"{LONG} {i}" for i in range(30)]}).encode()
LIMIT = {"prompt_tokens_per_day": 10000}


async def test_a_late_count_is_not_refused_as_never_admissible(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """A rerank whose count came late was refused 400 "can never be admitted; reduce it"
    because its bound (31,744 tokens) is more than the 10,000-token limit, while counted
    it is 2,572, which the limit admits (the next test). The late one is a 503 to try
    again, saying its count did not come in time."""
    fake, statuses = await burst(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp_path,
        LIMIT,
        "/rerank",
        RERANK,
        1,
        accounting_timeout=0.000001,
    )
    ((status, text),) = statuses
    message = json.loads(text)["error"]["message"]
    assert "can never be admitted" not in message, message
    assert status == 503, text
    assert "not counted within" in message, message
    assert fake.prompt_tokens_total == 0


async def test_the_same_rerank_counted_in_time_is_admitted(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """The request of the test above, counted in time under the same limit: admitted,
    its count well within the limit (what makes "never" untrue)."""
    fake, statuses = await burst(
        aiohttp_server, aiohttp_client, minilm_path, tmp_path, LIMIT, "/rerank", RERANK, 1
    )
    assert [s for s, _ in statuses] == [200], statuses
    assert 0 < fake.prompt_tokens_total <= 10000

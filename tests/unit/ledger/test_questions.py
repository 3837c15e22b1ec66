"""The usage API's questions answered from records (``ledger.questions``): a record
states what vLLM reported against what is billed; and the module a reading process
imports pulls in no server (aiohttp), which is what keeps a reader small and quick to
start."""

from __future__ import annotations

import subprocess
import sys

from proxy.ledger.questions import record_json
from tests.support.records import make_record


def test_a_record_states_reported_billed_units_and_amount() -> None:
    """What vLLM reported against what is billed, the units, and the amount at the
    record's price; without prices no amount."""
    record = make_record(1, reported=57, billed=36)
    body = record_json(record, None)
    assert body["reported"] == {"prompt_tokens": 57, "completion_tokens": None}
    assert body["billed"] == {"prompt_tokens": 36, "completion_tokens": None}
    assert body["units"] == {"prompt_tokens": 36}
    assert body["verdict"] == "corrected"
    assert "amount" not in body


def test_a_reader_imports_no_server() -> None:
    """Importing the questions (what a spawned reader imports) loads neither aiohttp nor
    the serving package's modules: a reader started in 3.2 s at 85 MiB importing the
    server, 0.6 s at 36 MiB without it (review of #62)."""
    probe = (
        "import sys, proxy.ledger.questions, proxy.serving.usage_reads\n"
        "print(sorted(m for m in sys.modules if m == 'aiohttp' or m.startswith('proxy.serving.')"
        " and m != 'proxy.serving.usage_reads'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

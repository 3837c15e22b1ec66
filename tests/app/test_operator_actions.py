"""Operator actions (issue #28) never lose, keep or misattribute a record: keys rotated
the way Kubernetes rotates a Secret, a gateway that appends tenant headers, reports asked
in another time zone, and a restart without an exporter the journal still owes records."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.ledger.journal import Journal
from proxy.ledger.journal_files import discard_exporter, list_exporters, read_journal
from proxy.ledger.outbox import Outbox
from proxy.serving.keys import METRICS
from proxy.serving.tenancy import key_digest
from tests.support.proxies import fake_and_proxy
from tests.support.records import make_record
from tests.support.waits import eventually

RERANK = {"query": "What is the capital of France?", "documents": ["Paris.", "Berlin."]}


def secret_volume(root: Path, **keys: str) -> Path:
    """Write keys as a Kubernetes Secret volume does: the file is a symlink through
    ``..data`` to a timestamped directory, and an update swaps ``..data`` atomically."""
    version = root / f"..{datetime.now(UTC).strftime('%H%M%S%f')}"
    version.mkdir()
    text = "".join(f"{tenant}: {key_digest(key)}\n" for tenant, key in keys.items())
    (version / "keys.yaml").write_text(text)
    swap = root / "..data_tmp"
    swap.symlink_to(version.name)
    os.replace(swap, root / "..data")
    link = root / "keys.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/keys.yaml")
    return link


async def status_with(client: Any, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return int((await client.post("/rerank", json=RERANK, headers=headers)).status)


async def test_rotated_keys_take_effect_without_a_restart(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp_path: Path
) -> None:
    """Regression: keys were read once at start; a removed key was still billed to its
    old tenant and an added one refused. A Secret-style swap is picked up; a broken file
    is counted and the map in use stays."""
    volume = tmp_path / "secret"
    volume.mkdir()
    path = secret_volume(volume, acme="sk-old")
    _, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, api_keys=str(path)
    )
    metrics = client.app[METRICS]
    assert await status_with(client, "sk-old") == 200
    assert await status_with(client, "sk-new") == 401
    secret_volume(volume, acme="sk-new")

    async def rotated() -> bool:
        return await status_with(client, "sk-old") == 401

    await eventually(rotated)
    assert await status_with(client, "sk-new") == 200
    assert metrics.keys_loaded._value.get() == 1
    (volume / "..data").unlink()
    broken = volume / "..broken"
    broken.mkdir()
    (broken / "keys.yaml").write_text("acme: not-a-digest\n")
    (volume / "..data").symlink_to(broken.name)

    async def refused_file() -> bool:
        return bool(metrics.keys_reload_failures._value.get() == 1)

    await eventually(refused_file)
    assert await status_with(client, "sk-new") == 200  # the old map stays in use


@pytest.mark.parametrize(
    "headers",
    [
        [("X-Tenant-Id", "victim-corp"), ("X-Tenant-Id", "attacker")],
        [("X-Tenant-Id", "victim-corp, attacker")],
        [("Authorization", "Bearer a"), ("Authorization", "Bearer b")],
    ],
)
async def test_more_than_one_tenant_value_is_refused(
    aiohttp_server: Any,
    aiohttp_client: Any,
    minilm_path: Path,
    tmp_path: Path,
    headers: list[tuple[str, str]],
) -> None:
    """Regression: behind a gateway that appends rather than replaces, the client's own
    tenant header came first and won (billed to the victim), and a merged list became one
    tenant. Any ambiguity is a 400 in vLLM's shape, never forwarded."""
    fake, client = await fake_and_proxy(
        aiohttp_server, aiohttp_client, minilm_path, tenant_header="X-Tenant-Id"
    )
    before = fake.prompt_tokens_total
    resp = await client.post("/rerank", json=RERANK, headers=headers)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == 400
    assert fake.prompt_tokens_total == before
    assert read_journal(tmp_path / "journal.sqlite") == []


async def journal_at(path: Path, times: list[datetime]) -> None:
    journal = Journal(path)
    await journal.open()
    for i, moment in enumerate(times):
        await journal.append(make_record(i).model_copy(update={"time": moment}))
    await journal.close()


@pytest.mark.parametrize(
    ("since", "until"),
    [
        ("2026-11-30T21:00:00+00:00", "2026-11-30T23:00:00+00:00"),
        ("2026-11-30T22:00:00+01:00", "2026-12-01T00:00:00+01:00"),
        ("2026-11-30T16:00:00-05:00", "2026-11-30T18:00:00-05:00"),
        ("2026-12-01T06:30:00+09:30", "2026-12-01T08:30:00+09:30"),
        ("2026-11-30T21:00:00", "2026-11-30T23:00:00"),
    ],
)
async def test_report_bounds_are_instants_whatever_their_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], since: str, until: str
) -> None:
    """Regression: the journal compared --since/--until as text, so 22:00+01:00 (the
    same instant as 21:00Z) found nothing. Every spelling of one window finds the same
    records: those in [21:00Z, 23:00Z)."""
    base = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
    times = [base + timedelta(minutes=30 * i) for i in range(8)]  # 20:00 .. 23:30
    await journal_at(tmp_path / "j.sqlite", times)
    argv = ["report", "--journal", str(tmp_path / "j.sqlite"), "--format", "json"]
    assert main([*argv, "--since", since, "--until", until]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sum(row["requests"] for row in rows) == 4  # 21:00, 21:30, 22:00, 22:30


async def test_a_restart_without_an_exporter_keeps_what_it_is_owed(tmp_path: Path) -> None:
    """Regression: retention followed the exporters configured now, so a restart without
    --ledger-dsn pruned the records the ledger never received. The journal remembers
    every exporter it had; only an explicit discard lets their records go."""
    path = tmp_path / "j.sqlite"
    old = datetime.now(UTC) - timedelta(days=30)
    await journal_at(path, [old] * 5)
    journal = Journal(path)
    await journal.open()
    await journal.register(["postgres", "jsonl:x"])  # the first run's exporters
    await journal.ack("jsonl:x", 5)
    cutoff = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    outbox = Outbox(journal, [], retention=3600)  # restarted with no exporter at all
    await outbox.start()
    assert await journal.prune(cutoff) == 0  # postgres never had them
    await outbox.drain(1)
    await journal.close()
    assert list_exporters(path) == {"jsonl:x": 0, "postgres": 5}
    assert discard_exporter(path, "postgres") == 5
    journal = Journal(path)
    await journal.open()
    assert await journal.prune(cutoff) == 5
    await journal.close()


async def test_discarding_an_exporter_says_what_it_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``usage-proxy exporters`` lists each exporter's backlog; discarding one says how
    many undelivered records it lets go; an unknown name is an error."""
    path = tmp_path / "j.sqlite"
    await journal_at(path, [datetime.now(UTC)] * 3)
    journal = Journal(path)
    await journal.open()
    await journal.register(["postgres"])
    await journal.close()
    assert main(["exporters", "list", "--journal", str(path)]) == 0
    assert "postgres" in capsys.readouterr().out
    assert main(["exporters", "discard", "postgres", "--journal", str(path)]) == 0
    assert "3 record(s)" in capsys.readouterr().out
    assert main(["exporters", "discard", "postgres", "--journal", str(path)]) == 2

"""The reconciler: its settle loop under cancellation (issue #28: a 300 s shutdown hang),
and what its windows add to the drift metrics the alerts read."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from proxy.ledger.reconciler import Reconciler
from proxy.ledger.records import Units, UsageRecord
from proxy.metrics import Metrics
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


class Traffic:
    """One exchange in flight until ``end`` is called."""

    def __init__(self) -> None:
        self._quiet = asyncio.Event()
        self.in_flight, self.started, self.failed, self.refused = 1, 1, 0, 0

    def end(self) -> None:
        self.in_flight = 0
        self._quiet.set()

    async def quiet(self) -> None:
        await self._quiet.wait()


async def read_counters() -> str:
    """An upstream that never answers: a settle ends only by cancellation."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("turns", range(6))
async def test_a_cancel_as_the_traffic_goes_quiet_ends_the_settle(turns: int) -> None:
    """Python 3.11's ``asyncio.wait_for`` drops a cancellation that arrives after the
    awaited future completed but before the waiting task resumed (bpo-42130). The
    reconciler waited for quiet traffic that way, so a shutdown that cancelled it at that
    moment left ``run()`` looping and the application's cleanup awaiting it forever. The
    cancel lands after each number of loop turns across that window; it must always win."""
    traffic = Traffic()
    reconciler = Reconciler(
        traffic,
        read_counters,
        None,
        Metrics(Settings(upstream="http://x")),
        interval=15,
        instance="test",
        upstream="http://x",
    )
    task = asyncio.create_task(reconciler.settle_once(patience=30))
    await asyncio.sleep(0)  # the settle now waits for quiet traffic
    traffic.end()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done == {task}
    assert task.cancelled()


class Quiet:
    """Traffic with nothing in flight."""

    in_flight, started, failed, refused = 0, 0, 0, 0

    async def quiet(self) -> None:
        return None


def drift_alert_counters() -> list[str]:
    """The counters the shipped UsageLedgerDrift alert fires on (deploy/prometheus)."""
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    (alert,) = [
        rule
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "UsageLedgerDrift"
    ]
    return sorted(set(re.findall(r"usage_proxy_[a-z_]+_total", alert["expr"])))


@pytest.mark.parametrize(
    ("seconds", "alerts"), [(30, False), (None, True)], ids=["transcription", "bypass"]
)
async def test_a_transcriptions_engine_tokens_are_not_drift(
    seconds: int | None, alerts: bool
) -> None:
    """Issue #59 item 5: a whole transcription is billed in seconds and the engine counts
    its tokens (decoder prompt, text), so on any vLLM serving audio every window's
    unbilled tokens grew the counters UsageLedgerDrift fires on, for ever. Such a window's
    tokens are counted apart (not drift); the same growth with no transcription (a request
    that bypassed the proxy) still fires it."""
    from tests.support.records import make_record

    counters = iter(["vllm:prompt_tokens_total 100\n", "vllm:prompt_tokens_total 104\n"])

    async def read() -> str:
        return next(counters) + "vllm:generation_tokens_total 0\n"

    metrics = Metrics(Settings(upstream="http://x"))
    reconciler = Reconciler(Quiet(), read, None, metrics, interval=15, instance="i", upstream="u")
    assert await reconciler.settle_once() is None  # the baseline
    if seconds is not None:
        base = make_record(0).model_dump(exclude={"record_id", "units"})
        reconciler.account(
            UsageRecord(
                **{**base, "prompt_tokens_reported": None, "prompt_tokens_billed": None},
                units=Units(audio_seconds=seconds),
            )
        )
    window = await reconciler.settle_once()
    assert window is not None
    assert window.unbilled_prompt_tokens == 4  # the window says what the engine counted
    page = generate_latest(metrics.registry).decode()
    fired = [name for name in drift_alert_counters() if sample(page, name) > 0]
    assert bool(fired) is alerts, fired
    apart = sample(page, 'usage_proxy_unbilled_in_seconds_tokens_total{kind="prompt"}')
    assert apart == (4 if seconds else 0)


def sample(page: str, name: str) -> float:
    """A sample's value on a metrics page (0 when absent)."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", page, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_failed_reading_keeps_the_windows_records() -> None:
    """The records taken for a window whose engine reading then failed (an upstream
    without /metrics for a moment) were dropped: the next window claimed their tokens as
    unbilled. They stay in the window, which closes at the next reading."""
    from proxy.ledger.reconciler import CountersUnavailable
    from tests.support.records import make_record

    readings = iter(["vllm:prompt_tokens_total 100\n", None, "vllm:prompt_tokens_total 110\n"])

    async def read() -> str:
        reading = next(readings)
        if reading is None:
            raise CountersUnavailable("connection refused")
        return reading + "vllm:generation_tokens_total 0\n"

    metrics = Metrics(Settings(upstream="http://x"))
    reconciler = Reconciler(Quiet(), read, None, metrics, interval=15, instance="i", upstream="u")
    assert await reconciler.settle_once() is None  # the baseline
    reconciler.account(make_record(0, billed=10))
    with pytest.raises(CountersUnavailable):
        await reconciler.settle_once()
    window = await reconciler.settle_once()
    assert window is not None
    assert window.billed_prompt_tokens == 10
    assert window.unbilled_prompt_tokens == 0

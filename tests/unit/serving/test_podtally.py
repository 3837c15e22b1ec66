"""A pod's worker's end of the reconciliation (``serving.podtally``): what it answers,
what it sets aside, and that nothing set aside is ever lost."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from proxy.ledger.windows import EngineReading, Tally, settle
from proxy.serving.podtally import TallyDesk
from tests.support.podworkers import Worker


def desk_of(worker: Worker) -> tuple[TallyDesk, list[dict[str, Any]]]:
    """The worker's desk, and the answers it gave."""
    answers: list[dict[str, Any]] = []
    return TallyDesk(worker.app, answers.append), answers


def test_a_take_answers_the_counts_and_the_tally_and_sets_it_aside() -> None:
    """The answer carries the exchanges' counts and the tally; the worker tallies anew."""
    worker = Worker(0, 1)
    worker.serve(10, 5)
    worker.exchanges.failed = 1
    desk, answers = desk_of(worker)
    assert desk.handle({"op": "take", "seq": 7, "mark": 1})
    (answer,) = answers
    assert answer["seq"] == 7
    assert (answer["in_flight"], answer["started"], answer["failed"]) == (0, 2, 1)
    assert Tally(**answer["tally"]).prompt_billed == 15
    assert worker.tallied == 0


def test_a_give_back_merges_and_a_confirm_drops() -> None:
    """Given back: the records return to the window that carries on (with those tallied
    since); confirmed: they were the closed window's."""
    worker = Worker(0, 1)
    desk, _ = desk_of(worker)
    worker.serve(10)
    desk.handle({"op": "take", "seq": 1, "mark": 1})
    worker.serve(3)
    desk.handle({"op": "give_back", "mark": 1})
    assert worker.tallied == 13
    desk.handle({"op": "take", "seq": 2, "mark": 2})
    worker.serve(4)
    desk.handle({"op": "confirm", "mark": 2})
    assert worker.tallied == 4


def test_what_is_set_aside_is_never_lost() -> None:
    """A take whose end never came (the supervisor gave up on another worker) is merged
    back by the next take, and by the connection's end."""
    worker = Worker(0, 1)
    desk, answers = desk_of(worker)
    worker.serve(10)
    desk.handle({"op": "take", "seq": 1, "mark": 1})
    desk.handle({"op": "take", "seq": 2, "mark": 2})
    assert Tally(**answers[-1]["tally"]).prompt_billed == 10
    worker.serve(2)
    desk.close()
    assert worker.tallied == 12


def test_a_peek_answers_the_counts_and_moves_nothing() -> None:
    """The counts again, after the reading: the tally stays where it is."""
    worker = Worker(0, 1)
    worker.serve(10)
    desk, answers = desk_of(worker)
    desk.handle({"op": "peek", "seq": 3})
    assert answers == [{"seq": 3, "in_flight": 0, "started": 1, "failed": 0, "refused": 0}]
    assert worker.tallied == 10
    assert not desk.handle({"op": "pod"})


async def test_quiet_is_answered_once_nothing_is_in_flight() -> None:
    """Asks for a quiet moment wait for it (one waiter however many asks)."""
    worker = Worker(0, 1)
    worker.exchanges.in_flight = 1
    worker.exchanges._quiet.clear()
    desk, answers = desk_of(worker)
    desk.handle({"op": "quiet", "seq": 1})
    desk.handle({"op": "quiet", "seq": 2})
    await asyncio.sleep(0.01)
    assert answers == []
    worker.exchanges.in_flight = 0
    worker.exchanges._quiet.set()
    await asyncio.sleep(0.01)
    assert answers == [{"seq": 1}, {"seq": 2}]
    desk.close()


async def test_a_window_is_journaled_then_answered() -> None:
    """Worker 0 journals the supervisor's window as it was closed, then says so."""
    now = datetime.now(UTC)
    window = settle(
        EngineReading(100, 0, None), EngineReading(110, 0, None), Tally(), start=now, end=now,
        instance="pod", upstream="u",
    )  # fmt: skip
    worker = Worker(0, 1)
    desk, answers = desk_of(worker)
    desk.handle({"op": "window", "seq": 5, "window": window.model_dump(mode="json")})
    await asyncio.sleep(0.01)
    assert worker.shard.windows == [window]
    assert answers == [{"seq": 5, "ok": True}]


async def test_an_unreadable_window_is_refused_and_the_worker_serves_on() -> None:
    """A window that does not parse (a defect) is answered not ok, never raised into the
    control connection (whose end would stop the worker)."""
    worker = Worker(0, 1)
    desk, answers = desk_of(worker)
    assert desk.handle({"op": "window", "seq": 6, "window": {"records": "many"}})
    await asyncio.sleep(0.01)
    assert answers == [{"seq": 6, "ok": False}]
    assert worker.shard.windows == []

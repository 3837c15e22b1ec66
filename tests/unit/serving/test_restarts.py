"""The supervisor's restart decisions: back-off, "keeps dying", a start-up mistake."""

from __future__ import annotations

import signal

import pytest

from proxy.serving.restarts import GiveUp, Restart, Restarts, cause


def test_the_back_off_doubles_to_its_cap() -> None:
    """0.5 s, 1, 2, 4, ... never above 30 s, for a worker that dies young each time
    (spaced out so that it never counts as keeping dying)."""
    restarts = Restarts()
    delays = []
    for i in range(9):
        decision = restarts.exited(0, -9, uptime=1.0, now=i * 1000.0)
        assert isinstance(decision, Restart)
        delays.append(decision.after)
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_a_worker_that_ran_a_minute_starts_over() -> None:
    """After 60 s of running, the next back-off is the first again."""
    restarts = Restarts()
    assert restarts.exited(0, -9, uptime=1.0, now=0.0) == Restart(0.5)
    assert restarts.exited(0, -9, uptime=1.0, now=1.0) == Restart(1.0)
    assert restarts.exited(0, -9, uptime=60.0, now=62.0) == Restart(0.5)


def test_each_index_has_its_own_history() -> None:
    """One worker's deaths neither delay nor doom another."""
    restarts = Restarts()
    for now in range(4):
        restarts.exited(1, -9, uptime=1.0, now=float(now))
    assert restarts.exited(0, -9, uptime=1.0, now=4.0) == Restart(0.5)


def test_five_exits_within_two_minutes_give_up() -> None:
    """The fifth exit of one index within 120 s ends the pod with exit 1, naming the
    causes."""
    restarts = Restarts()
    decisions = [restarts.exited(1, -9, uptime=1.0, now=float(t)) for t in range(5)]
    assert all(isinstance(d, Restart) for d in decisions[:4])
    last = decisions[4]
    assert isinstance(last, GiveUp)
    assert last.code == 1
    assert "worker 1 exited 5 times" in last.why
    assert "signal SIGKILL" in last.why


def test_exits_spread_over_more_than_the_window_do_not_give_up() -> None:
    """Old exits leave the window: a worker that dies every minute is restarted."""
    restarts = Restarts()
    for minute in range(10):
        decision = restarts.exited(0, 1, uptime=59.0, now=minute * 61.0)
        assert isinstance(decision, Restart)


def test_a_start_up_mistake_gives_up_at_once() -> None:
    """Exit 2 is a start-up mistake (a port, a file): restarting cannot fix it."""
    decision = Restarts().exited(0, 2, uptime=0.5, now=0.0)
    assert isinstance(decision, GiveUp)
    assert decision.code == 2


def test_exit_2_after_being_ready_is_a_death_with_back_off() -> None:
    """An index that was ready once and then exits 2 (a key file broken since, a full
    disk at reopen) is restarted with back-off: the pod keeps its other workers; it still
    gives up when it keeps dying."""
    restarts = Restarts()
    restarts.ready(0)
    decisions = [restarts.exited(0, 2, uptime=5.0, now=float(t)) for t in range(5)]
    assert decisions[:4] == [Restart(0.5), Restart(1.0), Restart(2.0), Restart(4.0)]
    assert isinstance(decisions[4], GiveUp)
    assert decisions[4].code == 1
    other = restarts.exited(1, 2, uptime=0.5, now=6.0)
    assert other == GiveUp(2, "worker 1 could not start (exit 2)")


@pytest.mark.parametrize(
    ("code", "said"),
    [(0, "exit 0"), (3, "exit 3"), (-signal.SIGKILL, "signal SIGKILL"), (-200, "signal 200")],
)
def test_an_exit_as_an_operator_reads_it(code: int, said: str) -> None:
    """asyncio's negative return codes are signals."""
    assert cause(code) == said

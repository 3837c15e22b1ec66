"""Machine-wide vLLM server slots (scripts/vllm_cpu.reserve_slots): two test runs at once
ran a 24 GB machine out of memory with 21 servers alive (issue #28)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import vllm_cpu


@pytest.fixture
def slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(vllm_cpu, "SLOTS_DIR", tmp_path / "slots")
    monkeypatch.setenv("VLLM_SERVER_SLOTS", "6")
    return tmp_path / "slots"


def test_a_group_gets_all_its_slots_or_none(slots: Path) -> None:
    """All at once or none: a run holding part of what it needs never waits on another."""
    four = vllm_cpu.reserve_slots(4)
    with pytest.raises(TimeoutError):
        vllm_cpu.reserve_slots(3, wait=0.5)
    two = vllm_cpu.reserve_slots(2)  # the failed group of three held none
    for fd in four + two:
        os.close(fd)
    six = vllm_cpu.reserve_slots(6)
    assert len(six) == 6
    for fd in six:
        os.close(fd)


def test_a_server_holds_its_slot_while_it_lives(slots: Path) -> None:
    """The slot goes to the child: it stays taken after the parent let go of it, even if
    the run that started it dies, and is free once the server exits however it ends."""
    held = vllm_cpu.reserve_slots(6)
    child = vllm_cpu._spawn(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        {},
        slots / "sleeper.log",
        0,
        [held.pop()],
    )
    for fd in held:
        os.close(fd)
    try:
        with pytest.raises(TimeoutError):
            vllm_cpu.reserve_slots(6, wait=0.5)
        five = vllm_cpu.reserve_slots(5)
        assert len(five) == 5
        for fd in five:
            os.close(fd)
    finally:
        child.popen.kill()
        child.popen.wait()
    again = vllm_cpu.reserve_slots(6, wait=10)
    assert len(again) == 6
    for fd in again:
        os.close(fd)


def test_the_largest_group_always_fits() -> None:
    """However little memory, the e2e cluster's six servers can be reserved."""
    env = {**os.environ, "VLLM_SERVER_SLOTS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", "from scripts.vllm_cpu import server_slots; print(server_slots())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=vllm_cpu.ROOT,
    ).stdout
    assert int(out) == vllm_cpu.LARGEST_GROUP


def test_slots_not_taken_by_a_server_are_freed_with_the_block(slots: Path) -> None:
    """``reserved``: what no server took from the list is free once the block ends, even
    when a start failed in it."""

    def start_one_then_fail() -> int:
        with vllm_cpu.reserved(6) as held:
            taken.append(held.pop())
            raise RuntimeError("a server did not start")

    taken: list[int] = []
    with pytest.raises(RuntimeError):
        start_one_then_fail()
    with pytest.raises(TimeoutError):
        vllm_cpu.reserve_slots(6, wait=0.5)  # the one popped is still the caller's
    os.close(taken[0])
    again = vllm_cpu.reserve_slots(6)
    assert len(again) == 6
    for fd in again:
        os.close(fd)

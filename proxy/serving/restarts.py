"""When the supervisor starts a dead worker again, and when it gives the pod up
(docs/workers.md, "Restart, back-off, giving up"): plain decisions over exit codes and
times, no processes.

- A worker that exits 2 before its index was ever ready made a start-up mistake (a
  port, a file): restarting cannot fix it, so the pod exits 2 (the worker's one line is
  already on stderr). Once an index has been ready, its exit 2 (a file an operator broke
  since, a full disk at reopen) is a death like any other: the pod keeps its other
  workers and restarts it with back-off.
- Any one index that exits ``deaths`` times within ``window`` seconds "keeps dying": the
  pod exits 1 (Kubernetes then restarts it, with its own back-off).
- Otherwise it is started again after a back-off: ``first`` seconds, doubling up to
  ``cap``, back to ``first`` once a worker has run ``steady`` seconds.
"""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import dataclass, field

STARTUP_MISTAKE = 2  # the exit code of `usage-proxy serve`'s one-line start-up errors
KEEPS_DYING = 1


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the worker again after ``after`` seconds."""

    after: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop the pod and exit ``code``: ``why`` is logged."""

    code: int
    why: str


def cause(code: int) -> str:
    """An exit as an operator reads it: ``exit 3`` or ``signal SIGKILL``."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


@dataclass
class Restarts:
    """The restart decisions of one pod, one history per worker index."""

    first: float = 0.5
    cap: float = 30.0
    steady: float = 60.0
    deaths: int = 5
    window: float = 120.0
    _delays: dict[int, float] = field(default_factory=dict)
    _exits: dict[int, deque[tuple[float, str]]] = field(default_factory=dict)
    _ready: set[int] = field(default_factory=set)

    def ready(self, index: int) -> None:
        """Worker ``index`` has been ready: its exit 2 is no longer a start-up mistake."""
        self._ready.add(index)

    def exited(self, index: int, code: int, uptime: float, now: float) -> Restart | GiveUp:
        """Worker ``index`` exited with ``code`` (negative: the signal) after ``uptime``
        seconds, at ``now`` (monotonic seconds): what the supervisor does next."""
        if code == STARTUP_MISTAKE and index not in self._ready:
            return GiveUp(STARTUP_MISTAKE, f"worker {index} could not start ({cause(code)})")
        exits = self._exits.setdefault(index, deque())
        exits.append((now, cause(code)))
        while exits and now - exits[0][0] > self.window:
            exits.popleft()
        if len(exits) >= self.deaths:
            causes = ", ".join(c for _, c in exits)
            why = f"worker {index} exited {len(exits)} times in {self.window:g} s ({causes})"
            return GiveUp(KEEPS_DYING, why)
        return Restart(self._next_delay(index, uptime))

    def _next_delay(self, index: int, uptime: float) -> float:
        previous = self._delays.get(index)
        if previous is None or uptime >= self.steady:
            delay = self.first
        else:
            delay = min(previous * 2, self.cap)
        self._delays[index] = delay
        return delay

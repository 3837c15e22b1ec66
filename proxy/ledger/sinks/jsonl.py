"""JSON lines on stdout or appended to a file (consumers dedupe on ``record_id``).

Several processes (the workers of one pod) may append to one file: each batch is written
and synced under an exclusive ``flock`` on it, so no line is ever split by another's.
Stdout is one pipe per process and is left alone."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from proxy.ledger.windows import Entry


class JsonLinesSink:
    def __init__(self, target: str) -> None:
        self.target = target
        self.name = "jsonl:" + target

    async def start(self) -> None:
        if self.target != "-":
            Path(self.target).parent.mkdir(parents=True, exist_ok=True)

    async def deliver(self, records: Sequence[Entry]) -> None:
        text = "".join(r.to_json() + "\n" for r in records)
        if self.target == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        await asyncio.to_thread(self._append, text)

    def _append(self, text: str) -> None:
        with open(self.target, "a", encoding="utf-8") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    async def close(self) -> None:
        return None

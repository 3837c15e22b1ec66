"""Where the usage and admin APIs read and sum records: in worker processes of their own,
never in the proxy's. Parsing records is Python work that holds the GIL; in a thread of
the proxy it took the GIL from the event loop, and a tenant asking for its usage since
2000 over and over slowed every other tenant's reranks and chats (their p50 went from
8 to 32 ms with one such question at a time, from 8 to 47 ms with four; see
docs/metering.md). A process has its own GIL, and runs at a lower CPU priority, so the
proxy's event loop is first on the CPU too.

The processes start at the first question (a proxy nobody asks pays nothing), by
``spawn`` (never a fork of a threaded process), and end with the application."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from proxy.ledger.questions import ReadFailed

# Questions read records in at most this many processes at once: the proxy's own event
# loop and tokenizer threads keep the rest of the machine.
READS = 2
NICE = 10  # the readers' CPU priority below the proxy's (a raise needs no privilege)
T = TypeVar("T")


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICE)


class Readers:
    """The reading processes; started at the first read, shut down by ``close``."""

    def __init__(self, processes: int = READS) -> None:
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a reading process (``fn`` and its arguments pickled: a
        module-level function and plain data)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._started(), fn, *args)
        except BrokenProcessPool:
            self._pool = None  # a reader died (killed for memory?): fresh ones next time
            raise ReadFailed("the process reading the records ended") from None

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self._processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_lower_priority,
            )
        return self._pool

    def close(self) -> None:
        """End the reading processes (questions still running are answered 503)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

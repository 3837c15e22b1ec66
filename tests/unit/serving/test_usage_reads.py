"""The usage and admin APIs' reading processes (``usage_reads``): a read runs in a process
other than the proxy's (its own GIL), and a reader that dies is said as ``ReadFailed``,
fresh readers answering the next question."""

from __future__ import annotations

import os
import signal

import pytest

from proxy.ledger.questions import ReadFailed
from proxy.serving.usage_reads import Readers


def _die() -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


async def test_a_read_runs_in_another_process_and_survives_a_dead_reader() -> None:
    """``os.getpid`` read there is not the proxy's; a reader killed mid-read is a
    ``ReadFailed``, and the next read is answered by a fresh reader."""
    readers = Readers(1)
    try:
        assert await readers.run(os.getpid) != os.getpid()
        with pytest.raises(ReadFailed):
            await readers.run(_die)
        assert await readers.run(os.getpid) != os.getpid()
    finally:
        readers.close()

"""The send watch: only a send buffer that does not move for the timeout is cut."""

from __future__ import annotations

import asyncio


class Buffered(asyncio.WriteTransport):
    """A client connection whose unsent bytes the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.unsent, self.aborted = 0, False

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_only_a_send_buffer_that_does_not_move_for_the_timeout_is_cut() -> None:
    """The rule behind --send-timeout: an empty send buffer, or one whose size changed
    since the last sweep (the client read some, or the proxy wrote more), is progress;
    the same unsent bytes for the whole timeout are a client that accepts nothing."""
    from proxy.metrics import Metrics
    from proxy.serving.sendwatch import SendWatch
    from proxy.settings import Settings

    watch = SendWatch(1.0, Metrics(Settings(upstream="http://127.0.0.1:1")))
    reading, idle, stalled = Buffered(), Buffered(), Buffered()
    for transport in (reading, idle, stalled):
        watch.watch(transport)
    stalled.unsent = 70_000
    for tick in range(40):  # 10 s in sweeps of a quarter timeout
        reading.unsent = 70_000 - 1_000 * (tick % 2)  # drains a little, refilled
        watch.sweep(tick * 0.25)
        assert stalled.aborted == (tick >= 4), tick  # cut once unmoved for 1 s
    assert not reading.aborted
    assert not idle.aborted
    assert watch.interval == 0.25

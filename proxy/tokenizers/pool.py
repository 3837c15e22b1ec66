"""The tokenizer thread pool: counting runs off the event loop, one tokenizer copy per
thread (a fast tokenizer must not be used by two threads at once)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from proxy.accounting.types import Tokenizer
from proxy.tokenizers.hf import HFTokenizer, for_tenant

# Bodies up to this size count in their own lane, so a neighbour's multi-MiB request
# never makes a small one wait for a tokenizer thread (and lose its proof to the timeout).
SMALL_BODY_BYTES = 256 * 1024


class TokenizerPool:
    """Runs counting off the event loop in two lanes (small bodies, large bodies); each
    worker thread owns a copy of each tokenizer."""

    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")
        self._small = ThreadPoolExecutor(1, thread_name_prefix="tokenize-small")
        self._local = threading.local()

    @property
    def executor(self) -> ThreadPoolExecutor:
        return self._executor

    def lane(self, body_bytes: int) -> ThreadPoolExecutor:
        """The executor for a body of this size."""
        return self._small if body_bytes <= SMALL_BODY_BYTES else self._executor

    def local_copy(self, base: Tokenizer) -> Tokenizer:
        """This thread's own copy of ``base`` (made on first use, then reused); a
        tokenizer that is not a Hugging Face one holds no shared state."""
        if not isinstance(base, HFTokenizer):
            return base
        copies: dict[int, Tokenizer] = self._local.__dict__.setdefault("copies", {})
        mine = copies.get(base.key)
        if mine is None:
            mine = copies[base.key] = base.copy()
        return mine

    def copy_for(self, tenant: str) -> Callable[[Tokenizer], Tokenizer]:
        """What the counting thread counts with: its own copy, counting into ``tenant``'s
        part of the count cache."""
        return lambda base: for_tenant(self.local_copy(base), tenant)

    def warm(self, base: Tokenizer) -> None:
        """Give every worker thread its copy now, not on a client's request (blocking)."""
        for executor in (self._executor, self._small):
            threads = executor._max_workers
            barrier = threading.Barrier(threads)

            def job(barrier: threading.Barrier = barrier) -> None:
                self.local_copy(base).lengths(["warm up"], max_length=None)
                barrier.wait(timeout=30)

            for future in [executor.submit(job) for _ in range(threads)]:
                future.result(timeout=60)

    def shutdown(self) -> None:
        self._small.shutdown(wait=True, cancel_futures=True)
        self._executor.shutdown(wait=True, cancel_futures=True)

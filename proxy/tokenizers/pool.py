"""The tokenizer thread pool: counting runs off the event loop, one tokenizer copy per
thread (a fast tokenizer must not be used by two threads at once), and tenants take
turns: a neighbour's backlog never makes one tenant's count wait behind all of it."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from proxy.accounting.types import Tokenizer
from proxy.tokenizers.hf import HFTokenizer, for_tenant

# Bodies up to this size count in their own lane, so a neighbour's multi-MiB request
# never makes a small one wait for a tokenizer thread (and lose its proof to the timeout).
SMALL_BODY_BYTES = 256 * 1024


P = ParamSpec("P")
T = TypeVar("T")
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class FairExecutor(Executor):
    """Worker threads that serve tenants in turn: each free thread takes the oldest job of
    the tenant next in the rotation, and that tenant goes to the back. A job waits for at
    most the jobs running and one job of each other tenant with work queued, however many
    a neighbour has sent (FIFO, as a ThreadPoolExecutor is, made it wait for all of them:
    20 large reranks of one tenant turned another's 6 ms count into an unaudited 5 s)."""

    def __init__(self, threads: int, name: str) -> None:
        self._max_workers = threads
        self._ready = threading.Condition()
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit_for(
        self, tenant: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        """Run ``fn`` on a worker thread in ``tenant``'s turn."""
        future: Future[T] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._queues.setdefault(tenant, deque()).append((future, fn, args, kwargs))
            self._ready.notify()
        return future

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self.submit_for("", fn, *args, **kwargs)

    def queued(self) -> dict[str, int]:
        """Jobs waiting, per tenant."""
        with self._ready:
            return {tenant: len(jobs) for tenant, jobs in self._queues.items()}

    def _take(self) -> _Job | None:
        with self._ready:
            while not self._queues and not self._closed:
                self._ready.wait()
            if not self._queues:
                return None
            tenant, jobs = self._queues.popitem(last=False)
            job = jobs.popleft()
            if jobs:
                self._queues[tenant] = jobs  # to the back of the rotation
            return job

    def _work(self) -> None:
        while (job := self._take()) is not None:
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller's future carries it, as in the stdlib
                future.set_exception(exc)
            else:
                future.set_result(result)
            del job, future, fn, args, kwargs

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._ready:
            self._closed = True
            if cancel_futures:
                for jobs in self._queues.values():
                    for future, *_ in jobs:
                        future.cancel()
                self._queues.clear()
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()


class TokenizerPool:
    """Runs counting off the event loop in two lanes (small bodies, large bodies), tenants
    taking turns in each; each worker thread owns a copy of each tokenizer."""

    def __init__(self, threads: int) -> None:
        self._executor = FairExecutor(threads, "tokenize")
        self._small = FairExecutor(1, "tokenize-small")
        self._local = threading.local()

    @property
    def executor(self) -> FairExecutor:
        return self._executor

    def lane(self, body_bytes: int) -> FairExecutor:
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

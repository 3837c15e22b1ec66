"""A pod's life on its supervisor's event loop (docs/workers.md, "The supervisor"): the
workers started, watched on the control channel, restarted when they die (with back-off;
the pod is given up when they keep dying), told the pod's state, sent SIGHUP, and drained
on SIGTERM or SIGINT; the pod's services (limiter host, reconciler) and ``--admin-port``
around them. Imported by the supervisor only once the pod's metrics directory is known."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from proxy.serving.control import HUNG_SECONDS, PING_SECONDS, decode, encode
from proxy.serving.pod import Place, adopted_shards, orders
from proxy.serving.podadmin import PodMetrics, admin_app, serve_admin
from proxy.serving.podlimits import PodLimits, hosted_limits
from proxy.serving.podreconcile import PodTraffic, pod_reconciler
from proxy.serving.podstart import drain_patience
from proxy.serving.restarts import GiveUp, Restarts, cause
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.podlife")

KILLED = 1  # the pod's exit code when a worker had to be killed at shutdown
KILL_SECONDS = 5.0  # a killed worker's exit, reaped (its life then ends)


@dataclass
class Child:
    """One worker process at its index, as the supervisor sees it."""

    index: int
    process: asyncio.subprocess.Process
    started: float = field(default_factory=time.monotonic)
    state: str = "starting"
    problems: dict[str, Any] = field(default_factory=dict)
    seen: float = field(default_factory=time.monotonic)
    writer: asyncio.StreamWriter | None = None


class Pod:
    """The supervisor's work, on its event loop. The pod's services (``services``: the
    limiter host) start before the first worker and close after the last has drained;
    every worker's exit goes through ``worker_exited`` before any restart."""

    def __init__(
        self, settings: Settings, size: int, runtime: Path, held: tuple[int, ...] = ()
    ) -> None:
        self.settings, self.size, self.runtime = settings, size, runtime
        # The locks' descriptors (the journal's, the runtime directory's), inherited by
        # every worker: a worker still writing its shard keeps the journal from the next
        # pod, and its directory from the next start's clean-up, even when this
        # supervisor was SIGKILLed before it (flock holds while any copy is open).
        self.inherited = held
        self.metrics = PodMetrics(Place(0, size, runtime).metrics_dir)
        self.children: dict[int, Child] = {}
        self.restarts = Restarts()
        self.services = contextlib.AsyncExitStack()
        self.limits: PodLimits | None = None  # the pod's limiter host, without a store
        self.traffic = PodTraffic(size)  # the pod's reconciler asks the workers
        self.stopping = asyncio.Event()
        self.code = 0
        # A worker's longest drain: aiohttp's, its shard's, its adopted shards' (together).
        adopting = any(adopted_shards(self.place(k), settings) for k in range(size))
        self.patience = drain_patience(settings, adopting=adopting)
        self._told: dict[str, Any] = {}

    def place(self, index: int) -> Place:
        return Place(index, self.size, self.runtime)

    async def run(self) -> int:
        """Start the workers and serve until stopped; the pod's exit code."""
        control = self.place(0).control_socket
        admin = admin_app(self.settings, self.metrics, self.report, self.place(0).admin_socket)
        runner = await serve_admin(self.settings, admin)
        async with self.services:
            await self.start_services()
            server = await asyncio.start_unix_server(self._connected, path=str(control))
            self._handle_signals()
            for index in range(self.size):
                self.metrics.restarts.labels(str(index))
            lives = [asyncio.create_task(self._life(k), name=f"life-{k}") for k in range(self.size)]
            for life in lives:
                life.add_done_callback(self._ended)
            watch = asyncio.create_task(self._watch(), name="watchdog")
            await self.stopping.wait()
            self._changed()
            await self._drain(lives)
            watch.cancel()
            server.close()
        if runner is not None:
            await runner.cleanup()
        log.info("pod_stopped", code=self.code)
        return self.code

    def stop(self, code: int = 0) -> None:
        """Stop restarting and drain every worker; the pod exits ``code`` (the first
        reason given wins)."""
        if not self.stopping.is_set():
            self.code = code
            self.stopping.set()

    def report(self) -> tuple[bool, dict[str, Any]]:
        """The pod's readiness: every worker connected and ready, and not draining."""
        workers = {str(k): self._state(k) for k in range(self.size)}
        ready = not self.stopping.is_set() and all(s == "ready" for s in workers.values())
        problems: dict[str, Any] = {
            f"worker {k}": c.problems for k, c in self.children.items() if c.problems
        }
        if self.stopping.is_set():
            problems["pod"] = "draining"
        status = "ready" if ready else "not ready"
        return ready, {"status": status, "workers": workers, "problems": problems}

    async def start_services(self) -> None:
        """The pod's services, entered into ``self.services`` before the first worker
        starts (they close after the last has drained): the pod's limiter host and its
        reconciler."""
        limits = hosted_limits(self.settings, self.runtime)
        self.limits = await self.services.enter_async_context(limits)
        await self.services.enter_async_context(pod_reconciler(self.settings, self.traffic))

    async def worker_exited(self, child: Child, code: int) -> None:
        """Every exit of a worker, asked for or not, before anything else happens at its
        index: its metrics' live gauges go, its reconciliation window is abandoned, and the
        pod's limits read its shard again (what its lost connection held is then counted
        once, from its records)."""
        self.metrics.dead(child.process.pid)
        self.traffic.exited()
        if self.limits is not None and not self.stopping.is_set():  # else no restart follows
            await self.limits.worker_exited(child.index)

    def _ended(self, life: asyncio.Task[None]) -> None:
        """A worker's life that ended by a defect stops the pod (exit 1), said once."""
        if not life.cancelled() and (exc := life.exception()) is not None:
            log.error("supervisor_defect", task=life.get_name(), exc_info=exc)
            self.stop(1)

    def _state(self, index: int) -> str:
        child = self.children.get(index)
        return child.state if child is not None else "starting"

    async def _life(self, index: int) -> None:
        """Worker ``index``: start it, wait for its exit, start it again after the
        back-off, until the pod stops or gives up."""
        while not self.stopping.is_set():
            child = await self._spawn(index)
            if self.stopping.is_set():  # stopped while it started: the drain did not see it
                _signal(child, signal.SIGTERM)
            code = await child.process.wait()
            child.state = "exited"
            self._changed()
            await self.worker_exited(child, code)
            if self.stopping.is_set():
                return
            uptime = time.monotonic() - child.started
            log.warning(
                "worker_exited",
                worker=index,
                pid=child.process.pid,
                cause=cause(code),
                uptime=round(uptime, 3),
            )
            decision = self.restarts.exited(index, code, uptime, time.monotonic())
            if isinstance(decision, GiveUp):
                event = "workers_keep_dying" if decision.code == 1 else "worker_could_not_start"
                log.error(event, worker=index, reason=decision.why, code=decision.code)
                self.stop(decision.code)
                return
            self.metrics.restarts.labels(str(index)).inc()
            log.info("worker_restarting", worker=index, after=decision.after)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(decision.after):
                    await self.stopping.wait()

    async def _spawn(self, index: int) -> Child:
        spawned = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy.serving.worker",
            stdin=asyncio.subprocess.PIPE,
            pass_fds=self.inherited,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics.directory)},
        )
        assert spawned.stdin is not None
        # A worker that died at once (its pipe closed under us): its exit says why.
        with contextlib.suppress(OSError, RuntimeError):
            spawned.stdin.write(orders(self.place(index), self.settings))
            await spawned.stdin.drain()
            spawned.stdin.close()
        child = self.children[index] = Child(index, spawned)
        log.info("worker_started", worker=index, pid=spawned.pid)
        self._changed()
        return child

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A worker's control connection: hello, then its state until it hangs up."""
        hello = decode(await reader.readline())
        child = self.children.get(hello.get("index", -1))
        if child is None or child.process.pid != hello.get("pid"):
            writer.close()
            return
        child.writer, child.seen = writer, time.monotonic()
        self._tell(child, self.report()[1])
        self.traffic.joined(child.index, child.process.pid, writer)
        try:
            while line := await reader.readline():
                message = decode(line)
                child.seen = time.monotonic()
                if message.get("op") == "state" and child.state != "exited":
                    child.state = "ready" if message.get("ready") else "not ready"
                    child.problems = message.get("problems") or {}
                    if child.state == "ready":
                        self.restarts.ready(child.index)
                    self._changed()
                elif message.get("op") == "answer":
                    self.traffic.answered(message)
        except OSError:
            pass
        finally:
            self.traffic.left(child.index, child.process.pid)
            child.writer = None
            writer.close()

    def _changed(self) -> None:
        """Tell every worker the pod's state when it changed; set the ready gauge."""
        _, body = self.report()
        pod = {"op": "pod", "status": body["status"], "workers": body["workers"]}
        self.metrics.ready.set(sum(s == "ready" for s in body["workers"].values()))
        if pod == self._told:
            return
        self._told = pod
        for child in self.children.values():
            self._tell(child, pod)

    def _tell(self, child: Child, body: dict[str, Any]) -> None:
        if child.writer is not None and not child.writer.is_closing():
            child.writer.write(encode({"op": "pod", **body}))

    async def _watch(self) -> None:
        """Kill a worker whose loop stopped answering: it would hold its share of the
        connections for ever."""
        while True:
            await asyncio.sleep(PING_SECONDS)
            now = time.monotonic()
            for child in list(self.children.values()):
                if child.writer is not None and now - child.seen > HUNG_SECONDS:
                    log.error("worker_hung", worker=child.index, pid=child.process.pid)
                    child.writer = None
                    _signal(child, signal.SIGKILL)

    def _handle_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)

    def _hangup(self) -> None:
        """Forward SIGHUP to the workers that handle it: those whose control channel
        spoke (it opens after the handler is set). One still starting would die of it
        (its default action); it reads its files as it starts and then watches them."""
        started = [c for c in self._alive() if c.state != "starting"]
        log.info("sighup_forwarded", workers=len(started))
        for child in started:
            _signal(child, signal.SIGHUP)

    def _alive(self) -> list[Child]:
        return [c for c in self.children.values() if c.process.returncode is None]

    async def _drain(self, lives: list[asyncio.Task[None]]) -> None:
        """SIGTERM every worker (each drains as today's process does; one still starting
        is told by its life), wait ``patience`` for every life to end, then SIGKILL what
        is left (the pod exits 1)."""
        alive = self._alive()
        log.info("pod_draining", workers=len(alive))
        for child in alive:
            _signal(child, signal.SIGTERM)
        _, pending = await asyncio.wait(lives, timeout=self.patience)
        if not pending:
            return
        for child in self._alive():
            log.error("worker_killed", worker=child.index, pid=child.process.pid)
            _signal(child, signal.SIGKILL)
        self.code = self.code or KILLED
        _, pending = await asyncio.wait(pending, timeout=KILL_SECONDS)
        for life in pending:  # never reaped (a spawn that never returned): give it up
            life.cancel()


def _signal(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.process.send_signal(sig)

"""A file the proxy reloads while it runs (the key, limits and price files): on ``SIGHUP``
and when it changes, seen by polling its stamp (so a Kubernetes Secret or ConfigMap volume,
which swaps a symlink to a new directory, is seen as a change of the file it names).

``FileWatch`` owns the stamp of the load in use and the poll loop; ``watch_context`` runs
a file's loops as named tasks for the application's lifetime (``cleanup_ctx``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

POLL_SECONDS = 2.0
Stamp = tuple[str, int, int, int]
Context = Callable[[web.Application], AsyncIterator[None]]
Job = Callable[[], Coroutine[Any, Any, None]]


def read_stamp(path: Path) -> Stamp | None:
    """What changes when the file does: where the path leads, and that file's identity,
    size and modification time; None when there is no file."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


class FileWatch:
    """The stamp of the file as last loaded, and the loop that reloads it on a change."""

    def __init__(self, path: Path, poll: float = POLL_SECONDS) -> None:
        self.path = path
        self._poll = poll
        self._stamp = read_stamp(path)

    def loading(self) -> None:
        """The file as it is now is the one being loaded (taken before the load, so a
        change made while it reads is seen at the next poll)."""
        self._stamp = read_stamp(self.path)

    def changed(self) -> bool:
        """Whether the file is no longer the one last loaded."""
        return read_stamp(self.path) != self._stamp

    async def run(
        self, reload: Callable[[str], object], each: Callable[[], object] = lambda: None
    ) -> None:
        """Every poll: ``reload("changed")`` when the file changed, then ``each()``."""
        while True:
            await asyncio.sleep(self._poll)
            if self.changed():
                reload("changed")
            each()


def watch_context(jobs: Mapping[str, Job]) -> Context:
    """cleanup_ctx: each job (a file's watch, ...) as a task of its name, for the
    application's lifetime."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(job(), name=name) for name, job in jobs.items()]
        yield
        for task in tasks:
            task.cancel()

    return ctx

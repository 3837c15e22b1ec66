"""The watch of a reloaded file: its stamp follows the file (a symlink swap included), a
poll reloads only a changed file, and the loops run for the application's lifetime."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from aiohttp import web

from proxy.serving.filewatch import FileWatch, read_stamp, watch_context


def test_the_stamp_follows_the_file(tmp_path: Path) -> None:
    """A rewrite changes the stamp; a missing file has none."""
    path = tmp_path / "limits.yaml"
    assert read_stamp(path) is None
    path.write_text("{}\n")
    first = read_stamp(path)
    path.write_text("default: {concurrency: 1}\n")
    assert read_stamp(path) != first


def test_a_swapped_symlink_is_a_change(tmp_path: Path) -> None:
    """Kubernetes swaps the directory a Secret's file links through: the stamp follows
    the link, so the swap shows even when size and time match."""
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        d.mkdir()
        (d / "keys.yaml").write_text("acme: same\n")
    link = tmp_path / "keys.yaml"
    link.symlink_to(one / "keys.yaml")
    watch = FileWatch(link)
    assert not watch.changed()
    link.unlink()
    link.symlink_to(two / "keys.yaml")
    assert watch.changed()
    watch.loading()
    assert not watch.changed()


async def test_a_poll_reloads_a_changed_file_once(tmp_path: Path) -> None:
    """Each poll calls ``each``; only a poll that finds the file changed since the last
    load reloads it, and a reload taking the stamp makes the next poll quiet."""
    path = tmp_path / "prices.yaml"
    path.write_text("a\n")
    watch = FileWatch(path, poll=0.01)
    reloads: list[str] = []
    polls: list[None] = []

    def reload(why: str) -> bool:
        watch.loading()
        reloads.append(why)
        return True

    task = asyncio.create_task(watch.run(reload, lambda: polls.append(None)))
    await asyncio.sleep(0.05)
    assert reloads == []
    assert polls
    path.write_text("bb\n")
    await asyncio.sleep(0.05)
    task.cancel()
    assert reloads == ["changed"]


async def test_the_context_runs_each_job_as_a_named_task_until_cleanup() -> None:
    """The jobs run as tasks of their names while the application lives, and are
    cancelled at its cleanup."""
    started = asyncio.Event()

    async def job() -> None:
        started.set()
        await asyncio.Event().wait()

    ctx = watch_context({"some-file": job})(web.Application())
    await anext(ctx)
    await asyncio.wait_for(started.wait(), 1)
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "some-file"]
    assert not task.done()
    with contextlib.suppress(StopAsyncIteration):
        await anext(ctx)
    await asyncio.sleep(0)
    assert task.cancelled()

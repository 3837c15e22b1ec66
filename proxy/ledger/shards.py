"""A pod's journal shards: worker k of ``serve --workers N`` journals to its own file,
so no commit waits on another worker's (docs/workers.md, "A shard per worker").

Worker 0 keeps ``--journal`` itself (going from one worker to several keeps the file, its
exporters' cursors and its dead letters); worker k >= 1 writes
``<stem>.worker-<k><suffix>`` beside it. Everything that reads a journal offline reads
every shard (``shards``).
"""

from __future__ import annotations

import re
from pathlib import Path


def shard_path(journal: Path, k: int) -> Path:
    """Worker ``k``'s journal: ``/data/usage.sqlite`` for 0, ``/data/usage.worker-1.sqlite``
    for 1."""
    if k < 0:
        raise ValueError(f"a worker index is 0 or more, not {k}")
    if k == 0:
        return journal
    return journal.with_name(f"{journal.stem}.worker-{k}{journal.suffix}")


def shards(journal: Path) -> list[Path]:
    """Every shard of ``journal`` that exists, worker 0's first, then by index (SQLite's
    own ``-wal`` and ``-shm`` files are not shards)."""
    return [path for _, path in numbered(journal)]


def numbered(journal: Path) -> list[tuple[int, Path]]:
    """``shards``, each with its worker's index (a pod's limiter keeps a part per
    shard; a page of a pod's records, a place per shard)."""
    found = [(0, journal)] if journal.is_file() else []
    return found + sorted(_workers(journal))


def journal_of(shard: Path, k: int) -> Path:
    """The pod's journal whose worker ``k`` writes ``shard`` (``shard_path``'s inverse):
    what a worker reads to answer for the whole pod."""
    if k == 0:
        return shard
    stem, _, suffix = shard.name.rpartition(f".worker-{k}")
    journal = shard.with_name(stem + suffix) if stem else shard
    if shard_path(journal, k) != shard:
        raise ValueError(f"{shard} is not worker {k}'s shard")
    return journal


def _workers(journal: Path) -> list[tuple[int, Path]]:
    if not journal.parent.is_dir():
        return []
    pattern = _pattern(journal)
    found = []
    for path in journal.parent.iterdir():
        match = pattern.fullmatch(path.name)
        if match is not None and path.is_file():
            found.append((int(match.group(1)), path))
    return found


def _pattern(journal: Path) -> re.Pattern[str]:
    stem, suffix = re.escape(journal.stem), re.escape(journal.suffix)
    return re.compile(rf"{stem}\.worker-([1-9][0-9]*){suffix}")


def adopted(journal: Path, index: int, workers: int) -> list[Path]:
    """The shards of ``journal`` that worker ``index`` of a pod of ``workers`` delivers
    besides its own: those of indexes the pod no longer has (``k >= workers``, left by a
    larger pod), each to worker ``k mod workers``."""
    found = sorted(_workers(journal))
    return [path for k, path in found if k >= workers and k % workers == index]

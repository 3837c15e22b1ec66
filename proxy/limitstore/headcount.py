"""The replica count this replica last read from the store's registry, kept in a small
file beside the journal, so that a replica that restarts divides by the count it knew
(and a store found empty waits for as many parts) instead of forgetting it until it has
stayed a registry TTL in the store again."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import structlog

log = structlog.get_logger("proxy.limitstore.headcount")


class CountFile:
    """The last replica count read, in ``path`` (a few bytes, written when it changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: int | None = None

    def read(self) -> int:
        """The count kept; 0 when none is (no file, or one that does not hold a count)."""
        with contextlib.suppress(OSError, ValueError):
            count = int(self.path.read_text(encoding="ascii").strip())
            self._written = count
            return max(count, 0)
        return 0

    def write(self, count: int) -> None:
        """Keep ``count`` (replacing the file whole: a crash leaves the old count or the
        new one); a failure is logged, never raised (the count is an aid, not a record)."""
        if count == self._written:
            return
        # its own spare: the workers of a pod keep one file, and may write it at once
        spare = self.path.with_name(f"{self.path.name}.{os.getpid()}.new")
        try:
            spare.write_text(f"{count}\n", encoding="ascii")
            os.replace(spare, self.path)
        except OSError as exc:
            log.warning("limits_replicas_unkept", path=str(self.path), error=str(exc))
            return
        self._written = count

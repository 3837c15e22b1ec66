"""A process's readiness verdict as typed application state: what its ``/readyz`` answers
(``readycheck.readiness_check``) and its control channel reports to the supervisor. Light to
import: the supervisor imports the control channel without the application."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

# Whether the process is ready, and its problems by name.
Check = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
# This process's readiness verdict (what /readyz answers, without the pod's state).
READINESS: web.AppKey[Check] = web.AppKey("readiness")

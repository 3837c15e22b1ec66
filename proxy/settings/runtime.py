"""The options of the process itself: its worker processes, its event loop, its log level
and its name in the records."""

from __future__ import annotations

import socket
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from proxy.settings.choices import EventLoop


class RuntimeOptions(BaseModel):
    """The process: workers, event loop, logs, instance name."""

    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1,
        description="Worker processes serving the port (SO_REUSEPORT), under one supervisor "
        "that restarts them: 1 is one process, no supervisor; 'auto' is the cores this "
        "process may use (CPU affinity and cgroup quota). The kernel gives each client "
        "connection to one worker for its life: clients should open at least 8 "
        "connections per worker. Each worker has its own tokenizers and connection pools "
        "(--upstream-connections and --max-connections are per worker).",
    )

    event_loop: EventLoop = Field(
        EventLoop.UVLOOP,
        description="The event loop the process serves on: uvloop (libuv's, the default) "
        "or asyncio (the standard library's, to fall back to).",
    )
    log_level: str = Field("info", description="debug, info, warning or error.")
    instance: str = Field(
        default_factory=socket.gethostname,
        description="Name of this proxy instance in usage records (default: host name).",
    )

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> object:
        """One message for any refused value (not one per member of the union)."""
        if value == "auto":
            return value
        try:
            number = int(str(value)) if not isinstance(value, bool) else 0
        except ValueError:
            number = 0
        if number < 1:
            raise ValueError("a number >= 1, or auto")
        return number

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()

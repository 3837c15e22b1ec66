"""The options of the process itself: its event loop, its log level and its name in the
records."""

from __future__ import annotations

import socket

from pydantic import BaseModel, Field, field_validator

from proxy.settings.choices import EventLoop


class RuntimeOptions(BaseModel):
    """The process: event loop, logs, instance name."""

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

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()

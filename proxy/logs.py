"""structlog configuration: one JSON object per line on stderr."""

from __future__ import annotations

import logging
import sys

import structlog
from structlog.typing import Processor

# Marks the root handler this module installs, so configuring again replaces it.
_HANDLER_NAME = "usage-proxy-json"


def configure_logging(level: str) -> None:
    """JSON lines with ISO timestamps, from structlog and from the stdlib loggers that
    libraries use (aiohttp, asyncio, transformers, Python warnings) alike."""
    numeric = logging.getLevelName(level.upper())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    _route_stdlib(numeric, shared)


def _route_stdlib(level: int, shared: list[Processor]) -> None:
    """The root logger renders through structlog's ProcessorFormatter (the proxy's own
    events keep structlog's direct path: no stdlib record per event)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)

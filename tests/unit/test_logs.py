"""Logging: one JSON object per line on stderr, at the configured level."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import structlog

from proxy.logs import configure_logging


@pytest.fixture
def _restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("_restore_structlog")
def test_events_are_json_lines_at_the_level_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """Below the level nothing is written; at it, one JSON object with level and time."""
    configure_logging("warning")
    log = structlog.get_logger()
    log.info("not_shown")
    log.warning("shown", tenant="acme")
    (line,) = capsys.readouterr().err.splitlines()
    event = json.loads(line)
    assert (event["event"], event["level"], event["tenant"]) == ("shown", "warning", "acme")
    assert event["timestamp"].endswith("Z")

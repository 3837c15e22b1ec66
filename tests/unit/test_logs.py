"""Logging: one JSON object per line on stderr, at the configured level."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from proxy.logs import configure_logging
from proxy.tokenizers.hf import load_tokenizer


@pytest.fixture
def _restore_structlog() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


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


@pytest.mark.usefixtures("_restore_structlog")
def test_library_records_are_json_lines_too(
    capsys: pytest.CaptureFixture[str], minilm_path: Path
) -> None:
    """Regression: aiohttp's, asyncio's and transformers' records and Python warnings were
    bare text among the JSON lines; each is now one JSON object with level, time and the
    logger's name, an exception's traceback inside it, and the level still filters."""
    configure_logging("warning")
    load_tokenizer(minilm_path)  # transformers' own handler gives way to the root's
    logging.getLogger("aiohttp.server").info("not shown")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("aiohttp.server").exception("Error handling %s", "request")
    logging.getLogger("transformers.tokenization_utils_base").error("Token indices")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library's warning", UserWarning, stacklevel=1)
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["logger"], e["level"]) for e in events] == [
        ("aiohttp.server", "error"),
        ("transformers.tokenization_utils_base", "error"),
        ("py.warnings", "warning"),
    ]
    assert events[0]["event"] == "Error handling request"
    assert "RuntimeError: boom" in events[0]["exception"]
    assert "a library's warning" in events[2]["event"]
    assert all(e["timestamp"].endswith("Z") for e in events)

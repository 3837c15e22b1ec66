"""The process: the log level is one of four, in any case."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.settings import EventLoop, Settings


def test_the_log_level_is_read_in_any_case_and_checked() -> None:
    """``WARNING`` is ``warning``; an unknown level is refused; uvloop is the default."""
    settings = Settings(upstream="http://x", log_level="WARNING")
    assert (settings.log_level, settings.event_loop) == ("warning", EventLoop.UVLOOP)
    with pytest.raises(ValidationError, match="debug, info, warning, error"):
        Settings(upstream="http://x", log_level="loud")

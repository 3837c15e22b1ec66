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


@pytest.mark.parametrize("workers", [0, -1, "many", "2.5", True])
def test_an_invalid_number_of_workers_is_one_message(workers: object) -> None:
    """Not one error per member of the union (int, "auto"): one line that says what is
    accepted."""
    with pytest.raises(ValidationError) as caught:
        Settings(upstream="http://x", workers=workers)
    errors = caught.value.errors()
    assert len(errors) == 1
    assert "a number >= 1, or auto" in errors[0]["msg"]


@pytest.mark.parametrize(("given", "taken"), [(3, 3), ("4", 4), ("auto", "auto")])
def test_a_number_of_workers_or_auto_is_taken(given: object, taken: object) -> None:
    """A number (from the command line, a string) or ``auto``."""
    assert Settings(upstream="http://x", workers=given).workers == taken

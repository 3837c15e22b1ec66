"""Who pays: the limits store's URL names a Redis or Valkey scheme and never a password."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.settings import Settings


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("redis://127.0.0.1:6379/0", None),
        ("valkeys://store:6380/1", None),
        ("http://store:6379", "a redis://"),
        ("redis://:secret@store:6379/0", "no password on the command line"),
        ("redis://store:6379/0?password=secret", "no password on the command line"),
    ],
)
def test_the_store_url_has_a_known_scheme_and_no_password(url: str, refused: str | None) -> None:
    """A password in the URL would be on the command line, which every local user can
    read: refused with where to put it instead."""
    if refused is None:
        assert Settings(upstream="http://x", limits_store=url).limits_store == url
        return
    with pytest.raises(ValidationError, match=refused):
        Settings(upstream="http://x", limits_store=url)

"""The time zone of the price and limits files: one field type, and the zone a wrong name
probably meant."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from proxy.accounting.zones import TimeZone, nearest_zone, zone_named


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("Paris", "Europe/Paris"),
        ("paris", "Europe/Paris"),
        ("Europe/Pariss", "Europe/Paris"),
        ("New York", "America/New_York"),
        ("Tokio", "Asia/Tokyo"),
        ("Mars/Olympus", None),
    ],
)
def test_a_wrong_name_suggests_the_zone_it_probably_meant(name: str, meant: str | None) -> None:
    """Issue #59 item 4: `Paris` got no suggestion, only a misspelt full name did. The
    last part of a zone's name (its city) is matched too."""
    assert nearest_zone(name) == meant


def test_one_field_type_checks_and_explains() -> None:
    """A valid name passes as written; a wrong one says what it probably meant."""
    zone = TypeAdapter(TimeZone)
    assert zone.validate_python("Europe/Paris") == "Europe/Paris"
    with pytest.raises(ValidationError) as refused:
        zone.validate_python("Paris")
    assert "did you mean 'Europe/Paris'?" in str(refused.value)
    with pytest.raises(ValueError, match="is not a time zone"):
        zone_named("../etc/passwd")

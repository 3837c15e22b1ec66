"""The time zone a file's dates and calendar periods are read in: one field type for the
price file and the limits file (``TimeZone``), and one sentence for a name that is no
zone, with the zone it probably meant (``Paris`` means ``Europe/Paris``)."""

from __future__ import annotations

import difflib
from functools import cache
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import AfterValidator


@cache
def _zones() -> tuple[str, ...]:
    return tuple(sorted(available_timezones()))


def nearest_zone(name: str) -> str | None:
    """The zone ``name`` probably means: one whose last part it names (``Paris``,
    ``new_york``), else the closest spelling (``Europe/Pariss``); or None."""
    wanted = name.strip().replace(" ", "_").lower()
    by_city = [z for z in _zones() if z.rpartition("/")[2].lower() == wanted]
    if by_city:
        return min(by_city, key=lambda z: (z.count("/"), z))  # Europe/Paris, not Etc/...
    near = difflib.get_close_matches(name, _zones(), n=1, cutoff=0.6)
    if near:
        return near[0]
    cities = {z.rpartition("/")[2].lower(): z for z in _zones()}
    near = difflib.get_close_matches(wanted, list(cities), n=1, cutoff=0.75)
    return cities[near[0]] if near else None


def unknown_zone(name: object) -> str:
    """Why ``name`` is no time zone, and what it probably meant."""
    near = nearest_zone(name) if isinstance(name, str) else None
    meant = f"; did you mean {near!r}?" if near else ""
    return f"{name!r} is not a time zone (e.g. Europe/Paris){meant}"


def zone_named(name: str) -> ZoneInfo:
    """The zone of an IANA name; ``ValueError`` saying what it probably meant."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(unknown_zone(name)) from None


def _known(value: str) -> str:
    zone_named(value)
    return value


# An IANA zone name, checked at validation.
TimeZone = Annotated[str, AfterValidator(_known)]

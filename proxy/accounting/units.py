"""The units a usage is billed in: one spelling that the records, the prices, the report,
the metrics, the exports and the limits all read.

A ``StrEnum``, so each member is the name records, price files and exports always carried
(``Unit.AUDIO == "audio_seconds"``); ``Quantities`` holds one count per member.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Unit(enum.StrEnum):
    """The units a usage record carries (``ledger.records.Units``), as a price names them."""

    PROMPT = "prompt_tokens"
    CACHED = "cached_prompt_tokens"
    COMPLETION = "completion_tokens"
    AUDIO = "audio_seconds"


@dataclass(frozen=True, slots=True)
class Quantities:
    """What one record (or a sum of records) billed in each unit."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # part of the prompt tokens, not added to them
    audio_seconds: int = 0

    def of(self, unit: Unit) -> int:
        """The count of ``unit``."""
        count: int = getattr(self, unit.value)
        return count


def units_named() -> str:
    """The units as a sentence lists them (help texts, error messages)."""
    return ", ".join(unit.value for unit in Unit)

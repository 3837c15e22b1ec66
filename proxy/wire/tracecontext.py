"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the ``traceparent`` and
``tracestate`` a request carries, read as the recommendation's processing model says.

A valid ``traceparent`` is continued (its trace id and parent id sent on unchanged: the
proxy makes no span of its own); anything else (absent, malformed, all-zero ids, version
``ff``, more than one header) restarts the trace with fresh random ids, and its
``tracestate`` is dropped with it. Pure: header values in, a context out.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

# version 00 is exactly this; a higher version starts with it and may go on after a "-"
_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
VERSION_00_LENGTH = 55
# A future version may be longer; past this the value is refused rather than read.
MOST_TRACEPARENT_CHARS = 512
# The recommendation's limits on tracestate: 32 list members, and 512 characters a vendor
# must propagate at least; a longer or fuller one is dropped whole, never cut.
MOST_TRACESTATE_MEMBERS = 32
MOST_TRACESTATE_CHARS = 512
SAMPLED = "01"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """The trace a request belongs to, as it is sent upstream."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str  # 16 lowercase hex digits, not all zero
    flags: str  # 2 lowercase hex digits
    state: str | None = None  # the tracestate to send on with it
    restarted: bool = False  # the client sent none that could be continued

    @property
    def traceparent(self) -> str:
        """The version-00 header value (the only version this proxy writes)."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"


def start() -> TraceContext:
    """A new trace: random ids, sampled (so an upstream that records traces with a
    parent-based sampler records this request as it would one that came without a trace)."""
    ids = secrets.token_hex(24)  # both ids from one read of the system's random source
    trace_id, parent_id = ids[:32], ids[32:]
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:  # one chance in 2**64
        return start()
    return TraceContext(trace_id, parent_id, SAMPLED, restarted=True)


def parse_traceparent(value: str) -> tuple[str, str, str] | None:
    """(trace id, parent id, flags) of one ``traceparent`` value, or None when invalid."""
    if len(value) > MOST_TRACEPARENT_CHARS:
        return None
    match = _PARENT.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    if version == "00" and len(value) != VERSION_00_LENGTH:
        return None
    if len(value) > VERSION_00_LENGTH and value[VERSION_00_LENGTH] != "-":
        return None
    # A higher version's flags are read as version 00's (only the sampled bit is known).
    return trace_id, parent_id, flags if version == "00" else f"{int(flags, 16) & 1:02x}"


def tracestate(values: Sequence[str]) -> str | None:
    """The ``tracestate`` headers combined (a list split over headers is one list), or
    None when there is none or it passes the recommendation's limits."""
    members = [m.strip() for value in values for m in value.split(",") if m.strip()]
    combined = ",".join(members)
    if not members or len(members) > MOST_TRACESTATE_MEMBERS:
        return None
    if len(combined) > MOST_TRACESTATE_CHARS or any("=" not in m for m in members):
        return None
    return combined


def continue_or_start(parents: Sequence[str], states: Sequence[str]) -> TraceContext:
    """The context to send upstream for a request with these ``traceparent`` and
    ``tracestate`` header values: the client's trace when exactly one valid traceparent
    came, else a new one (and no tracestate, which belongs to the trace it came with)."""
    parsed = parse_traceparent(parents[0]) if len(parents) == 1 else None
    if parsed is None:
        return start()
    trace_id, parent_id, flags = parsed
    return TraceContext(trace_id, parent_id, flags, tracestate(states))

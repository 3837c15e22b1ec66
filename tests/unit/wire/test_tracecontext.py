"""W3C Trace Context read as the recommendation's processing model says: a valid
traceparent continued unchanged, anything else a new trace (and no tracestate)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.tracecontext import (
    MOST_TRACESTATE_MEMBERS,
    continue_or_start,
    parse_traceparent,
    start,
    tracestate,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"
HEADER = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (VALID, (TRACE, SPAN, "01")),
        (f"00-{TRACE}-{SPAN}-00", (TRACE, SPAN, "00")),
        # a higher version: the first 55 characters as version 00's, then a dash
        (f"cc-{TRACE}-{SPAN}-09-what-the-future-adds", (TRACE, SPAN, "01")),
        (f"cc-{TRACE}-{SPAN}-08", (TRACE, SPAN, "00")),
    ],
)
def test_a_valid_traceparent_is_read(value: str, expected: tuple[str, str, str]) -> None:
    """Version 00 exactly; a later version by its version-00 prefix, sampled bit only."""
    assert parse_traceparent(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        VALID.upper(),  # hex digits are lowercase
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-{SPAN}-01",  # the forbidden version
        VALID + "-extra",  # version 00 has nothing after its flags
        f"cc-{TRACE}-{SPAN}-01extra",  # a later version goes on only after a dash
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00_{TRACE}_{SPAN}_01",
        f"{VALID}, {VALID}",  # two headers folded into one
        f"cc-{TRACE}-{SPAN}-01-" + "x" * 10_000,  # oversized
        f" {VALID}",
    ],
)
def test_an_invalid_traceparent_is_not_read(value: str) -> None:
    """Every malformed, oversized, zero-id or ff value is refused, never half-read."""
    assert parse_traceparent(value) is None


def test_one_valid_traceparent_is_continued_with_its_tracestate() -> None:
    """The client's trace id, parent id and flags go upstream unchanged, with the
    tracestate headers combined into one list."""
    trace = continue_or_start([VALID], ["a=1", "b=2,c=3"])
    assert (trace.traceparent, trace.state, trace.restarted) == (VALID, "a=1,b=2,c=3", False)


@pytest.mark.parametrize(
    "parents", [[], ["garbage"], [VALID, VALID], [VALID, f"00-{'1' * 32}-{SPAN}-01"]]
)
def test_no_usable_traceparent_restarts_the_trace(parents: list[str]) -> None:
    """Absent, invalid, or more than one traceparent header: a new trace, sampled, and
    the client's tracestate (which belongs to the trace it came with) is dropped."""
    trace = continue_or_start(parents, ["a=1"])
    assert trace.restarted
    assert trace.state is None
    assert HEADER.match(trace.traceparent)
    assert trace.trace_id not in {p[3:35] for p in parents}


def test_started_traces_are_random_and_never_zero() -> None:
    """Each start is a fresh trace id and parent id."""
    traces = [start() for _ in range(200)]
    assert len({t.trace_id for t in traces}) == 200
    assert all(parse_traceparent(t.traceparent) is not None for t in traces)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        (["a=1"], "a=1"),
        ([" a=1 , ,b=2"], "a=1,b=2"),
        ([",".join(f"k{i}=v" for i in range(MOST_TRACESTATE_MEMBERS + 1))], None),
        (["a=" + "x" * 600], None),
        (["novalue"], None),
    ],
)
def test_tracestate_is_sent_whole_or_not_at_all(values: list[str], expected: str | None) -> None:
    """Within 32 members and 512 characters it is sent combined; beyond, dropped whole."""
    assert tracestate(values) == expected


@given(st.lists(st.text(max_size=80), max_size=3))
def test_any_header_values_give_a_valid_context(parents: list[str]) -> None:
    """Whatever a client sends, the context sent upstream is a valid version-00 header:
    its own when it sent exactly one valid value, else a new one."""
    trace = continue_or_start(parents, [])
    assert parse_traceparent(trace.traceparent) is not None
    if not trace.restarted:
        assert len(parents) == 1
        assert parents[0][3:35] == trace.trace_id

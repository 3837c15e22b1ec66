"""The limiter host's messages: each one line that reads back as itself, typed."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from proxy.limits.limiter import Cost, Refusal, Standing, Who
from proxy.limits.policy import Policies
from proxy.limitstore.hostwire import (
    FROM_HOST,
    TO_HOST,
    VERSION,
    Answer,
    Bye,
    Failure,
    Hello,
    Message,
    Release,
    Replace,
    Reserve,
    Settle,
    Welcome,
    digest,
)

POLICIES = Policies.model_validate(
    {"timezone": "Europe/Paris", "tenants": {"acme": {"requests_per_minute": 3}}}
)
REFUSED = Refusal("total_tokens_per_month", ("tenant", "acme"), math.inf, 900, 500, budget=True)


@pytest.mark.parametrize(
    "message",
    [
        Hello(version=VERSION, part=3),
        Reserve(n=7, who=Who("acme", "m", "k"), cost=Cost(3, 4, 1, 5), now=1.5),
        Settle(ticket=9, billed=Cost(2, 0), now=2.0),
        Release(ticket=9, now=2.0),
        Replace(policies=POLICIES),
        Bye(),
    ],
)
def test_a_workers_line_reads_back_as_itself(message: Message) -> None:
    """What a worker writes is one line the host reads as the same message."""
    line = message.line()
    assert line.count(b"\n") == 1
    assert line.endswith(b"\n")
    assert TO_HOST.validate_json(line) == message


@pytest.mark.parametrize(
    "message",
    [
        Welcome(version=VERSION),
        Answer(
            n=7,
            ticket=None,
            refusal=REFUSED,
            requests=Standing(3, 0, 20.0),
            tokens=None,
            budgets=(("total_tokens_per_month", 0),),
        ),
        Failure(why="protocol version 2: this host speaks 1"),
    ],
)
def test_a_hosts_line_reads_back_as_itself(message: Message) -> None:
    """What the host writes reads back whole, a refusal's infinite wait included (JSON's
    Infinity, not null: 'its cost alone exceeds the limit')."""
    parsed = FROM_HOST.validate_json(message.line())
    assert parsed == message
    if isinstance(parsed, Answer):
        assert parsed.refusal is not None
        assert parsed.refusal.alone


def test_a_part_is_a_worker_index() -> None:
    """A hello names the worker's shard: never a negative index."""
    with pytest.raises(ValidationError):
        Hello(version=VERSION, part=-1)


def test_the_digest_changes_with_the_policies_only() -> None:
    """Every worker sends the file it reloaded: the same policies give the same digest,
    other policies another."""
    again = Policies.model_validate_json(POLICIES.model_dump_json())
    other = Policies.model_validate({"tenants": {"acme": {"requests_per_minute": 4}}})
    assert digest(again) == digest(POLICIES)
    assert digest(other) != digest(POLICIES)

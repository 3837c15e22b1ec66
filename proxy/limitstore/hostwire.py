"""What a pod's workers and its limiter host (``limitstore.host``) say to each other over
the host's Unix socket: one JSON object a line, each typed at the boundary (pydantic), the
protocol's version agreed once, in the hello.

A worker says ``hello`` (its version and its part: the index of its journal shard), then
``loaded`` (the policies it started with), ``reserve`` (answered by a ``decision``
carrying its sequence number), ``settle``, ``release`` and ``replace`` (not answered:
the host handles one connection's lines in order, so a settle never overtakes its
reserve), ``standing`` (answered by ``standings``, by its sequence number: the usage
API's standing of a tenant, read on the host), and ``bye`` before it closes. The host
answers a hello with ``welcome``, or ``error`` and closes (and any line it cannot take:
not a message, or longer than ``LINE_LIMIT``).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from proxy.limits.limiter import Cost, LimitStanding, Refusal, Standing, Who
from proxy.limits.policy import Policies

VERSION = 3  # 2: standing and standings; 3: loaded
# The longest line either end reads: far above any sane limits file (a policy is ~1 KB a
# tenant), never asyncio's 64 KiB default, which cut a worker off at ~75 tenants.
LINE_LIMIT = 64 * 1024 * 1024


class Message(BaseModel):
    # A refusal's wait may be infinite (its cost alone exceeds the limit): written as
    # JSON's Infinity, which pydantic reads back, not as null.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    def line(self) -> bytes:
        """The message as one line of the socket."""
        return self.model_dump_json().encode() + b"\n"


class Hello(Message):
    op: Literal["hello"] = "hello"
    version: int
    part: int = Field(ge=0)  # the worker's index: its journal shard


class Reserve(Message):
    op: Literal["reserve"] = "reserve"
    n: int  # the answer carries it back
    who: Who
    cost: Cost
    now: float


class Settle(Message):
    op: Literal["settle"] = "settle"
    ticket: int
    billed: Cost
    now: float


class Release(Message):
    op: Literal["release"] = "release"
    ticket: int
    now: float


class Replace(Message):
    """The policies a worker reloaded (SIGHUP, its file watcher): the host applies them
    where they differ from its own."""

    op: Literal["replace"] = "replace"
    policies: Policies


class Loaded(Message):
    """The policies a worker loaded at its start, sent once connected: the host applies
    them only if it never applied them (a file changed before any reload told it); a
    file it applied before is an older one, logged, never a roll-back."""

    op: Literal["loaded"] = "loaded"
    policies: Policies


class Ask(Message):
    """How ``tenant`` stands now (the usage API's standing), read on the host."""

    op: Literal["standing"] = "standing"
    n: int  # the answer carries it back
    tenant: str
    now: float


class Bye(Message):
    op: Literal["bye"] = "bye"


class Welcome(Message):
    op: Literal["welcome"] = "welcome"
    version: int


class Answer(Message):
    """A reservation's decision; ``ticket`` is the host's number for it, None: refused."""

    op: Literal["decision"] = "decision"
    n: int
    ticket: int | None
    refusal: Refusal | None
    requests: Standing | None
    tokens: Standing | None
    budgets: tuple[tuple[str, int], ...] = ()
    cost: Standing | None = None


class Standings(Message):
    """The answer to an ``Ask``: every limit of the tenant's levels, nothing reserved."""

    op: Literal["standings"] = "standings"
    n: int
    limits: tuple[LimitStanding, ...]


class Failure(Message):
    op: Literal["error"] = "error"
    why: str


ToHost = Annotated[
    Hello | Reserve | Settle | Release | Replace | Loaded | Ask | Bye, Field(discriminator="op")
]
FromHost = Annotated[Welcome | Answer | Standings | Failure, Field(discriminator="op")]
TO_HOST: TypeAdapter[ToHost] = TypeAdapter(ToHost)
FROM_HOST: TypeAdapter[FromHost] = TypeAdapter(FromHost)


def digest(policies: Policies) -> str:
    """The SHA-256 of the policies as sent: the host applies a ``replace`` only when it
    changes them (every worker sends the file it reloaded), a ``loaded`` only when it
    never applied them."""
    return hashlib.sha256(policies.model_dump_json().encode()).hexdigest()

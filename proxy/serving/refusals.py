"""A request refused by admission before it is forwarded, answered in vLLM's error shape
(a rate limit in OpenAI's, so clients' retry logic reads it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from aiohttp import web

from proxy.limits.headers import duration
from proxy.limits.limiter import Decision, Refusal
from proxy.serving.upstream import error_response

# Why a scoring request is priced at its bound, its count not come: the request is not at
# fault, and counted on a retry it may fit (``Price.late``).
NOT_IN_TIME = "was not counted within the proxy's accounting timeout"
NOT_COUNTED = "could not be counted (the proxy's count of it failed)"
# How soon such a request is told to try again, however far its limit's reset: its count
# may come in time then, and fit at once.
RECOUNT_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal before forwarding: its status and message, answered in vLLM's error
    shape (a rate limit in OpenAI's, its ``type`` the units limited) by ``answer``; a
    realtime session ends with its message alone."""

    status: int
    message: str
    kind: str | None = None  # a rate limit's units: tokens, requests, cost
    final: bool = False  # never admitted as it is: x-should-retry: false
    param: str | None = None  # the member the refusal names (vLLM's ``param``)

    def answer(self) -> web.Response:
        if self.status != 429:
            response = error_response(self.status, self.message, param=self.param)
            if self.final:
                response.headers["x-should-retry"] = "false"
            return response
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
        return web.json_response(body, status=429)


def unreadable(why: str) -> Refused:
    """The refusal of a request whose shape the pricing cannot read."""
    return Refused(
        400,
        f"This request cannot be admitted under this tenant's token or cost limits: {why}, "
        "so its cost is not known before it runs; send it in a shape the proxy prices.",
        final=True,
    )


def undiscovered(problem: str | None) -> Refused:
    """The refusal of a request under a token or cost limit before the proxy's first
    discovery of the upstream's models (``problem``: why it has not succeeded yet): no
    model is known to price it by, and it may be admitted once one is (503)."""
    why = f" ({problem})" if problem else ""
    return Refused(
        503,
        "This request cannot be admitted under this tenant's token or cost limits yet: the "
        f"proxy has not yet discovered the upstream's models{why}, so its cost is not known "
        "before it runs; please try again later.",
    )


def retry_counted(decision: Decision) -> Decision:
    """``decision`` as a request priced at its bound for want of its count tells it, in
    its headers: refused, it may try again in ``RECOUNT_SECONDS`` (counted then, it may
    fit), not at its limit's reset nor never (``x-should-retry: false``)."""
    refusal = decision.refusal
    if refusal is None or refusal.unavailable:
        return decision
    soon = replace(refusal, wait=min(refusal.wait, RECOUNT_SECONDS), budget=False)
    return replace(decision, refusal=soon)


def stand_in(model: str | None) -> str:
    """What a refusal of a request priced by a stand-in model adds."""
    return (
        f" The model {model!r} was not listed by the upstream at the proxy's last discovery,"
        " so it is priced as the widest model served (vLLM answers a name it does not serve"
        " with 404)."
    )


def refused_by(
    refusal: Refusal,
    uncapped: bool,
    said: Callable[[int], str],
    note: str = "",
    *,
    late: str = "",
) -> Refused:
    """The answer to a reservation the limits refused: 503 when they could not answer,
    400 (never admitted) for a request that alone costs more than the whole limit, else
    429 with when to try again; ``said``: a limit's units as the message writes them
    (money in the price table's currency); ``uncapped``: the request set no completion
    cap, so its completion was priced at what the model's context leaves; ``note``: what
    the price adds to a request that can never be admitted (a stand-in model's);
    ``late``: why it was priced at its bound, its count not come (late, or failed in the
    proxy): beyond the whole limit it is a 503 to try again (counted, it may fit), not a
    400, and beyond what is left a 429 to try again soon, not at the limit's reset."""
    where = f"{refusal.limit} of {':'.join(refusal.scope)}"
    if refusal.unavailable:
        why = refusal.why or "the limits store cannot answer for this tenant's limits"
        return Refused(503, f"{why[0].upper()}{why[1:]}; please try again later.")
    if refusal.alone and late:
        return Refused(
            503,
            f"This request {late}, so it was priced at its bound, {said(refusal.cost)}, "
            f"more than the whole {where} ({said(refusal.amount)}); please try again in "
            f"{duration(RECOUNT_SECONDS)}.",
        )
    if refusal.alone:
        why = (
            " It sets no completion cap, so its completion is priced at what the "
            "model's context leaves; set max_tokens (max_completion_tokens, "
            "max_output_tokens) to bound it."
            if uncapped
            else ""
        )
        return Refused(
            400,
            f"This request alone costs {said(refusal.cost)}, more than the whole {where} "
            f"({said(refusal.amount)}): it can never be admitted; reduce it.{why}"
            f"{note}",
        )
    kind = "requests" if refusal.limit.startswith(("requests", "concurrency")) else "tokens"
    kind = "cost" if refusal.limit.startswith("cost_") else kind
    when = (
        f", this request's bound: it {late}. Counted, it may be admitted at once: please "
        f"try again in {duration(RECOUNT_SECONDS)}."
        if late
        else f". Please try again in {duration(refusal.wait)}."
    )
    message = (
        f"Rate limit reached for {where}: limit {said(refusal.amount)}, "
        f"requested {said(refusal.cost)}{when}"
    )
    return Refused(429, message, kind)

"""Header values as OpenAI sends them: ``x-ratelimit-*`` with reset durations like
``6m0s`` or ``120ms``, and on a refusal ``retry-after`` (whole seconds, rounded up) and
``retry-after-ms`` (exact). A money budget's are ``x-ratelimit-*-cost``, amounts in the
price file's currency (OpenAI has none: its limits are requests and tokens)."""

from __future__ import annotations

import math

from proxy.accounting.money import from_nanos, plain
from proxy.limits.limiter import Decision, Standing


def duration(seconds: float) -> str:
    """``seconds`` the way Go prints a duration, to the millisecond: ``0s``, ``250ms``,
    ``1.5s``, ``6m0s``, ``1h2m3s``."""
    ms = math.ceil(seconds * 1000 - 1e-6) if seconds > 0 else 0
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _standing(kind: str, standing: Standing | None, money: bool = False) -> dict[str, str]:
    if standing is None:
        return {}

    def said(units: int) -> str:
        return plain(from_nanos(units)) if money else str(units)

    return {
        f"x-ratelimit-limit-{kind}": said(standing.limit),
        f"x-ratelimit-remaining-{kind}": said(standing.remaining),
        f"x-ratelimit-reset-{kind}": duration(standing.reset),
    }


def ratelimit_headers(decision: Decision) -> dict[str, str]:
    """The headers every answer of a limited tenant carries (a money budget's as
    ``x-ratelimit-*-cost``, in the price file's currency); a refusal adds when to retry,
    and that a client should not when a budget is spent until a distant reset."""
    headers = {
        **_standing("requests", decision.requests),
        **_standing("tokens", decision.tokens),
        **_standing("cost", decision.cost, money=True),
    }
    refusal = decision.refusal
    if refusal is not None and not refusal.alone:
        ms = math.ceil(refusal.wait * 1000 - 1e-6)
        headers["retry-after-ms"] = str(ms)
        headers["retry-after"] = str(math.ceil(ms / 1000))
        if refusal.distant:
            headers["x-should-retry"] = "false"
    if refusal is not None and refusal.alone:
        headers["x-should-retry"] = "false"
    return headers

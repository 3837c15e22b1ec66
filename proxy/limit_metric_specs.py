"""The metrics of governance: budgets and rate limits (``--limits``), prices (``--prices``)
and the shared limits store (``--limits-store``), by the attribute of ``proxy.metrics.Metrics``
that holds each (the traffic's are in ``proxy.metric_specs``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from proxy.metric_specs import LATENCY_BUCKETS, Spec

LIMIT_SPECS: dict[str, Spec] = {
    # Budgets and rate limits (--limits, proxy.limits).
    "limited": Spec(
        Counter,
        "usage_proxy_limited_requests",
        "Requests refused by a limit (429, or 400 when the cost alone exceeds it), by limit.",
        ("limit",),
        tenant=True,
    ),
    "prompt_counts": Spec(
        Counter,
        "usage_proxy_prompt_counts",
        "Generation prompts priced before forwarding, by how: counted by the upstream's "
        "/tokenize, or the byte bound (not_countable, too_many, refused, timeout, "
        "unreachable, invalid).",
        ("outcome",),
    ),
    "budget_remaining": Spec(
        Gauge,
        "usage_proxy_budget_remaining",
        "Units left in a budget's current period, net of reservations (at the last admission).",
        ("limit",),
        tenant=True,
        mode="mostrecent",
    ),
    "limits_loaded_at": Spec(
        Gauge,
        "usage_proxy_limits_loaded_timestamp_seconds",
        "When the limits file in use was loaded (Unix time).",
        mode="livemin",
    ),
    "limits_reload_failures": Spec(
        Counter,
        "usage_proxy_limits_reload_failures",
        "Limits files that could not be loaded (the policies in use stay).",
    ),
    "limits_restored": Spec(
        Counter,
        "usage_proxy_limits_restored_records",
        "Journaled records the budgets were rebuilt from at start.",
    ),
    # Prices (--prices, proxy.serving.pricesfile): what was spent, at each record's time.
    "spend": Spec(
        Counter,
        "usage_proxy_spend",
        "Amount billed in the price file's currency, each record priced at its time "
        "(a float for dashboards: usage-proxy report --prices is the exact figure).",
        ("model", "currency"),
        tenant=True,
    ),
    "unpriced": Spec(
        Counter,
        "usage_proxy_unpriced_records",
        "Records the price file could not price (no price in force, or a unit without one).",
        ("model",),
        tenant=True,
    ),
    "prices_loaded_at": Spec(
        Gauge,
        "usage_proxy_prices_loaded_timestamp_seconds",
        "When the price file in use was loaded (Unix time).",
        mode="livemin",
    ),
    "prices_reload_failures": Spec(
        Counter,
        "usage_proxy_prices_reload_failures",
        "Price files that could not be loaded (the prices in use stay).",
    ),
    # The shared limits store (--limits-store, proxy.limitstore.guard).
    "store_seconds": Spec(
        Histogram,
        "usage_proxy_limits_store_seconds",
        "Round trips to the limits store by operation (failed and timed out ones included).",
        ("op",),
        buckets=LATENCY_BUCKETS,
    ),
    "store_errors": Spec(
        Counter,
        "usage_proxy_limits_store_errors",
        "Limits store calls that failed, by kind (timeout, or the client's error class).",
        ("kind",),
    ),
    "store_breaker": Spec(
        Gauge,
        "usage_proxy_limits_store_breaker_open",
        "1 while the circuit breaker skips the limits store, else 0.",
        mode="livemax",
    ),
    "fail_admissions": Spec(
        Counter,
        "usage_proxy_limits_fail_mode_admissions",
        "Requests decided by the fail mode, not the store, by mode and reason (unreachable; "
        "rebuilding: the store was found empty; and local mode's refusals of what it cannot "
        "divide: replicas_unknown, no_remainder).",
        ("mode", "reason"),
    ),
    "store_rebuilds": Spec(
        Counter,
        "usage_proxy_limits_store_rebuilds",
        "Times this replica found the limits store empty and started a rebuild.",
    ),
    "store_replicas": Spec(
        Gauge,
        "usage_proxy_limits_store_replicas",
        "The replica count local fail mode divides by, as of the last heartbeat (0: not "
        "known yet; limited tenants in local mode are refused while the store cannot answer).",
        mode="livemax",
    ),
    "store_remainders": Spec(
        Gauge,
        "usage_proxy_limits_store_remainders",
        "Budgets this replica holds a remainder of (what the store last said was left), "
        "which local fail mode divides; a budget without one is refused in an outage.",
        mode="livemin",
    ),
}

"""The route table against vLLM's own routers: every (method, path) any release serves is
classified (tests/data/vllm_routes.json, read from each release's source); the real
routers of the provisioned releases are held against it in tests/e2e."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from proxy.accounting.routes import ROUTES, Handling, route_of
from proxy.serving.usage_openapi import ADMIN_PATHS, TENANT_PATHS
from proxy.wire.targets import normalize

DATA = json.loads((Path(__file__).parent.parent / "data" / "vllm_routes.json").read_text())
SERVED = sorted({(m, p) for routes in DATA["routes"].values() for m, p in routes})
MOUNTED = "/metrics{anything}"  # prometheus' Mount: vLLM's metrics under any suffix


def concrete(path: str) -> str:
    return re.sub(r"\{[a-z_]+\}", "some-id", path)


@pytest.mark.parametrize(("method", "path"), [s for s in SERVED if s[1] != MOUNTED])
def test_every_route_vllm_serves_is_classified(method: str, path: str) -> None:
    """A route of any release (0.8.5 to 0.32.0) is in the table with its method; a new one
    fails here until it is classified."""
    route = route_of(concrete(path))
    assert route is not None, f"{method} {path} is not classified"
    assert method in route.methods


@pytest.mark.parametrize("path", ["/metrics/", "/metricsfoo", "/metrics/x/y"])
def test_the_metrics_mount_is_never_relayed(path: str) -> None:
    """vLLM answers its metrics (per-model token totals) under any /metrics suffix; the
    normalized path is /metrics (served by the proxy itself) or unknown (refused)."""
    target = normalize(path)
    assert target.path == "/metrics" or route_of(target.path) is None


def test_the_table_has_one_route_per_path_and_each_refusal_says_why() -> None:
    """No path is classified twice; a refused route carries its reason."""
    paths = [r.path for r in ROUTES]
    assert len(paths) == len(set(paths))
    assert all(r.why for r in ROUTES if r.handling is Handling.REFUSED)


def test_the_documented_route_table_is_the_code() -> None:
    """docs/metering.md lists every route by class and release exactly as the table and
    the release data say (make docs regenerates it)."""
    from scripts import routes_doc

    text = (Path(__file__).parent.parent.parent / "docs" / "metering.md").read_text()
    start = text.index(routes_doc.START) + len(routes_doc.START)
    assert text[start : text.index(routes_doc.END)] == routes_doc.routes_reference()


def release_pattern(path: str) -> re.Pattern[str]:
    """A release's route as the widest pattern: any ``{name}`` (a segment, a mount's rest)
    matches anything."""
    return re.compile(re.sub(r"\\\{[a-z_]+\\\}", ".*", re.escape(path)))


@pytest.mark.parametrize("path", sorted({*TENANT_PATHS, *ADMIN_PATHS}))
def test_the_proxys_own_routes_are_no_vllm_route(path: str) -> None:
    """The usage and admin APIs' paths are the proxy's own (issue #62): no route of any
    release matches them, templated or mounted, nor does the route table, so a request
    they do not answer (another method) is refused as unknown, never relayed."""
    spelled = concrete(path)
    assert route_of(spelled) is None
    assert route_of(normalize(spelled).path) is None
    clashes = [(m, p) for m, p in SERVED if release_pattern(p).fullmatch(spelled)]
    assert clashes == []

"""The route table held against the real routers of the provisioned vLLM releases: every
route each one's FastAPI app serves (its /openapi.json) is classified, and the hostile
spellings of a metered endpoint are billed through the real proxy as that endpoint."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from proxy.accounting.routes import route_of
from tests.e2e.cases import DOCS, Cluster, Q

pytestmark = pytest.mark.e2e


def fetch(url: str, body: Any = None, method: str = "GET") -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_every_route_of_each_real_router_is_classified(cluster: Cluster) -> None:
    """A route a release serves and the table does not know fails here (closed world)."""
    unclassified: list[str] = []
    for (family, version), pair in cluster.pairs.items():
        status, spec = fetch(pair.vllm + "/openapi.json")
        assert status == 200, (family, version)
        for path, operations in spec["paths"].items():
            concrete = re.sub(r"\{[a-z_]+\}", "some-id", path)
            route = route_of(concrete)
            for method in operations:
                if route is None or method.upper() not in route.methods:
                    unclassified.append(f"{version} {method.upper()} {path}")
    assert unclassified == []


@pytest.mark.parametrize("raw", ["/x/../rerank", "/v1/%2e/rerank", "/v1/rerank/", "/v1%2Frerank"])
def test_hostile_spellings_are_billed_as_the_endpoint(cluster: Cluster, raw: str) -> None:
    """Through the real proxy in front of real vLLM, a dot segment, an encoded dot or
    slash, or a trailing slash reaches rerank, audited and billed (no redirect)."""
    for (family, _version), pair in cluster.pairs.items():
        if family != "bi-encoder":
            continue
        body = {"model": pair.model, "query": Q, "documents": DOCS}
        request = urllib.request.Request(
            pair.proxy + raw, data=json.dumps(body).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
            assert answer.headers["x-usage-verdict"] in ("exact", "corrected")
            assert answer.headers["x-usage-record-id"]

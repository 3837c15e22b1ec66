"""The usage and admin APIs' OpenAPI description: valid OpenAPI 3.1 (openapi-spec-validator),
and exactly the routes the handlers serve, with the methods they serve them with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from openapi_spec_validator import validate

from proxy.serving.admin_api import AdminApi, AdminTokens, add_admin_api
from proxy.serving.app import create_app
from proxy.serving.tenancy import key_digest
from proxy.serving.usage_answers import build_figures
from proxy.serving.usage_openapi import ADMIN_PREFIX, PREFIX, document
from proxy.settings import Settings


@pytest.mark.parametrize("which", ["tenant", "admin"])
def test_the_description_is_valid_openapi(which: str) -> None:
    """Each description validates as OpenAPI 3.1, its references resolved."""
    validate(document(which))


def served(app: web.Application, prefix: str) -> set[tuple[str, str]]:
    """The (method, path) of every route under ``prefix`` an application serves."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith(prefix)
    }


def described(which: str) -> set[tuple[str, str]]:
    return {
        (method.upper(), path) for path, item in document(which)["paths"].items() for method in item
    }


def test_the_tenant_description_is_the_main_ports_routes(tmp_path: Path) -> None:
    """The main port serves under /usage-proxy/v1 exactly the described paths and methods."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-acme')}\n")
    app = create_app(Settings(upstream="http://127.0.0.1:9", api_keys=str(keys), journal="off"))
    assert served(app, PREFIX + "/") == described("tenant")


def test_the_admin_description_is_the_admin_ports_routes(tmp_path: Path) -> None:
    """The admin API adds to the admin port exactly the described paths and methods."""
    tokens = tmp_path / "admin.yaml"
    tokens.write_text(f"ops: {key_digest('secret')}\n")
    settings = Settings(upstream="http://127.0.0.1:9", journal="off")
    port = web.Application()
    add_admin_api(port, AdminApi(build_figures(settings, None, None), list), AdminTokens(tokens))
    assert served(port, ADMIN_PREFIX + "/") == described("admin")


def test_every_reference_names_a_schema() -> None:
    """Each $ref of either description names a schema of its components."""

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [node["$ref"]] if "$ref" in node else [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    for which in ("tenant", "admin"):
        doc = document(which)
        names = {f"#/components/schemas/{n}" for n in doc["components"]["schemas"]}
        assert set(refs(doc)) <= names

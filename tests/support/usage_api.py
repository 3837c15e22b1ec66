"""What the usage and admin APIs of issue #62 share in their app tests: the keys, limits
and prices of one proxy in front of the fake vLLM, its admin port, traffic, and an
answer held to the served OpenAPI description."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from openapi_schema_validator import OAS31Validator

from proxy.serving.tenancy import key_digest
from proxy.serving.usage_openapi import document
from scripts.vllm_cpu import free_port
from tests.support.proxies import fake_and_proxy
from tests.support.texts import RERANK

ACME, GLOBEX = {"Authorization": "Bearer sk-acme"}, {"Authorization": "Bearer sk-globex"}
ADMIN = {"Authorization": "Bearer admin-secret"}
CHAT = {"model": "minilm", "messages": [{"role": "user", "content": "hello there"}]}
PAST = "2026-01-01T00:00:00+00:00"
STANDING, USAGE = "/usage-proxy/v1/standing", "/usage-proxy/v1/usage"
RECORDS = "/usage-proxy/v1/records/"
ADMIN_BASE = "/usage-proxy/admin/v1"
LIMITS = {
    "tenants": {
        "acme": {
            "prompt_tokens_per_month": 100_000,
            "total_tokens_per_day": 50_000,
            "cost_per_month": "5",
            "requests_per_hour": 100,
            "concurrency": 8,
        },
        "globex": {"prompt_tokens_per_month": 1000},
    }
}


def price_file(path: Path, *versions: tuple[str, str]) -> Path:
    """minilm priced per prompt and completion token from each ``(from, price)``."""
    models = {
        "minilm": [
            {"from": since, "prompt_tokens": price, "completion_tokens": price}
            for since, price in versions
        ]
    }
    path.write_text(yaml.safe_dump({"currency": "USD", "models": models}))
    return path


async def usage_proxy(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp: Path, **options: Any
) -> tuple[list[str], Any]:
    """The fake (listing every request that reaches it) and one proxy with keys, limits
    and prices."""
    seen: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(f"{request.method} {request.path}")
        return await handler(request)  # type: ignore[no-any-return]

    keys = tmp / "keys.yaml"
    keys.write_text(f"acme: {key_digest('sk-acme')}\nglobex: {key_digest('sk-globex')}\n")
    (tmp / "limits.yaml").write_text(yaml.safe_dump(LIMITS))
    options.setdefault("api_keys", str(keys))
    _, client = await fake_and_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        middlewares=(count,),
        journal=str(tmp / "journal.sqlite"),
        limits=str(tmp / "limits.yaml"),
        prices=str(price_file(tmp / "prices.yaml", (PAST, "0.001"))),
        **options,
    )
    return seen, client


async def admin_proxy(
    aiohttp_server: Any, aiohttp_client: Any, minilm_path: Path, tmp: Path, **options: Any
) -> tuple[Any, str]:
    """One proxy as ``usage_proxy`` makes it, with an admin port on loopback and the admin
    token ``admin-secret``: its client, and the admin port's URL."""
    tokens = tmp / "admin.yaml"
    tokens.write_text(f"ops: {key_digest('admin-secret')}\n")
    port = free_port()
    _, client = await usage_proxy(
        aiohttp_server,
        aiohttp_client,
        minilm_path,
        tmp,
        admin_port=port,
        admin_host="127.0.0.1",
        admin_tokens=str(tokens),
        **options,
    )
    return client, f"http://127.0.0.1:{port}"


async def traffic(client: Any, headers: dict[str, str], n: int = 2) -> list[str]:
    """Reranks and chats; the record ids their answers carry."""
    ids = []
    for _ in range(n):
        for path, body in (("/rerank", RERANK), ("/v1/chat/completions", CHAT)):
            resp = await client.post(path, json=body, headers=headers)
            assert resp.status == 200, await resp.text()
            ids.append(resp.headers["x-usage-record-id"])
    return ids


def conforms(body: Any, name: str, which: str = "tenant") -> None:
    """An answer is what the served OpenAPI description says of it."""
    components = document(which)["components"]
    OAS31Validator({"$ref": f"#/components/schemas/{name}", "components": components}).validate(
        body
    )


def untimed(standing: dict[str, Any]) -> list[dict[str, Any]]:
    """A standing's limits without their moments (each read is its own)."""
    return [
        {k: v for k, v in item.items() if not k.startswith("reset")} for item in standing["limits"]
    ]

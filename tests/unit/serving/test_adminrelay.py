"""The admin API of a pod (``adminrelay``): worker 0 serves it on the pod's admin socket,
the supervisor's admin port relays its paths there with the operator's token and
streams the answer back, the API's own headers included; while worker 0 is away the
relay answers 503 in vLLM's shape with Retry-After."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.serving.admin_api import AdminApi, AdminTokens, add_admin_api
from proxy.serving.adminrelay import add_admin_relay, admin_socket_context
from proxy.serving.pod import Place
from proxy.serving.tenancy import key_digest
from proxy.serving.usage_answers import build_figures
from proxy.serving.usage_openapi import RECORDS, STANDINGS, document
from proxy.settings import Settings

Client = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


def worker_api(api: web.Application) -> None:
    """A stand-in for worker 0's admin API: it says the token and query it was sent,
    and names a next page as the records' answer does."""

    async def records(request: web.Request) -> web.Response:
        said = f"{request.headers.get('Authorization')} {request.query_string}\n"
        headers = {"x-usage-next-page": "Y3Vyc29y", "x-usage-source": "journal"}
        return web.Response(text=said * 3000, content_type="application/x-ndjson", headers=headers)

    api.router.add_get(RECORDS, records)


@pytest.fixture
async def worker_0(tmp_path: Path) -> AsyncIterator[Place]:
    """Worker 0's admin socket, serving ``worker_api`` for the test's length."""
    place = Place(0, 2, tmp_path)
    ctx = admin_socket_context(place, worker_api)(web.Application())
    await anext(ctx)
    yield place
    with pytest.raises(StopAsyncIteration):
        await anext(ctx)


def supervisor(place: Place) -> web.Application:
    app = web.Application()
    add_admin_relay(app, place.admin_socket)
    return app


async def test_a_question_is_relayed_with_its_token(
    worker_0: Place, aiohttp_client: Client
) -> None:
    """The operator's token and query reach worker 0; its answer comes back whole, with
    the API's page cursor and source headers."""
    client = await aiohttp_client(supervisor(worker_0))
    answer = await client.get(
        RECORDS + "?since=2026-12-01&tenant=acme", headers={"Authorization": "Bearer t0ken"}
    )
    assert answer.status == 200
    assert answer.headers["x-usage-next-page"] == "Y3Vyc29y"
    assert answer.headers["x-usage-source"] == "journal"
    assert answer.content_type == "application/x-ndjson"
    assert await answer.text() == "Bearer t0ken since=2026-12-01&tenant=acme\n" * 3000


async def test_worker_0_away_is_503_with_retry_after(
    tmp_path: Path, aiohttp_client: Client
) -> None:
    """No socket (worker 0 starting or restarting): 503 in vLLM's error shape, with
    Retry-After, never a hang or a 500."""
    client = await aiohttp_client(supervisor(Place(0, 2, tmp_path)))
    answer = await client.get(RECORDS, headers={"Authorization": "Bearer t0ken"})
    assert answer.status == 503
    assert int(answer.headers["Retry-After"]) > 0
    body = await answer.json()
    assert body["error"]["code"] == 503
    assert "worker 0" in body["error"]["message"]


async def test_only_the_admin_api_is_relayed(worker_0: Place, aiohttp_client: Client) -> None:
    """Paths outside the admin API are not relayed (404 from the admin port itself)."""
    client = await aiohttp_client(supervisor(worker_0))
    assert (await client.get("/usage-proxy/v1/standing")).status == 404


@pytest.mark.parametrize("authorization", [None, "", "Basic b3A6cHc=", "Bearer "])
async def test_no_token_is_401_while_worker_0_is_away(
    tmp_path: Path, aiohttp_client: Client, authorization: str | None
) -> None:
    """A question without a bearer token can never be answered: the relay says 401 in
    vLLM's shape (its authentication's ``{"error": "Unauthorized"}``) at once, as worker 0
    would, rather than 503 and a retry that would only find the same refusal."""
    client = await aiohttp_client(supervisor(Place(0, 2, tmp_path)))
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = await client.get(RECORDS, headers=headers)
    assert answer.status == 401
    assert await answer.json() == {"error": "Unauthorized"}
    assert "Retry-After" not in answer.headers


@pytest.fixture
async def admin_worker_0(tmp_path: Path) -> AsyncIterator[Place]:
    """Worker 0's admin socket serving the real admin API (its token check and routes),
    the token ``t0ken``, for the test's length."""
    tokens = tmp_path / "admin.yaml"
    tokens.write_text(f"ops: {key_digest('t0ken')}\n")
    figures = build_figures(Settings(upstream="http://127.0.0.1:9", journal="off"), None, None)
    api = AdminApi(figures, list)
    place = Place(0, 2, tmp_path)
    ctx = admin_socket_context(place, lambda app: add_admin_api(app, api, AdminTokens(tokens)))
    served = ctx(web.Application())
    await anext(served)
    yield place
    with pytest.raises(StopAsyncIteration):
        await anext(served)


async def test_another_method_is_worker_0s_to_refuse(
    admin_worker_0: Place, aiohttp_client: Client
) -> None:
    """The API is read only, and worker 0 holds the token: a POST or DELETE through the
    supervisor is 401 without an admin token and 405 with one, both in vLLM's shape, as
    one process answers them (audit of #62: the supervisor answered aiohttp's plain-text
    405 itself, before any token was checked); the body is not relayed."""
    client = await aiohttp_client(supervisor(admin_worker_0))
    token = {"Authorization": "Bearer t0ken"}
    for method in ("POST", "DELETE"):
        refused = await client.request(method, STANDINGS, json={"budget": 1})
        assert refused.status == 401
        assert await refused.json() == {"error": "Unauthorized"}
        answer = await client.request(method, STANDINGS, json={"budget": 1}, headers=token)
        assert answer.status == 405
        assert answer.headers["Allow"] == "GET"
        assert (await answer.json())["error"]["code"] == 405
    assert (await client.get(STANDINGS, headers=token)).status == 200


async def test_worker_0_away_is_described_on_every_path(
    tmp_path: Path, aiohttp_client: Client
) -> None:
    """Every path of the admin API, asked while worker 0 is away, is answered 503 with
    Retry-After, and the served description says both for that path (audit of #62:
    the relay's 503 was undescribed on the description's own path, and Retry-After on
    every path)."""
    client = await aiohttp_client(supervisor(Place(0, 2, tmp_path)))
    token = {"Authorization": "Bearer t0ken"}  # without one the relay answers 401 itself
    for template, item in document("admin")["paths"].items():
        answer = await client.get(template.replace("{tenant}", "acme"), headers=token)
        assert answer.status == 503
        assert "Retry-After" in answer.headers
        described = item["get"]["responses"]["503"]
        assert "retry-after" in {name.lower() for name in described.get("headers", {})}

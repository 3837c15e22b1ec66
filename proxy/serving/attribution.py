"""Who pays: the tenant of each request, decided from its headers before anything is
forwarded (``proxy.serving.tenancy`` holds the trust rules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.accounting.routes import KEYLESS_PATHS
from proxy.metrics import Metrics
from proxy.serving.tenancy import (
    Attribution,
    KeyFileError,
    Refusal,
    TenantResolver,
    load_api_keys,
)
from proxy.serving.upstream import error_response, served_path, unauthorized
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.attribution")

MAX_CLIENT_ID_CHARS = 200
WHO = web.RequestKey("who", Attribution)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``X-Request-Id`` as an untrusted correlation field: printable ASCII
    only (anything else becomes ``?``), at most 200 characters. Never a record's key."""
    value = headers.get("X-Request-Id")
    if not value:
        return None
    return "".join(c if " " <= c <= "~" else "?" for c in value[:MAX_CLIENT_ID_CHARS])


def build_resolver(settings: Settings) -> TenantResolver:
    keys = load_api_keys(Path(settings.api_keys)) if settings.api_keys else {}
    if settings.api_keys and not keys:
        raise KeyFileError(f"{settings.api_keys}: lists no keys; add tenant: SHA-256 digest lines")
    return TenantResolver(
        header=settings.tenant_header, key_tenants=keys, allow_anonymous=settings.allow_anonymous
    )


def attribution(resolver: TenantResolver, metrics: Metrics) -> Middleware:
    """The middleware that refuses what cannot be attributed. Headers only: bodies are
    never touched here."""

    @web.middleware
    async def attribute(request: web.Request, handler: Handler) -> web.StreamResponse:
        if served_path(request) in KEYLESS_PATHS:
            return await handler(request)
        who = resolver.resolve(request.headers)
        if isinstance(who, Refusal):
            metrics.refused.labels(str(who.status)).inc()
            log.warning(
                "request_refused", path=served_path(request), status=who.status, reason=who.message
            )
            if who.status == 401:
                return unauthorized()
            return error_response(who.status, who.message)
        request[WHO] = who
        return await handler(request)

    return attribute

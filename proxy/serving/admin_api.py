"""The operators' read-only admin API, on ``--admin-port`` only and only with
``--admin-tokens``: every tenant's standing, one tenant's, and the records of a range as
JSON lines, a page at a time. Nothing here changes a budget.

The token file is held like ``--api-keys``: SHA-256 digests (``name: digest`` or a list),
never tokens, reloaded on ``SIGHUP`` and when the file changes; a file that cannot be
loaded is logged and the tokens in use stay."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

import structlog
import yaml
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.ledger.lookup import After, read_marks
from proxy.ledger.questions import ReadFailed
from proxy.limits.limiter import StandingUnknown
from proxy.serving.filewatch import POLL_SECONDS, Context, FileWatch, watch_context
from proxy.serving.startup import file_problem
from proxy.serving.tenancy import bearer_key, key_digest, load_api_keys
from proxy.serving.upstream import error_response, unauthorized
from proxy.serving.usage_answers import BadRange, Figures
from proxy.serving.usage_openapi import (
    ADMIN_OPENAPI,
    ADMIN_PREFIX,
    RECORDS,
    STANDINGS,
    TENANT_STANDING,
    document,
)
from proxy.settings import Settings

log = structlog.get_logger("proxy.serving.admin_api")
PAGE, MOST = 1000, 10_000
NEXT = "x-usage-next-page"


class AdminTokens:
    """The admin tokens' digests, from their file; reloaded whole or not at all."""

    def __init__(self, path: Path, poll: float = POLL_SECONDS) -> None:
        self.path = path
        self._watch = FileWatch(path, poll)
        self.digests = self._load()

    def _load(self) -> dict[str, str]:
        digests = load_api_keys(self.path)
        if not digests:
            raise ValueError(f"{self.path}: lists no admin token digests")
        return digests

    def allows(self, request: web.Request) -> bool:
        """Whether the request's bearer token is an admin token."""
        token = bearer_key(request.headers)
        if token is None:
            return False
        digest = key_digest(token)
        return any(hmac.compare_digest(digest, known) for known in self.digests)

    def reload(self, why: str) -> bool:
        """Load the file now; True when its tokens are in use."""
        self._watch.loading()
        try:
            digests = self._load()
        except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError) as exc:
            log.error(
                "admin_tokens_reload_failed", path=str(self.path), why=why, error=str(exc)[:300]
            )
            return False
        self.digests = digests
        log.info("admin_tokens_loaded", path=str(self.path), why=why, tokens=len(digests))
        return True

    async def watch(self) -> None:
        await self._watch.run(self.reload)


ADMIN_TOKENS = web.AppKey("admin_tokens", AdminTokens)


def admin_tokens_context(tokens: AdminTokens) -> Context:
    """cleanup_ctx: the token file's watch, for the application's lifetime."""
    return watch_context({"admin-tokens": tokens.watch})


def cursor(after: After) -> str:
    """A page's place, as the next request names it."""
    return base64.urlsafe_b64encode("|".join(after).encode()).decode()


def read_cursor(text: str) -> After:
    """The place a cursor names: ("", a journal's shards' seqs) or a ledger's (time,
    record id)."""
    try:
        moment, _, last = base64.urlsafe_b64decode(text.encode()).decode().partition("|")
        if moment:
            datetime.fromisoformat(moment)
        else:
            read_marks(last)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRange(f"after={text!r} is not a page cursor this API gave") from None
    if not last:
        raise BadRange(f"after={text!r} is not a page cursor this API gave")
    return moment, last


class AdminApi:
    """The operators' questions, answered from ``figures``; ``tenants`` lists the tenants
    known to the limits and key files."""

    def __init__(self, figures: Figures, tenants: Callable[[], Iterable[str]]) -> None:
        self._figures = figures
        self._tenants = tenants

    async def standings(self, request: web.Request) -> web.Response:
        try:
            found = [await self._figures.standing(t) for t in sorted(set(self._tenants()))]
        except StandingUnknown as exc:
            return error_response(503, f"the standings cannot be read now: {exc}")
        return web.json_response(found)

    async def standing(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await self._figures.standing(request.match_info["tenant"]))
        except StandingUnknown as exc:
            return error_response(503, f"the standing cannot be read now: {exc}")

    async def records(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        try:
            since, until = self._figures.bounds(query.get("since"), query.get("until"))
            after = read_cursor(query["after"]) if query.get("after") else None
            limit = int(query.get("limit", PAGE))
            if not 1 <= limit <= MOST:
                raise ValueError
        except BadRange as exc:
            return error_response(400, str(exc))
        except ValueError:
            return error_response(400, f"limit must be a whole number from 1 to {MOST}", "limit")
        try:
            page = await self._figures.page(since, until, query.get("tenant"), after, limit)
        except ReadFailed as exc:
            return error_response(503, str(exc))
        headers = {f"x-usage-{k}": v for k, v in self._figures.source.describe().items()}
        if page.more is not None:
            headers[NEXT] = cursor(page.more)
        return web.Response(text=page.lines, content_type="application/x-ndjson", headers=headers)

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(document("admin"))


def token_guard(tokens: AdminTokens) -> Middleware:
    """Only the admin API's own paths need a token; the rest of the port is as before.
    There, what the router refuses (another method: the API is read only; a path it does
    not serve) is answered in vLLM's error shape, not aiohttp's text."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(ADMIN_PREFIX + "/"):
            return await handler(request)
        if not tokens.allows(request):
            return unauthorized()
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            refused = error_response(exc.status, exc.reason)
            if "Allow" in exc.headers:
                refused.headers["Allow"] = exc.headers["Allow"]
            return refused

    return guarded


def add_admin_api(app: web.Application, api: AdminApi, tokens: AdminTokens) -> None:
    """The admin API on the admin port's application, behind its token."""
    app.middlewares.append(token_guard(tokens))
    app.router.add_get(STANDINGS, api.standings, allow_head=False)
    app.router.add_get(TENANT_STANDING, api.standing, allow_head=False)
    app.router.add_get(RECORDS, api.records, allow_head=False)
    app.router.add_get(ADMIN_OPENAPI, api.openapi, allow_head=False)


def build_admin_api(
    app: web.Application, settings: Settings, figures: Figures, tenants: Callable[[], Iterable[str]]
) -> Callable[[web.Application], None]:
    """With ``--admin-tokens``: the token file loaded (a start-up mistake if it cannot be)
    and watched, and what adds the admin API to the admin port's application; else
    nothing is added."""
    if settings.admin_tokens is None:
        return lambda admin: None
    path = Path(settings.admin_tokens)
    try:
        tokens = AdminTokens(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise file_problem(exc, "--admin-tokens", path, "list SHA-256 digests of tokens") from None
    app[ADMIN_TOKENS] = tokens
    app.cleanup_ctx.append(admin_tokens_context(tokens))
    api = AdminApi(figures, tenants)
    return lambda admin: add_admin_api(admin, api, tokens)

"""Tenants kept apart inside vLLM: the stored responses of the Responses API belong to the
tenant that made them, and vLLM's prefix cache is salted per tenant.

vLLM keeps stored responses in one dictionary keyed by the response id, which is the
request's ``request_id`` (a client may choose it), and it shares one prefix cache between
every request with the same ``cache_salt``. Through the proxy, a response id is minted by
the proxy and owned by the tenant whose request made it (``Journal.claim_response``,
durable); another tenant's GET, cancel or ``previous_response_id`` is answered as vLLM
answers an unknown id, and reaches no engine. Every generation request carries a salt
that is a keyed hash of its tenant and of the client's own salt, so no tenant can choose
another's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import sqlite3
from collections import OrderedDict

import structlog
import uuid6
from aiohttp import web

from proxy.accounting.routes import Route
from proxy.ledger.journal import Journal, JournalError
from proxy.serving.upstream import error_response

log = structlog.get_logger("proxy.serving.isolation")

# The routes that name a stored response: fetched (GET) or cancelled.
STORED_ROUTES = frozenset({"/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel"})
# Owners kept in memory when there is no journal (--journal off), the oldest dropped first.
MEMORY_OWNERS = 100_000


def stored_response_id(route: Route, path: str) -> str | None:
    """The response id ``path`` names when its ``route`` is a stored response's (None:
    another route, such as ``/v1/responses/render``)."""
    return path.split("/")[3] if route.path in STORED_ROUTES else None


def not_found(response_id: str) -> web.Response:
    """vLLM's answer for a response id it does not store (``_make_not_found_error``)."""
    return error_response(
        404,
        f"Response with id '{response_id}' not found.",
        param="response_id",
        kind="invalid_request_error",
    )


class ResponseOwners:
    """Which tenant made each stored response: the journal's ``response_owners`` table, or
    memory without a journal (or when the journal cannot take a claim)."""

    def __init__(self, journal: Journal | None) -> None:
        self._journal = journal
        self._memory: OrderedDict[str, str] = OrderedDict()

    @staticmethod
    def mint() -> str:
        """A fresh response id in vLLM's form (``resp_`` and 32 hex digits)."""
        return f"resp_{uuid6.uuid7().hex}"

    async def claim(self, response_id: str, tenant: str) -> None:
        """``tenant`` owns ``response_id`` from now on (before the request is forwarded)."""
        if self._journal is not None:
            try:
                await self._journal.claim_response(response_id, tenant)
                return
            except (JournalError, sqlite3.Error) as exc:  # kept in memory instead
                log.warning("response_owner_not_journaled", response_id=response_id, error=str(exc))
        self._memory[response_id] = tenant
        if len(self._memory) > MEMORY_OWNERS:
            self._memory.popitem(last=False)

    async def owner(self, response_id: str) -> str | None:
        """The tenant that made ``response_id``; None when the proxy minted no such id."""
        known = self._memory.get(response_id)
        if known is not None or self._journal is None:
            return known
        try:
            return await self._journal.response_owner(response_id)
        except (JournalError, sqlite3.Error) as exc:  # unknown: refused, never another's
            log.warning("response_owner_unreadable", response_id=response_id, error=str(exc))
            return None

    async def refusal(self, response_id: str, tenant: str) -> web.Response | None:
        """None when ``tenant`` made ``response_id``; else vLLM's answer for an unknown id
        (an id the proxy did not mint, or another tenant's: the two look alike)."""
        owner = await self.owner(response_id)
        if owner == tenant:
            return None
        log.warning("stored_response_refused", response_id=response_id, tenant=tenant)
        return not_found(response_id)


# Request headers that would choose a request's prefix-cache salt over the body's
# ``cache_salt`` (an open vLLM change, in no release up to 0.34.0): a client's is never sent
# while the proxy salts per tenant, or it would replace the tenant's salt.
SALT_HEADERS = frozenset({"x-cache-salt"})


class CacheSalts:
    """The ``cache_salt`` of each tenant's requests: HMAC-SHA256 under the deployment's
    key of the tenant and the client's own salt (length-prefixed, so no pair of tenant and
    client salt can produce another tenant's)."""

    def __init__(self, secret: str | None) -> None:
        self._key = secret.encode() if secret else secrets.token_bytes(32)

    def salt(self, tenant: str, client: str | None) -> str:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (tenant, client or ""):
            encoded = part.encode("utf-8", "surrogatepass")
            mac.update(len(encoded).to_bytes(8, "big") + encoded)
        return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")

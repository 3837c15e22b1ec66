"""The OpenAPI 3.1 description of the proxy's own usage API (main port, a tenant's key)
and admin API (admin port, an admin token), served with each; its paths are the one
table of those routes (``usage_api`` and ``admin_api`` serve exactly these)."""

from __future__ import annotations

from typing import Any

from proxy.accounting.units import Unit

PREFIX = "/usage-proxy/v1"
STANDING = f"{PREFIX}/standing"
USAGE = f"{PREFIX}/usage"
RECORD = f"{PREFIX}/records/{{record_id}}"
OPENAPI = f"{PREFIX}/openapi.json"

ADMIN_PREFIX = "/usage-proxy/admin/v1"
STANDINGS = f"{ADMIN_PREFIX}/standings"
TENANT_STANDING = f"{ADMIN_PREFIX}/standings/{{tenant}}"
RECORDS = f"{ADMIN_PREFIX}/records"
ADMIN_OPENAPI = f"{ADMIN_PREFIX}/openapi.json"

JSON = "application/json"
MONEY = {"type": "string", "description": "An amount in the price file's currency, in full."}
COUNT = {"type": "integer", "minimum": 0}
FIGURE = {"oneOf": [COUNT, MONEY], "description": "Units; a money budget's in its currency."}
HOLDS = "Whose records the source holds: a journal holds this replica's only."
SOURCE = {
    "source": {"type": "string", "enum": ["ledger", "journal"]},
    "holds": {"type": "string", "description": HOLDS},
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: dict[str, Any], what: str, kind: str = JSON) -> dict[str, Any]:
    return {"description": what, "content": {kind: {"schema": schema}}}


ERROR = {"description": "An error in vLLM's shape.", "content": {JSON: {"schema": _ref("Error")}}}
UNAUTHORIZED = {
    "description": "No key, or no key of the key file (vLLM's own answer).",
    "content": {JSON: {"schema": _ref("Unauthorized")}},
}
BUSY = {
    "description": "Another question of this tenant is being answered (the same question "
    "shares its answer); ask again after it, as retry-after says.",
    "headers": {"retry-after": {"schema": {"type": "integer"}, "description": "Seconds."}},
    "content": {JSON: {"schema": _ref("Error")}},
}
UNREADABLE = {
    "description": "The records cannot be read now (the ledger or the journal failed).",
    "content": {JSON: {"schema": _ref("Error")}},
}
AWAY = (
    "The figures cannot be read now (the limits store, the ledger or the journal did not "
    "answer); in a pod, also while worker 0, which answers the admin API, is starting."
)
ADMIN_UNAVAILABLE = {
    "description": AWAY,
    "headers": {
        "Retry-After": {
            "schema": {"type": "integer"},
            "description": "Seconds; sent while worker 0 is starting.",
        }
    },
    "content": {JSON: {"schema": _ref("Error")}},
}
PAGE_HEADERS = {
    "x-usage-source": {
        "schema": SOURCE["source"],
        "description": "Which records were read: the ledger, or else the journal.",
    },
    "x-usage-holds": {"schema": SOURCE["holds"], "description": HOLDS},
    "x-usage-next-page": {
        "schema": {"type": "string"},
        "description": "The next page's cursor, for its after=; absent on the last page.",
    },
}
RANGE = [
    {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": f"ISO 8601 {what} (without an offset: in the limits file's zone); "
        "the default range is the current month in that zone.",
    }
    for name, what in (("since", "start, inclusive"), ("until", "end, exclusive"))
]


def _get(summary: str, responses: dict[str, Any], parameters: list[Any] | None = None) -> Any:
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if parameters:
        operation["parameters"] = parameters
    return {"get": operation}


def _path(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": what,
    }


TENANT_PATHS: dict[str, Any] = {
    STANDING: _get(
        "Every limit of the key's tenant in its current period or window.",
        {
            "200": _ok(_ref("Standing"), "The standing."),
            "401": UNAUTHORIZED,
            "429": BUSY,
            "503": ERROR,
        },
    ),
    USAGE: _get(
        "The key's tenant's billed units per model and operation over a range.",
        {
            "200": _ok(_ref("Usage"), "The usage."),
            "400": ERROR,
            "401": UNAUTHORIZED,
            "429": BUSY,
            "503": UNREADABLE,
        },
        RANGE,
    ),
    RECORD: _get(
        "One of the tenant's own usage records (another tenant's id answers 404).",
        {
            "200": _ok(_ref("RecordAnswer"), "The record."),
            "401": UNAUTHORIZED,
            "404": ERROR,
            "429": BUSY,
            "503": UNREADABLE,
        },
        [_path("record_id", "The x-usage-record-id an answer carried.")],
    ),
    OPENAPI: _get(
        "This description.",
        {"200": _ok({"type": "object"}, "OpenAPI 3.1."), "401": UNAUTHORIZED},
    ),
}
ADMIN_PATHS: dict[str, Any] = {
    STANDINGS: _get(
        "Every known tenant's standing (the limits file's tenants and the key file's).",
        {
            "200": _ok({"type": "array", "items": _ref("Standing")}, "The standings."),
            "401": UNAUTHORIZED,
            "503": ADMIN_UNAVAILABLE,
        },
    ),
    TENANT_STANDING: _get(
        "One tenant's standing.",
        {
            "200": _ok(_ref("Standing"), "The standing."),
            "401": UNAUTHORIZED,
            "503": ADMIN_UNAVAILABLE,
        },
        [_path("tenant", "The tenant.")],
    ),
    RECORDS: _get(
        "The usage records of a range, one JSON object a line, a page at a time; the next "
        "page's cursor is in the x-usage-next-page header (absent on the last page).",
        {
            "200": {
                **_ok({"type": "string"}, "Records as JSON lines.", "application/x-ndjson"),
                "headers": PAGE_HEADERS,
            },
            "400": ERROR,
            "401": UNAUTHORIZED,
            "503": ADMIN_UNAVAILABLE,
        },
        [
            *RANGE,
            {"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"}},
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
            },
            {
                "name": "after",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "The previous page's x-usage-next-page.",
            },
        ],
    ),
    ADMIN_OPENAPI: _get(
        "This description.",
        {
            "200": _ok({"type": "object"}, "OpenAPI 3.1."),
            "401": UNAUTHORIZED,
            "503": ADMIN_UNAVAILABLE,
        },
    ),
}

LIMIT = {
    "type": "object",
    "required": ["name", "level", "kind", "unit", "limit", "used", "held", "remaining"],
    "properties": {
        "name": {"type": "string", "examples": ["prompt_tokens_per_month"]},
        "level": {"type": "string", "enum": ["tenant", "model", "key"]},
        "model": {"type": "string"},
        "key": {"type": "string", "description": "The key's hash, as records name it."},
        "kind": {"type": "string", "enum": ["budget", "rate", "concurrency"]},
        "unit": {
            "type": "string",
            "enum": ["requests", "prompt_tokens", "completion_tokens", "total_tokens", "currency"],
        },
        "currency": {"type": ["string", "null"]},
        "limit": FIGURE,
        "used": FIGURE,
        "held": FIGURE,
        "remaining": FIGURE,
        "reset_seconds": {"type": "number", "minimum": 0},
        "reset_at": {"type": ["string", "null"], "format": "date-time"},
        "period": {
            "type": "object",
            "properties": {
                "start": {"type": "string", "format": "date-time"},
                "end": {"type": "string", "format": "date-time"},
            },
        },
    },
}
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": "integer"},
                },
            }
        },
    },
    "Unauthorized": {"type": "object", "properties": {"error": {"const": "Unauthorized"}}},
    "Limit": LIMIT,
    "Standing": {
        "type": "object",
        "required": ["tenant", "at", "limited", "read_from", "limits"],
        "properties": {
            "tenant": {"type": "string"},
            "at": {"type": "string", "format": "date-time"},
            "limited": {"type": "boolean", "description": "Whether --limits is in use."},
            "read_from": {
                "type": "string",
                "enum": ["limits store", "this replica"],
                "description": "The shared store (every replica's), or this process's limiter.",
            },
            "limits": {"type": "array", "items": _ref("Limit")},
        },
    },
    "Usage": {
        "type": "object",
        "required": ["tenant", "since", "until", "source", "holds", "rows"],
        "properties": {
            "tenant": {"type": "string"},
            "since": {"type": "string", "format": "date-time"},
            "until": {"type": "string", "format": "date-time"},
            **SOURCE,
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "model": {"type": "string"},
                        "operation": {"type": "string"},
                        "requests": COUNT,
                        **{unit.value: COUNT for unit in Unit},
                        "amount": MONEY,
                        "unpriced_requests": COUNT,
                    },
                },
            },
            "currency": {"type": "string"},
            "amount": MONEY,
            "due": {"type": "string", "description": "The amount rounded as an invoice."},
        },
    },
    "RecordAnswer": {
        "type": "object",
        "required": ["source", "holds", "record"],
        "properties": {**SOURCE, "record": _ref("Record")},
    },
    "Record": {
        "type": "object",
        "required": ["record_id", "time", "tenant", "operation", "reported", "billed", "units"],
        "properties": {
            "record_id": {"type": "string"},
            "time": {"type": "string", "format": "date-time"},
            "tenant": {"type": "string"},
            "model": {"type": ["string", "null"]},
            "operation": {"type": "string"},
            "endpoint": {"type": "string"},
            "status": {"type": "integer"},
            "verdict": {"type": ["string", "null"]},
            "reported": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
            "billed": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
            "units": {"type": "object", "additionalProperties": {"type": "integer"}},
            "currency": {"type": "string"},
            "amount": {"oneOf": [MONEY, {"type": "null"}]},
        },
    },
}


def document(which: str) -> dict[str, Any]:
    """The description of the ``tenant`` API (main port) or the ``admin`` one."""
    tenant = which == "tenant"
    scheme = "apiKey" if tenant else "adminToken"
    what = "the tenant's API key" if tenant else "an admin token of --admin-tokens"
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "vllm-usage-proxy " + ("usage API" if tenant else "admin API"),
            "version": "1",
            "description": "Answered by the proxy itself: no engine work, no usage record. "
            "Read only.",
        },
        "paths": TENANT_PATHS if tenant else ADMIN_PATHS,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {scheme: {"type": "http", "scheme": "bearer", "description": what}},
        },
        "security": [{scheme: []}],
    }

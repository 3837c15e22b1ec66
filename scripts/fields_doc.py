"""The field table as docs/metering.md shows it: every request field whose effect is more
than billed work (it multiplies engine work, is echoed into the answer, or names state
that outlives the request), per operation, with the first release that has it
(tests/data/vllm_request_fields.json) and what the proxy does with it."""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from proxy.accounting.dispatch import CACHE_SALT_FROM, ECHO_MAX_BYTES, ECHOED
from proxy.accounting.fieldkinds import Effect, Field
from proxy.accounting.fields import FIELDS
from proxy.accounting.operations import SCORING_OPERATIONS
from proxy.accounting.routes import BY_PATH, INVOCATIONS_PATH

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "vllm_request_fields.json"
START, END = "<!-- fields:start -->\n", "<!-- fields:end -->"
# What the proxy does with a field that names state (the rest are passed as sent).
STATE_HANDLING = {
    ("responses", "request_id"): "refused (400): the proxy mints every response id",
    ("responses", "previous_response_id"): "another tenant's id: 404 as vLLM's unknown id",
    ("responses", "background"): "refused unless --allow-unmetered responses.background",
}


def _first_releases() -> dict[tuple[str, str], str]:
    """(operation, field) -> the first release whose body class for it has the field."""
    releases = json.loads(DATA.read_text())["releases"]
    first: dict[tuple[str, str], str] = {}
    for version in sorted(releases, key=Version):
        data = releases[version]
        for path, models in data["routes"].items():
            if path == INVOCATIONS_PATH or path not in BY_PATH:
                continue
            for model in models:
                for name in data["models"][model]:
                    first.setdefault((BY_PATH[path].operation, name), version)
    return first


def _handling(operation: str, field: Field) -> str:
    if field.feature is not None:
        return f"refused (400) unless --allow-unmetered {field.feature}"
    handled = STATE_HANDLING.get((operation, field.name))
    if handled is not None:
        return handled
    if field.name == "cache_salt":
        if operation in CACHE_SALT_FROM:
            since = ".".join(map(str, CACHE_SALT_FROM[operation]))
            return f"combined with the tenant's salt from {since} (--cache-salt)"
        return "passed as sent: the answer reports no cached tokens"
    if operation in SCORING_OPERATIONS and Effect.ECHOED in field.effects:
        return "not streamed: the answer is read whole (--max-answer-bytes)"
    if field.name in ECHOED.get(operation, ()):
        return f"bounded: echoed fields at most {ECHO_MAX_BYTES // 1024} KiB together"
    if Effect.STATE in field.effects:
        return "passed as sent (see below)"
    return "billed as reported (bounded by the context)"


def fields_reference() -> str:
    first = _first_releases()
    lines = [
        "| operation | field | effects | from | the proxy | why (vLLM's code) |",
        "|---|---|---|---|---|---|",
    ]
    for operation, fields in FIELDS.items():
        for name, field in sorted(fields.items()):
            if field.effects == {Effect.BILLED}:
                continue
            effects = ", ".join(sorted(field.effects))
            since = first.get((operation, name), "")
            why = field.why.replace("|", "\\|")
            lines.append(
                f"| {operation} | `{name}` | {effects} | {since} | "
                f"{_handling(operation, field)} | {why} |"
            )
    return "\n".join(lines) + "\n"

"""The options as a person reads them: each default as ``--help`` and the README show it,
and the README's configuration table (``make docs``; tests/test_docs.py holds it)."""

from __future__ import annotations

import enum

from proxy.settings.choices import ENV_PREFIX, FILE_ONLY
from proxy.settings.model import Settings


def display_default(name: str) -> str:
    """A default as a person reads it (``--help`` and the README): never an internal."""
    field = Settings.model_fields[name]
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return {
            "instance": "host name",
            "journal": "$XDG_STATE_HOME/vllm-usage-proxy/journal.sqlite",
        }.get(name, "{}")
    value = field.default
    shown = value.value if isinstance(value, enum.Enum) else value
    return "unset" if value is None or value == "" else str(shown)


def reference_table() -> str:
    """The configuration reference as a markdown table (README section; a test checks it)."""
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        flag = "env/file only" if name in FILE_ONLY else ("`--" + name.replace("_", "-") + "`")
        default = display_default(name)
        if default not in ("required", "unset", "host name"):
            default = f"`{default}`"
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| {flag} | `{ENV_PREFIX}{name.upper()}` | {default} | {description} |")
    return "\n".join(rows) + "\n"

"""The route table as docs/metering.md shows it: every route by class, with the vLLM
releases that serve it (tests/data/vllm_routes.json, read from each release's source)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from packaging.version import Version

from proxy.accounting.routes import ROUTES, Handling, Route

ROOT = Path(__file__).resolve().parent.parent
SERVED = ROOT / "tests" / "data" / "vllm_routes.json"
START, END = "<!-- routes:start -->\n", "<!-- routes:end -->"
WHAT = {
    Handling.AUDITED: "recounted, judged, billed at the engine's count",
    Handling.METERED: "billed as vLLM reports it",
    Handling.DISPATCHED: "dispatched by its body to the audited or metered path",
    Handling.FREE: "relayed, no engine work, no record",
    Handling.REFUSED: "refused (403) unless --allow-unmetered names it",
}


def _shape(path: str) -> str:
    """A path with its parameters blanked (``{id}`` and a final ``*`` alike)."""
    return re.sub(
        r"\{[a-z_]+\}", "{}", path.removesuffix("*") + ("{path}" if path.endswith("*") else "")
    )


def _releases(route: Route, served: dict[str, list[list[str]]]) -> str:
    shape = _shape(route.path)
    found = sorted(
        (v for v, routes in served.items() if any(_shape(p) == shape for _, p in routes)),
        key=Version,
    )
    if not found:
        return "none (the proxy's own)"
    return found[0] if len(found) == 1 else f"{found[0]} to {found[-1]} ({len(found)} read)"


def routes_reference() -> str:
    served = json.loads(SERVED.read_text())["routes"]
    lines = ["| class | method | path | vLLM releases serving it |", "|---|---|---|---|"]
    for handling in Handling:
        for route in (r for r in ROUTES if r.handling is handling):
            methods = ", ".join(sorted(route.methods))
            cell = f"`{route.path}`"
            lines.append(f"| {handling.value} | {methods} | {cell} | {_releases(route, served)} |")
    classes = "\n".join(f"- **{h.value}**: {WHAT[h]}." for h in Handling)
    return classes + "\n\n" + "\n".join(lines) + "\n"

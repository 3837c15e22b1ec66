"""``usage-proxy report``: usage per tenant and model from the journal or the ledger.

Aggregation is pure; the formats are a text table, CSV, JSON and a self-contained HTML page
with an SVG bar chart of over-reported tokens per tenant.
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from proxy.records import UsageRecord


@dataclass
class Row:
    tenant: str
    model: str
    requests: int = 0
    reported_tokens: int = 0
    billed_tokens: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)

    @property
    def over_reported(self) -> int:
        return self.reported_tokens - self.billed_tokens

    @property
    def over_reported_pct(self) -> float:
        """Over-report relative to what was processed (billed)."""
        return 100.0 * self.over_reported / self.billed_tokens if self.billed_tokens else 0.0

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["over_reported"] = self.over_reported
        out["over_reported_pct"] = round(self.over_reported_pct, 2)
        return out


def aggregate(records: Iterable[UsageRecord]) -> list[Row]:
    """Per (tenant, model): requests, reported and billed prompt+completion tokens."""
    rows: dict[tuple[str, str], Row] = {}
    for r in records:
        key = (r.tenant, r.model or "-")
        row = rows.setdefault(key, Row(*key))
        row.requests += 1
        row.reported_tokens += (r.prompt_tokens_reported or 0) + (r.completion_tokens_reported or 0)
        row.billed_tokens += (r.prompt_tokens_billed or 0) + (r.completion_tokens_billed or 0)
        verdict = r.verdict or "none"
        row.verdicts[verdict] = row.verdicts.get(verdict, 0) + 1
    return [rows[k] for k in sorted(rows)]


COLUMNS = (
    "tenant",
    "model",
    "requests",
    "reported_tokens",
    "billed_tokens",
    "over_reported",
    "over_reported_pct",
    "verdicts",
)


def _cells(row: Row) -> list[str]:
    verdicts = " ".join(f"{k}={v}" for k, v in sorted(row.verdicts.items()))
    return [
        row.tenant,
        row.model,
        str(row.requests),
        str(row.reported_tokens),
        str(row.billed_tokens),
        str(row.over_reported),
        f"{row.over_reported_pct:.2f}",
        verdicts,
    ]


def as_table(rows: list[Row]) -> str:
    cells = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(COLUMNS))) for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def as_csv(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    writer.writerows(_cells(r) for r in rows)
    return out.getvalue()


def as_json(rows: list[Row]) -> str:
    return json.dumps([r.as_dict() for r in rows], indent=2) + "\n"


def as_html(rows: list[Row], title: str = "vllm-usage-proxy: usage report") -> str:
    per_tenant: dict[str, int] = {}
    for r in rows:
        per_tenant[r.tenant] = per_tenant.get(r.tenant, 0) + r.over_reported
    top = max(per_tenant.values(), default=0) or 1
    bars = []
    for i, (tenant, over) in enumerate(sorted(per_tenant.items())):
        y, width = 10 + i * 30, int(400 * max(over, 0) / top)
        bars.append(
            f'<text x="0" y="{y + 15}">{html.escape(tenant)}</text>'
            f'<rect x="160" y="{y}" width="{width}" height="20" fill="#c0392b"/>'
            f'<text x="{170 + width}" y="{y + 15}">{over}</text>'
        )
    height = 20 + 30 * len(per_tenant)
    table = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows
    )
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;border:1px solid #ccc}"
        "table{border-collapse:collapse}</style></head><body>"
        f"<h1>{title}</h1><h2>Over-reported tokens per tenant</h2>"
        f'<svg width="700" height="{height}" font-size="13">{"".join(bars)}</svg>'
        f"<h2>Per tenant and model</h2><table><tr>{head}</tr>{table}</table></body></html>\n"
    )


FORMATS = {"table": as_table, "csv": as_csv, "json": as_json, "html": as_html}

"""``usage-proxy report``: usage grouped by tenant, model, operation or day, from the
journal or the ledger, with totals and the period covered.

Aggregation is pure; the formats are a text table, CSV, JSON and a self-contained HTML page
(an SVG chart of billed against reported tokens per tenant).
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from proxy.ledger.records import UsageRecord

GROUPS = ("tenant", "model", "operation", "day")
# Billed as vLLM reported them, without the proxy's proof.
UNPROVEN = frozenset({"mismatch", "unaudited"})


@dataclass
class Row:
    keys: dict[str, str]
    requests: int = 0
    reported_tokens: int = 0
    billed_tokens: int = 0
    unproven_tokens: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)

    @property
    def over_reported(self) -> int:
        return self.reported_tokens - self.billed_tokens

    @property
    def over_reported_pct(self) -> float:
        """Over-report relative to what was processed (billed)."""
        return 100.0 * self.over_reported / self.billed_tokens if self.billed_tokens else 0.0

    def add(self, r: UsageRecord) -> None:
        billed = (r.prompt_tokens_billed or 0) + (r.completion_tokens_billed or 0)
        self.requests += 1
        reported = (r.prompt_tokens_reported or 0) + (r.completion_tokens_reported or 0)
        self.reported_tokens += reported
        self.billed_tokens += billed
        verdict = r.verdict or "none"
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        if verdict in UNPROVEN:
            self.unproven_tokens += billed

    def merge(self, other: Row) -> None:
        self.requests += other.requests
        self.reported_tokens += other.reported_tokens
        self.billed_tokens += other.billed_tokens
        self.unproven_tokens += other.unproven_tokens
        for verdict, count in other.verdicts.items():
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + count

    def as_dict(self) -> dict[str, object]:
        return {
            **self.keys,
            "requests": self.requests,
            "reported_tokens": self.reported_tokens,
            "billed_tokens": self.billed_tokens,
            "over_reported": self.over_reported,
            "over_reported_pct": round(self.over_reported_pct, 2),
            "unproven_tokens": self.unproven_tokens,
            "verdicts": dict(sorted(self.verdicts.items())),
        }


@dataclass
class Report:
    group_by: tuple[str, ...]
    rows: list[Row]
    totals: Row
    since: str | None
    until: str | None
    generated_at: str

    @property
    def period(self) -> str:
        return f"{self.since or 'the first record'} to {self.until or 'now'}"


def _key(record: UsageRecord, group: str) -> str:
    if group == "day":
        return record.time.date().isoformat()
    value = getattr(record, group)
    return str(value) if value else "-"


def aggregate(
    records: Iterable[UsageRecord],
    *,
    group_by: Sequence[str] = ("tenant", "model", "operation"),
    since: str | None = None,
    until: str | None = None,
    generated_at: str = "",
) -> Report:
    """Requests, reported and billed prompt+completion tokens per group, and the totals."""
    rows: dict[tuple[str, ...], Row] = {}
    for r in records:
        key = tuple(_key(r, g) for g in group_by)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(dict(zip(group_by, key, strict=True)))
        row.add(r)
    totals = Row({g: "" for g in group_by} | {group_by[0]: "TOTAL"} if group_by else {})
    for row in rows.values():
        totals.merge(row)
    ordered = [rows[k] for k in sorted(rows)]
    return Report(tuple(group_by), ordered, totals, since, until, generated_at)


NUMBERS = (
    ("requests", "Requests"),
    ("reported_tokens", "Reported tokens"),
    ("billed_tokens", "Billed tokens"),
    ("over_reported", "Over-reported"),
    ("over_reported_pct", "Over-reported %"),
    ("unproven_tokens", "Billed unproven"),
)
TITLES = {"tenant": "Tenant", "model": "Model", "operation": "Operation", "day": "Day (UTC)"}
SHORT = 40


def _verdicts(row: Row) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(row.verdicts.items()))


def _number(row: Row, name: str, separators: bool) -> str:
    if name == "over_reported_pct":
        return f"{row.over_reported_pct:.2f}"
    value = int(getattr(row, name))
    return f"{value:,}" if separators else str(value)


def _short(text: str) -> str:
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"


def as_table(report: Report) -> str:
    header = [TITLES[g] for g in report.group_by] + [t for _, t in NUMBERS] + ["Verdicts"]
    cells = [header]
    for row in [*report.rows, report.totals]:
        keys = [_short(row.keys[g]) for g in report.group_by]
        cells.append(keys + [_number(row, n, True) for n, _ in NUMBERS] + [_verdicts(row)])
    width = [max(len(c[i]) for c in cells) for i in range(len(header))]
    n_keys = len(report.group_by)

    def line(c: list[str]) -> str:
        return "  ".join(
            c[i].ljust(width[i]) if i < n_keys or i == len(c) - 1 else c[i].rjust(width[i])
            for i in range(len(c))
        ).rstrip()

    rule = "  ".join("-" * w for w in width)
    lines = [line(c) for c in cells]
    return (
        "\n".join(
            [
                f"Usage from {report.period} (UTC), generated {report.generated_at}",
                f"Unproven: tokens billed as vLLM reported them ({', '.join(sorted(UNPROVEN))}).",
                "",
                lines[0],
                rule,
                *lines[1:-1],
                rule,
                lines[-1],
            ]
        )
        + "\n"
    )


def as_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    columns = [*report.group_by, *(n for n, _ in NUMBERS), "verdicts"]
    writer.writerow([*columns, "since", "until", "generated_at"])
    for row in [*report.rows, report.totals]:
        values = row.as_dict()
        cells = [values[c] if c != "verdicts" else _verdicts(row) for c in columns]
        writer.writerow([*cells, report.since or "", report.until or "", report.generated_at])
    return out.getvalue()


def as_json(report: Report) -> str:
    body = {
        "since": report.since,
        "until": report.until,
        "generated_at": report.generated_at,
        "group_by": list(report.group_by),
        "rows": [r.as_dict() for r in report.rows],
        "totals": report.totals.as_dict(),
    }
    return json.dumps(body, indent=2) + "\n"


def _chart(report: Report) -> str:
    """Billed (dark) against reported (light) tokens per tenant, horizontal bars."""
    per_tenant: dict[str, tuple[int, int]] = {}
    for r in report.rows:
        tenant = r.keys.get("tenant", "all")
        billed, reported = per_tenant.get(tenant, (0, 0))
        per_tenant[tenant] = (billed + r.billed_tokens, reported + r.reported_tokens)
    top = max((max(v) for v in per_tenant.values()), default=0) or 1
    bars = []
    for i, (tenant, (billed, reported)) in enumerate(sorted(per_tenant.items())):
        y = 10 + i * 44
        wb, wr = int(420 * billed / top), int(420 * reported / top)
        bars.append(
            f'<text x="0" y="{y + 22}"><title>{html.escape(tenant)}</title>'
            f"{html.escape(_short(tenant)[:24])}</text>"
            f'<rect x="200" y="{y}" width="{wr}" height="16" fill="#f5b7b1"/>'
            f'<text x="{206 + wr}" y="{y + 13}">reported {reported:,}</text>'
            f'<rect x="200" y="{y + 18}" width="{wb}" height="16" fill="#1f618d"/>'
            f'<text x="{206 + wb}" y="{y + 31}">billed {billed:,}</text>'
        )
    height = 20 + 44 * len(per_tenant)
    return f'<svg width="860" height="{height}" font-size="13">{"".join(bars)}</svg>'


def as_html(report: Report, title: str = "vllm-usage-proxy: usage report") -> str:
    head = "".join(f"<th>{TITLES[g]}</th>" for g in report.group_by)
    head += "".join(f'<th class="n">{t}</th>' for _, t in NUMBERS) + "<th>Verdicts</th>"
    body = []
    for row in [*report.rows, report.totals]:
        cls = ' class="total"' if row is report.totals else ""
        keys = "".join(
            f'<td title="{html.escape(row.keys[g])}">{html.escape(_short(row.keys[g]))}</td>'
            for g in report.group_by
        )
        numbers = "".join(f'<td class="n">{_number(row, n, True)}</td>' for n, _ in NUMBERS)
        body.append(f"<tr{cls}>{keys}{numbers}<td>{html.escape(_verdicts(row))}</td></tr>")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:3px 10px;"
        "border:1px solid #ccc;white-space:nowrap}table{border-collapse:collapse}"
        ".n{text-align:right;font-variant-numeric:tabular-nums}"
        ".total td{font-weight:bold;border-top:2px solid #333}"
        "th{background:#f4f6f7}</style></head><body>"
        f"<h1>{title}</h1><p class='period'>Usage from {html.escape(report.period)} (UTC), "
        f"generated {html.escape(report.generated_at)}. Billed unproven: tokens billed as "
        "vLLM reported them (mismatch, unaudited).</p>"
        f"<h2>Billed and reported tokens per tenant</h2>{_chart(report)}"
        f"<h2>Usage</h2><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}"
        "</tbody></table></body></html>\n"
    )


FORMATS = {"table": as_table, "csv": as_csv, "json": as_json, "html": as_html}

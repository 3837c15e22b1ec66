"""The report's formats: a text table, CSV, JSON and a self-contained HTML page.

The CSV holds the detail rows only (no subtotal or total row), one column per figure and
per verdict, so a spreadsheet's sums are the totals; a name that would start a formula is
written with a leading apostrophe. The text table shows control characters escaped. The
HTML page is rendered by an autoescaping jinja2 template (``templates/report.html.j2``).
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import jinja2

from proxy.accounting.money import plain
from proxy.accounting.units import Unit
from proxy.ledger.charges import Charges
from proxy.ledger.report import COLUMNS, UNPROVEN, BudgetRow, Report, Row

TITLES = {"tenant": "Tenant", "model": "Model", "operation": "Operation", "day": "Day"}
SHORT = 32
# A cell that starts with one of these is a formula to a spreadsheet (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("proxy.ledger", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _verdicts(row: Row) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(row.verdicts.items()))


def _number(row: Row, name: str) -> str:
    value = row.value(name)
    return f"{value:.2f}" if isinstance(value, float) else f"{value:,}"


def _short(text: str) -> str:
    """A name for the terminal: control characters escaped (no name moves the cursor or
    forges a row), then shortened."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"


def _text_cell(text: str) -> str:
    """A name for a spreadsheet: one that would start a formula gets a leading apostrophe."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def _lines(report: Report) -> list[tuple[str, Row]]:
    """The rows in reading order: each tenant's rows then its subtotal, then the totals."""
    out: list[tuple[str, Row]] = []
    for i, row in enumerate(report.rows):
        out.append(("row", row))
        tenant = row.keys.get("tenant")
        following = report.rows[i + 1].keys.get("tenant") if i + 1 < len(report.rows) else None
        subtotal = report.subtotal_of(tenant) if tenant is not None else None
        if subtotal is not None and following != tenant and subtotal.requests > row.requests:
            out.append(("subtotal", subtotal))
    return [*out, ("total", report.totals)]


def _key_cells(report: Report, kind: str, row: Row) -> list[str]:
    cells = [row.keys[g] for g in report.group_by]
    if kind == "subtotal":
        cells[1] = "subtotal"
    return cells


def _titles(report: Report) -> list[str]:
    """The key columns' headings; a day is named with its zone."""
    return [f"Day ({report.zone})" if g == "day" else TITLES[g] for g in report.group_by]


def _source(report: Report) -> list[str]:
    return [f"Source: {report.source}"] if report.source else []


def as_table(report: Report) -> str:
    header = _titles(report) + [c.short or c.title for c in COLUMNS]
    cells = [[*header, "Verdicts"]]
    for kind, row in _lines(report):
        keys = [_short(k) for k in _key_cells(report, kind, row)]
        cells.append(keys + [_number(row, c.name) for c in COLUMNS] + [_verdicts(row)])
    width = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    n_keys = len(report.group_by)

    def line(c: list[str]) -> str:
        return "  ".join(
            c[i].ljust(width[i]) if i < n_keys or i == len(c) - 1 else c[i].rjust(width[i])
            for i in range(len(c))
        ).rstrip()

    rule = "  ".join("-" * w for w in width)
    lines = [line(c) for c in cells]
    legend = [f"  {c.short or c.title}: {c.meaning}" for c in COLUMNS]
    return "\n".join(
        [
            f"Usage ({report.zone}) from {report.period}; generated {report.generated_at}",
            *_source(report),
            "",
            lines[0],
            rule,
            *lines[1:-1],
            rule,
            lines[-1],
            "",
            *_budget_table(report.budgets),
            *_charges_table(report.charges),
            "Columns:",
            *legend,
            "",
        ]
    )


BUDGET_TITLES = ("Scope", "Budget", "Period", "Holds", "Used", "Limit", "Left", "Used %")
BUDGET_TEXT = 4  # columns before the numbers


def _budget_cells(b: BudgetRow) -> list[str]:
    period = f"{b.period_start} to {b.period_end}"
    numbers = [b.said(b.used), b.said(b.amount), b.said(b.remaining), f"{b.percent:.2f}"]
    return [_short(b.scope), b.budget, period, ", ".join(b.holds), *numbers]


def _aligned(cells: list[list[str]], left: int) -> list[str]:
    """Rows of cells in columns (the first ``left`` to the left, numbers to the right),
    the heading's row followed by a rule."""
    width = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = [
        "  ".join(
            c[i].ljust(width[i]) if i < left else c[i].rjust(width[i]) for i in range(len(c))
        ).rstrip()
        for c in cells
    ]
    return [lines[0], "  ".join("-" * w for w in width), *lines[1:]]


def _budget_table(budgets: tuple[BudgetRow, ...]) -> list[str]:
    """The budget section: each budget's use in its period (local times of the limits
    file's zone), or nothing without ``--limits``."""
    if not budgets:
        return []
    lines = _aligned([list(BUDGET_TITLES), *(_budget_cells(b) for b in budgets)], BUDGET_TEXT)
    title = "Budgets: the period holding the report's end, and the one each is in now"
    return [f"{title} (local times of the limits file's zone):", *lines, ""]


CHARGE_TITLES = ("Tenant", "Model", "Unit", "Price since", "Price", "Quantity", "Amount")
DUE_TITLES = ("Tenant", "Amount", "Due", "Unpriced requests")


def charges_heading(charges: Charges) -> str:
    return (
        f"Amounts in {charges.currency}: each record priced at the price in force at its "
        f"time, every line exact; each tenant's amount rounded once, to {charges.decimals} "
        "decimal places, half to even"
    )


def charge_cells(charges: Charges) -> list[list[str]]:
    return [
        [
            _short(line.tenant),
            _short(line.model),
            line.unit.value,
            line.since.isoformat(timespec="seconds") if line.since else "-",
            plain(line.price),
            f"{line.quantity:,}",
            plain(line.amount),
        ]
        for line in charges.lines
    ]


def due_cells(charges: Charges) -> list[list[str]]:
    cells = [
        [_short(t.tenant), plain(t.amount), str(t.due), f"{t.unpriced:,}"] for t in charges.tenants
    ]
    return [*cells, ["TOTAL", "", str(charges.due), f"{charges.unpriced:,}"]]


def _charges_table(charges: Charges | None) -> list[str]:
    """The amounts (with ``--prices``): a line per tenant, model, unit and price, then
    each tenant's amount, exact and as its invoice states it."""
    if charges is None:
        return []
    lines = _aligned([list(CHARGE_TITLES), *charge_cells(charges)], 4)
    dues = _aligned([list(DUE_TITLES), *due_cells(charges)], 1)
    return [charges_heading(charges) + ":", *lines, "", *dues, ""]


# With --prices, after every other column (a reader by position keeps its columns).
AMOUNT_COLUMNS = (
    "currency",
    *(f"amount_{u.value}" for u in Unit),
    "amount",
    "unpriced_requests",
    "tenant_amount_due",
)


def csv_columns(report: Report) -> list[str]:
    """Keys, figures, one ``verdict_<name>`` count per verdict, then the row's own first and
    last record and the report's range (the same on every row); with prices, the row's
    exact amounts and its tenant's amount due (the same on each of its rows)."""
    return [
        *report.group_by,
        *(c.name for c in COLUMNS),
        *(f"verdict_{v}" for v in report.verdicts),
        "first_record",
        "last_record",
        "since",
        "until",
        "generated_at",
        *(AMOUNT_COLUMNS if report.charges else ()),
    ]


def _amount_cells(report: Report, row: Row) -> list[object]:
    charges = report.charges
    if charges is None:
        return []
    amounts = charges.rows.get(tuple(row.keys[g] for g in report.group_by))
    units = amounts.units if amounts else {}
    tenant = charges.tenant(row.keys["tenant"]) if "tenant" in row.keys else None
    return [
        charges.currency,
        *(plain(units.get(u, Decimal(0))) for u in Unit),
        plain(amounts.total) if amounts else "0",
        amounts.unpriced if amounts else 0,
        str(tenant.due) if tenant else "",
    ]


def as_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180; also quotes a bare CR
    writer.writerow(csv_columns(report))
    for row in report.rows:
        values = row.as_dict()
        writer.writerow(
            [
                *(_text_cell(row.keys[g]) for g in report.group_by),
                *(values[c.name] for c in COLUMNS),
                *(row.verdicts.get(v, 0) for v in report.verdicts),
                values["first_record"],
                values["last_record"],
                report.start or "",
                report.end or "",
                report.generated_at,
                *_amount_cells(report, row),
            ]
        )
    return out.getvalue()


def as_json(report: Report) -> str:
    body = {
        "since": report.start,
        "until": report.end,
        "first_record": report.first_record,
        "last_record": report.last_record,
        "generated_at": report.generated_at,
        "timezone": report.zone,
        "source": report.source,
        "group_by": list(report.group_by),
        "columns": {c.name: c.meaning for c in COLUMNS},
        "rows": [r.as_dict() for r in report.rows],
        "subtotals": [r.as_dict() for r in report.subtotals],
        "totals": report.totals.as_dict(),
        "budgets": [b.as_dict() for b in report.budgets],
    }
    if report.charges is not None:
        body["charges"] = report.charges.as_dict()
    return json.dumps(body, indent=2) + "\n"


BAR = 380  # pixels of the longest bar


def _chart(report: Report) -> list[dict[str, object]]:
    """Per tenant: prompt and completion tokens, reported against billed, as bar lengths."""
    per_tenant: dict[str, Row] = {}
    for r in report.rows:
        tenant = r.keys.get("tenant", "all")
        per_tenant.setdefault(tenant, Row({"tenant": tenant})).merge(r)
    names = (
        "prompt_tokens_reported",
        "prompt_tokens_billed",
        "completion_tokens_reported",
        "completion_tokens_billed",
    )
    top = max((int(getattr(r, n)) for r in per_tenant.values() for n in names), default=0) or 1
    return [
        {
            "tenant": tenant,
            "label": _short(tenant)[:24],
            "bars": [(n, int(getattr(row, n)), BAR * int(getattr(row, n)) // top) for n in names],
        }
        for tenant, row in sorted(per_tenant.items())
    ]


# The HTML page's first usage table: the tokens, reported against billed. Every other
# column (proof, other units, any added later) goes in the second, with the verdicts, so
# neither is wider than a 1,400 px window.
TOKEN_FIGURES = frozenset(
    {
        "requests",
        "prompt_tokens_reported",
        "prompt_tokens_billed",
        "completion_tokens_reported",
        "completion_tokens_billed",
        "over_reported_tokens",
        "over_reported_pct",
    }
)


def _html_parts() -> list[tuple[str, list[int], bool]]:
    """The usage tables of the HTML page: heading, column indexes, whether it is the last."""
    tokens = [i for i, c in enumerate(COLUMNS) if c.name in TOKEN_FIGURES]
    rest = [i for i, c in enumerate(COLUMNS) if c.name not in TOKEN_FIGURES]
    return [
        ("Usage: tokens reported and billed", tokens, False),
        ("Usage: tokens billed without proof, other units and verdicts", rest, True),
    ]


def as_html(report: Report, title: str = "vllm-usage-proxy: usage report") -> str:
    lines = [
        (kind, _key_cells(report, kind, row), [_number(row, c.name) for c in COLUMNS], row)
        for kind, row in _lines(report)
    ]
    return _TEMPLATES.get_template("report.html.j2").render(
        title=title,
        report=report,
        keys=_titles(report),
        columns=COLUMNS,
        parts=_html_parts(),
        lines=lines,
        short=_short,
        verdicts=_verdicts,
        chart=_chart(report),
        budget_titles=BUDGET_TITLES,
        budget_text=BUDGET_TEXT,
        budget_cells=_budget_cells,
        charges=report.charges,
        charges_heading=charges_heading,
        charge_titles=CHARGE_TITLES,
        charge_cells=charge_cells,
        due_titles=DUE_TITLES,
        due_cells=due_cells,
        unproven=", ".join(sorted(UNPROVEN)),
    )


FORMATS = {"table": as_table, "csv": as_csv, "json": as_json, "html": as_html}

"""Regenerate the docs that come from code: the README's configuration reference (from
the settings model) and docs/metering.md's route table (from the route table and the
release data). The ledger's DDL needs none: proxy/ledger/sinks/ledger.sql is the one copy."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.settings import reference_table
from scripts import fields_doc, routes_doc

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- config:start -->\n", "<!-- config:end -->"

text = README.read_text()
head, rest = text.split(START)
_, tail = rest.split(END)
README.write_text(head + START + reference_table() + END + tail)

METERING = ROOT / "docs" / "metering.md"
text = METERING.read_text()
head, rest = text.split(routes_doc.START)
_, tail = rest.split(routes_doc.END)
METERING.write_text(head + routes_doc.START + routes_doc.routes_reference() + routes_doc.END + tail)

# The report's columns (docs/metering.md, Reports), from proxy/ledger/report.py.
from proxy.ledger.report import columns_reference  # noqa: E402

COLUMNS_START, COLUMNS_END = "<!-- report-columns:start -->\n", "<!-- report-columns:end -->"
text = METERING.read_text()
head, rest = text.split(COLUMNS_START)
_, tail = rest.split(COLUMNS_END)
METERING.write_text(head + COLUMNS_START + columns_reference() + COLUMNS_END + tail)

# The field table (docs/metering.md, request fields), from proxy/accounting/fields.py.
text = METERING.read_text()
head, rest = text.split(fields_doc.START)
_, tail = rest.split(fields_doc.END)
METERING.write_text(head + fields_doc.START + fields_doc.fields_reference() + fields_doc.END + tail)

"""Regenerate the docs that come from code: the README's configuration reference (from
the settings model), docs/metering.md's route table (from the route table and the release
data) and docs/ledger.sql (the DDL and migration the proxy runs)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.ledger.sinks.postgres import LEDGER_DDL, MIGRATE_V1
from proxy.settings import reference_table
from scripts import routes_doc

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

(ROOT / "docs" / "ledger.sql").write_text(
    "-- usage ledger, schema version 2 (created by the proxy on first delivery)\n"
    + LEDGER_DDL.strip()
    + "\n\n"
    "-- Migrating a schema-version-1 table (the proxy does this by itself, in one transaction,\n"
    "-- when it finds the v1 column request_id; run it yourself if the proxy's role may not\n"
    "-- ALTER the table). v1 record ids were uuid5(client X-Request-Id) and stay as they are;\n"
    "-- v2 ids are UUIDv7 minted by the proxy. The type changes rewrite the table once.\n"
    "BEGIN;\n" + MIGRATE_V1.strip() + "\nCOMMIT;\n"
)

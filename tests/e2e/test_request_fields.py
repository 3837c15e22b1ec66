"""The field table's data held against the provisioned vLLM releases' live request models:
scripts/vllm_fields.py --live, run with each release's own python, imports the body classes
of every metered route and lists their pydantic model_fields (aliases, and the defaults of
the fields the price reads); they must equal what tests/data/vllm_request_fields.json read
from the release's wheel by AST (no server started), on which tests/unit/limits/test_reading.py
holds the price's caps for every release."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from proxy.accounting.fieldkinds import Reads
from proxy.accounting.fields import FIELDS
from proxy.accounting.routes import BY_PATH
from scripts.vllm_cpu import OFFLINE, ROOT, provision
from tests.e2e.cases import VERSIONS

pytestmark = pytest.mark.e2e
REQUIRED = {"required": True}
TABLE = json.loads((ROOT / "tests" / "data" / "vllm_request_fields.json").read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_live_request_models_equal_the_table(version: str, tmp_path: Path) -> None:
    """Routes, body classes, fields, aliases and the priced fields' defaults of the installed
    release are the table's entry for it: the AST reading of the wheel missed or invented
    nothing, and read each default as pydantic does."""
    python = provision(version)
    out = tmp_path / "live.json"
    subprocess.run(
        [str(python), str(ROOT / "scripts" / "vllm_fields.py"), "--live", "--out", str(out)],
        check=True,
        cwd=ROOT,
        env={**os.environ, **OFFLINE},
        timeout=240,
    )
    live = json.loads(out.read_text())["releases"]
    assert list(live) == [version]
    assert live[version] == TABLE["releases"][version]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_caps_the_price_reads_default_as_the_engines(version: str, tmp_path: Path) -> None:
    """Each cap and multiplier the price before forwarding reads (``Field.reads``) has, in
    the installed release's request model of every route of its operation, the default the
    field table states: a count (completions' 16), or none (absent: what the context leaves;
    a required field: vLLM refuses the request without it); a multiplier, one output. And
    every default the checked-in table holds for the release (read by AST from its wheel)
    is pydantic's."""
    python = provision(version)
    out = tmp_path / "defaults.json"
    script = str(ROOT / "scripts" / "vllm_fields.py")
    subprocess.run(
        [str(python), script, "--live", "--defaults", "--out", str(out)],
        check=True,
        cwd=ROOT,
        env={**os.environ, **OFFLINE},
        timeout=240,
    )
    live = json.loads(out.read_text())
    checked = 0
    for path, classes in live["routes"].items():
        route = BY_PATH.get(path)
        fields = FIELDS.get(route.operation, {}) if route is not None else {}
        models = [live["defaults"][c] for c in classes]
        for field in fields.values():
            for default in (m[field.name] for m in models if field.name in m):
                if field.reads in (Reads.CAP, Reads.CAP_FALLBACK):
                    stated = (field.default,) if field.default is not None else (None, REQUIRED)
                    assert default in stated, (path, field.name, default)
                    checked += 1
                elif field.reads is Reads.CHOICES:
                    assert default in (None, 1), (path, field.name, default)
    assert checked >= 5  # chat and its batch (two each), completions, Responses, Messages
    table = TABLE["releases"][version]["defaults"]
    read = {model: {f: live["defaults"][model][f] for f in table[model]} for model in table}
    assert read == table

"""The field table's data held against the provisioned vLLM releases' live request models:
scripts/vllm_fields.py --live, run with each release's own python, imports the body classes
of every metered route and lists their pydantic model_fields (and aliases); they must equal
what tests/data/vllm_request_fields.json read from the release's wheel (no server started)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from scripts.vllm_cpu import OFFLINE, ROOT, provision
from tests.e2e.cases import VERSIONS

pytestmark = pytest.mark.e2e
TABLE = json.loads((ROOT / "tests" / "data" / "vllm_request_fields.json").read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_live_request_models_equal_the_table(version: str, tmp_path: Path) -> None:
    """Routes, body classes, fields and aliases of the installed release are the table's
    entry for it: the AST reading of the wheel missed or invented nothing."""
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

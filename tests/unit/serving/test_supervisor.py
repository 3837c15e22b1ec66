"""The supervisor of ``serve --workers N`` (its behaviour as processes: tests/process):
light to import, it loads none of the application it does not run (review finding 10)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The serving application's heavy parts: the tokenizers, the audio decoder and numpy
# (admission's speech pricing), the Redis client and the OpenTelemetry it pulls in.
HEAVY = [
    "tokenizers",
    "numpy",
    "soundfile",
    "redis",
    "opentelemetry",
    "proxy.serving.app",
    "proxy.serving.admission",
    "proxy.serving.catalog",
]


@pytest.fixture(scope="module")
def loaded() -> set[str]:
    """The modules a fresh interpreter holds once it has imported the supervisor."""
    code = "import json, sys, proxy.serving.supervisor; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("module", HEAVY)
def test_the_supervisor_imports_none_of_the_application(loaded: set[str], module: str) -> None:
    """Importing the supervisor (what a pod's supervisor process runs) imports ``module``
    neither itself nor through another: its memory is its own, not a worker's."""
    assert module not in loaded

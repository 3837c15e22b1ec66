"""The supervisor of ``serve --workers N`` is light to import: it loads none of the
application it does not run (review finding 10), and prometheus_client only once the
pod's metrics directory is known."""

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
    """The modules a fresh interpreter holds once it has imported the supervisor and the
    pod's life it runs."""
    code = (
        "import json, sys, proxy.serving.supervisor, proxy.serving.podlife; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("module", HEAVY)
def test_the_supervisor_imports_none_of_the_application(loaded: set[str], module: str) -> None:
    """Importing the supervisor (what a pod's supervisor process runs) imports ``module``
    neither itself nor through another: its memory is its own, not a worker's."""
    assert module not in loaded


def test_the_supervisor_imports_prometheus_client_only_once_it_has_its_directory() -> None:
    """prometheus_client picks its multiprocess mode when it is imported: the supervisor
    imports it only after its runtime directory exists and ``PROMETHEUS_MULTIPROC_DIR``
    names it, so its own counters land in the pod's directory without patching the
    library (its entry imports no metrics)."""
    code = "import sys, proxy.serving.supervisor; print('prometheus_client' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"

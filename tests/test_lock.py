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

"""Mistakes in a ``--limits`` file, each said as one plain sentence: what the file says,
where, and (for a misspelt name) what it probably meant. The same sentences at start-up,
on reload and from ``usage-proxy limits check``; pydantic's own dumps
(``extra_forbidden ... errors.pydantic.dev``) never reach an operator."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import available_timezones

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from proxy.limits.policy import (
    KEY_HASH_DIGITS,
    Limits,
    Policies,
    TenantLimits,
    Unit,
    Window,
    load_policies,
)

TOP = ("timezone", "default", "tenants")
LIMIT_FIELDS = tuple(Limits.model_fields)
TENANT_FIELDS = tuple(TenantLimits.model_fields)
UNIT_NAMES = tuple(unit.value for unit in Unit)
WINDOW_NAMES = tuple(window.value for window in Window)
UNITS = ", ".join(UNIT_NAMES)
WINDOWS = ", ".join(WINDOW_NAMES)


class LimitsFileError(ValueError):
    """A limits file that cannot be used; ``problems`` holds one sentence each."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.problems = problems
        self.path = path
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        super().__init__(count + "; ".join(problems))


def read_limits(path: Path) -> Policies:
    """Load and validate a limits file; every problem is a plain sentence of the
    ``LimitsFileError`` (OSError and UnicodeDecodeError pass as they are)."""
    try:
        return load_policies(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "unreadable"
        raise LimitsFileError(path, [f"not valid YAML or JSON{line} ({problem})"]) from None
    except ValidationError as exc:
        raise LimitsFileError(path, explain(exc)) from None


def explain(exc: ValidationError) -> list[str]:
    """One sentence per error pydantic found."""
    return [_sentence(error) for error in exc.errors()]


def _sentence(error: ErrorDetails) -> str:
    loc = [str(part) for part in error["loc"]]
    where, name = ".".join(loc[:-1]), loc[-1] if loc else ""
    kind = error["type"]
    if kind == "extra_forbidden":
        return _unknown_name(where, name)
    place = ".".join(loc) or "the file"
    value = error.get("input")
    if kind in ("greater_than", "int_parsing", "int_from_float", "int_type"):
        return f"{place} is {value!r}: a limit is a whole number above 0"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        what = "the file" if not loc else place
        return f"{what} must be a mapping of names to values, not {_kind(value)}"
    if kind == "enum":
        return f"{place} is {value!r}: it takes closed, open or local"
    if name == "timezone":
        near = difflib.get_close_matches(str(value), sorted(available_timezones()), n=1)
        return f"timezone {value!r} is not a time zone (e.g. Europe/Paris){_meant(near)}"
    return f"{place}: {error['msg']}"


def _kind(value: Any) -> str:
    return {list: "a list", str: "a text", int: "a number"}.get(type(value), "that value")


def _unknown_name(where: str, name: str) -> str:
    """A name the file's shape does not have, and the one it probably meant."""
    if not where:
        near = difflib.get_close_matches(name, TOP, n=1, cutoff=0.6)
        return f"{name!r} is not a key of a limits file ({', '.join(TOP)}){_meant(near)}"
    known: tuple[str, ...] = LIMIT_FIELDS
    what = where
    if where.startswith("tenants.") and where.count(".") == 1:
        known, what = TENANT_FIELDS, f"tenant {where.split('.', 1)[1]!r}"
    sentence = f"{name!r} is not a limit or setting of {what}"
    unit, per, window = name.rpartition("_per_")
    if per:  # <unit>_per_<window>: mend each half, or say what they take
        unit = unit if unit in UNIT_NAMES else _close(unit, UNIT_NAMES)
        window = window if window in WINDOW_NAMES else _close(window, WINDOW_NAMES)
        if unit and window:
            return sentence + _meant([f"{unit}_per_{window}"])
        return f"{sentence}: a limit is <unit>_per_<window>, unit {UNITS}, window {WINDOWS}"
    return sentence + _meant(difflib.get_close_matches(name, known, n=1, cutoff=0.6))


def _close(word: str, names: tuple[str, ...]) -> str:
    """The one of ``names`` ``word`` is probably a misspelling of, or ""."""
    near = difflib.get_close_matches(word, names, n=1, cutoff=0.75)
    return near[0] if near else ""


def _meant(near: list[str]) -> str:
    return f"; did you mean {near[0]!r}?" if near else ""


@dataclass(frozen=True, slots=True)
class Summary:
    """What a file sets: the levels that carry a limit, and the limits."""

    tenants: int
    default: bool
    levels: int
    limits: int
    budgets: int

    def __str__(self) -> str:
        default = ", a default for every other tenant" if self.default else ""
        return (
            f"{self.limits} limit(s) at {self.levels} level(s) ({self.budgets} calendar "
            f"budget(s)): {self.tenants} tenant(s){default}"
        )


def summary(policies: Policies) -> Summary:
    levels = [policies.default] if policies.default is not None else []
    for own in policies.tenants.values():
        levels.extend([own, *own.models.values(), *own.keys.values()])
    limits = [limit for level in levels for limit in level.limits()]
    carrying = sum(1 for level in levels if level.limits())
    budgets = sum(1 for limit in limits if limit.budget)
    return Summary(
        len(policies.tenants), policies.default is not None, carrying, len(limits), budgets
    )


def mistakes(
    policies: Policies,
    *,
    models: Collection[str] | None = None,
    tenants: Collection[str] | None = None,
    digests: Mapping[str, str] | None = None,
) -> list[str]:
    """What validates but is probably wrong: a file that limits nothing, a model the
    upstream does not serve (``models``: the served names), a tenant the key file does not
    name (``tenants``: its tenants), a key it does not list for that tenant (``digests``:
    digest -> tenant, as ``--api-keys`` is loaded)."""
    found = []
    if not summary(policies).limits:
        found.append("the file sets no limit: every tenant is unlimited")
    for tenant, own in policies.tenants.items():
        if models is not None:
            found.extend(_model_mistakes(tenant, own, models))
        if tenants is not None and tenant not in tenants:
            near = difflib.get_close_matches(tenant, list(tenants), n=1)
            found.append(
                f"tenants.{tenant}: no tenant {tenant!r} in the --api-keys file, so no "
                f"request is ever billed to it{_meant(near)}"
            )
        elif digests is not None:
            mine = {d[:KEY_HASH_DIGITS] for d, t in digests.items() if t == tenant}
            found.extend(
                f"tenants.{tenant}.keys.{key}: no key of {tenant!r} in the --api-keys file "
                "has this digest"
                for key in own.keys
                if key not in mine
            )
    return found


def _model_mistakes(tenant: str, own: TenantLimits, models: Collection[str]) -> list[str]:
    served = ", ".join(sorted(models)) or "none"
    return [
        f"tenants.{tenant}.models.{model}: the upstream serves no model {model!r} (it "
        f"serves {served}){_meant(difflib.get_close_matches(model, list(models), n=1))}"
        for model in own.models
        if model not in models
    ]

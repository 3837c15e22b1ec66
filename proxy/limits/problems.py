"""Mistakes in a ``--limits`` file, each said as one plain sentence: what the file says,
where, and (for a misspelt name) what it probably meant. The same sentences at start-up,
on reload and from ``usage-proxy limits check``; pydantic's own dumps
(``extra_forbidden ... errors.pydantic.dev``) never reach an operator."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from proxy.accounting.money import read_yaml_noting
from proxy.accounting.zones import unknown_zone
from proxy.limits.policy import (
    KEY_HASH_DIGITS,
    Limits,
    Policies,
    TenantLimits,
    Unit,
    Window,
)

TOP = ("timezone", "default", "tenants")
LIMIT_FIELDS = tuple(Limits.model_fields)
TENANT_FIELDS = tuple(TenantLimits.model_fields)
UNIT_NAMES = tuple(unit.value for unit in Unit)
WINDOW_NAMES = tuple(window.value for window in Window)
UNITS = ", ".join(UNIT_NAMES)
WINDOWS = ", ".join(WINDOW_NAMES)


# What a limits file names, read even from a file that does not validate (so a check can
# say a tenant or model is unknown in the same pass as a misspelt limit): tenant -> (its
# models, its keys' hashes).
Names = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


class LimitsFileError(ValueError):
    """A limits file that cannot be used; ``problems`` holds one sentence each, ``names``
    what it names (empty when it could not be read as a mapping)."""

    def __init__(self, path: Path, problems: list[str], names: Names | None = None) -> None:
        self.problems = problems
        self.path = path
        self.names: Names = names or {}
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        super().__init__(count + "; ".join(problems))


def read_limits(path: Path) -> Policies:
    """Load and validate a limits file; every problem is a plain sentence of the
    ``LimitsFileError`` (OSError and UnicodeDecodeError pass as they are)."""
    try:
        data, twice = read_yaml_noting(path.read_text(encoding="utf-8"))  # 250.00: Decimal
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "unreadable"
        raise LimitsFileError(path, [f"not valid YAML or JSON{line} ({problem})"]) from None
    # A name given twice is said with the file's other problems (one pass), not alone.
    found = [problem.said() for problem in twice]
    try:
        policies = Policies.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise LimitsFileError(path, [*found, *explain(exc)], names_in(data)) from None
    if found:
        raise LimitsFileError(path, [*found, *mistakes(policies)], names_in(data))
    return policies


def names_in(data: Any) -> Names:
    """The tenants, models and keys a file's mapping names, however wrong its limits."""
    tenants = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(tenants, dict):
        return {}
    found: Names = {}
    for tenant, own in tenants.items():
        own = own if isinstance(own, dict) else {}
        models, keys = own.get("models"), own.get("keys")
        found[str(tenant)] = (
            tuple(str(m) for m in models) if isinstance(models, dict) else (),
            tuple(str(k).lower()[:KEY_HASH_DIGITS] for k in keys) if isinstance(keys, dict) else (),
        )
    return found


def names_of(policies: Policies) -> Names:
    """The tenants, models and keys valid policies name."""
    return {t: (tuple(own.models), tuple(own.keys)) for t, own in policies.tenants.items()}


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
        return f"{place} is {said(value)}: a limit is a whole number above 0"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        what = "the file" if not loc else place
        return f"{what} must be a mapping of names to values, not {_kind(value)}"
    if kind == "enum":
        return f"{place} is {said(value)}: it takes closed, open or local"
    if name == "timezone":
        return f"timezone {unknown_zone(value)}"
    return f"{place}: {plain_message(error)}"


def said(value: Any) -> str:
    """A value as the file wrote it: ``1.5``, not pydantic's ``Decimal('1.5')``."""
    if isinstance(value, Decimal):
        return str(value)
    return repr(value)


def plain_message(error: ErrorDetails) -> str:
    """pydantic's message without its own wording (``Value error, ``)."""
    return error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")


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
    """What validates but is probably wrong: a file that limits nothing, and what
    ``name_mistakes`` finds in the names it uses."""
    found = []
    if not summary(policies).limits:
        found.append("the file sets no limit: every tenant is unlimited")
    found.extend(name_mistakes(names_of(policies), models=models, tenants=tenants, digests=digests))
    return found


def name_mistakes(
    names: Names,
    *,
    models: Collection[str] | None = None,
    tenants: Collection[str] | None = None,
    digests: Mapping[str, str] | None = None,
) -> list[str]:
    """A model the upstream does not serve (``models``: the served names), a tenant the
    key file does not name (``tenants``: its tenants), a key it does not list for that
    tenant (``digests``: digest -> tenant, as ``--api-keys`` is loaded)."""
    found = []
    for tenant, (own_models, own_keys) in names.items():
        if models is not None:
            found.extend(_model_mistakes(tenant, own_models, models))
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
                for key in own_keys
                if key not in mine
            )
    return found


def _model_mistakes(tenant: str, own: Collection[str], models: Collection[str]) -> list[str]:
    served = ", ".join(sorted(models)) or "none"
    return [
        f"tenants.{tenant}.models.{model}: the upstream serves no model {model!r} (it "
        f"serves {served}){_meant(difflib.get_close_matches(model, list(models), n=1))}"
        for model in own
        if model not in models
    ]
